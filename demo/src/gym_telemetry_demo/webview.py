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
from gym_telemetry_demo.procs import log_tail, spawn, stop_process


class WebViewChild:
    """Start (``start``: blocks until ``/static/ui.css`` answers; stops the child again when
    it does not, or when interrupted meanwhile) and stop the web view (its process group,
    SIGTERM then SIGKILL after the grace period; it dies with its parent on Linux).

    The one launcher for the demo, the tests and the benches; also a context manager
    (``with WebViewChild(...).start(timeout_s=60) as view``, or unstarted: ``__enter__`` starts it).
    """

    def __init__(
        self,
        store_dir: Path,
        workdir: Path,
        jaeger_url: str | None = None,
        jaeger_ui: Path | None = None,
        admin_url: str | None = None,
    ) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.store_dir = store_dir
        self.log_path = workdir / "webview.log"
        self.jaeger_url = jaeger_url
        self.jaeger_ui = jaeger_ui
        """A built Jaeger UI to serve at ``/jaeger/`` (``--jaeger-ui``)."""
        self.admin_url = admin_url
        """The sidecar's admin listener, for the /live page (None: the ui's default)."""
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
        if self.jaeger_ui is not None:
            cmd += ["--jaeger-ui", str(self.jaeger_ui)]
        if self.admin_url:
            cmd += ["--admin-url", self.admin_url]
        return cmd

    def start(self, timeout_s: float = 30.0) -> WebViewChild:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
        with self.log_path.open("wb") as log:
            # its own session (see SidecarProcess.new_session): Ctrl-C goes to the demo alone
            self.proc = spawn(self.command(), stdout=log, env=env)
        try:
            self._wait_up(self.proc, timeout_s)
        except BaseException:
            self.stop()  # it did not come up, or we were told to stop meanwhile
            raise
        return self

    def _wait_up(self, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the web view exited; log:\n{log_tail(self.log_path)}")
            try:
                with urllib.request.urlopen(self.url + "/static/ui.css", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the web view did not answer; log:\n{log_tail(self.log_path)}")

    def trace_url(self, trace_id: str) -> str:
        return f"{self.url}/trace/{trace_id}"

    def stop(self, grace_s: float = 10.0) -> int | None:
        return stop_process(self.proc, grace_s=grace_s)

    def __enter__(self) -> WebViewChild:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
