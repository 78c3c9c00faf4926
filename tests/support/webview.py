"""A real ``gym-sidecar ui`` process on a free loopback port, for the browser tests."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from gym_telemetry_demo.procs import log_tail, stop_process

from tests.support.ports import free_port


class WebViewProcess:
    """``gym-sidecar ui --store-dir DIR`` (context manager); ``url`` once started."""

    def __init__(self, store_dir: Path, log_dir: Path, extra_args: Sequence[str] = ()) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.store_dir = store_dir
        self.log_path = log_dir / "webview.log"
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> WebViewProcess:
        cmd = [
            sys.executable,
            "-m",
            "gym_sidecar.cli",
            "ui",
            "--listen",
            self.url.removeprefix("http://"),
            "--store-dir",
            str(self.store_dir),
            *self.extra_args,
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gym-sidecar ui exited:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.url + "/static/ui.css", timeout=5):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gym-sidecar ui did not answer:\n{log_tail(self.log_path)}")

    def stop(self) -> int | None:
        return stop_process(self.proc, grace_s=15)

    def __enter__(self) -> WebViewProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
