"""A ``gym-sidecar ui`` child process over the demo's store, on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gym_telemetry_demo.ports import free_port
from gym_telemetry_demo.procs import log_tail, stop_process


class WebViewChild:
    """Start (``start``: blocks until ``/rollouts`` answers) and stop the web view.

    The one launcher for the demo, the tests and the benches; also a context manager
    (``with WebViewChild(...).start(timeout_s=60) as view``, or unstarted: ``__enter__`` starts it).
    """

    def __init__(
        self,
        store_dir: Path,
        workdir: Path,
        jaeger_url: str | None = None,
        admin_url: str | None = None,
    ) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.store_dir = store_dir
        self.log_path = workdir / "webview.log"
        self.jaeger_url = jaeger_url
        #: The sidecar's admin listener, for the /live page (None: the ui's default).
        self.admin_url = admin_url
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "gym_sidecar.cli",
            "ui",
            "--listen",
            self.url.removeprefix("http://"),
            "--store-dir",
            str(self.store_dir),
        ]
        if self.jaeger_url:
            cmd += ["--jaeger-url", self.jaeger_url]
        if self.admin_url:
            cmd += ["--admin-url", self.admin_url]
        return cmd

    def start(self, timeout_s: float = 30.0) -> WebViewChild:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
        with self.log_path.open("wb") as log:
            # its own session (see SidecarProcess.new_session): Ctrl-C goes to the demo alone
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the web view exited; log:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.url + "/static/ui.css", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the web view did not answer; log:\n{log_tail(self.log_path)}")

    def trace_url(self, trace_id: str) -> str:
        return f"{self.url}/trace/{trace_id}"

    def stop(self, grace_s: float = 10.0) -> int | None:
        return stop_process(self.proc, grace_s=grace_s)

    def __enter__(self) -> WebViewChild:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
