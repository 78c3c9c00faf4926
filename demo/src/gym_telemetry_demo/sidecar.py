"""A ``gym-sidecar run`` child process on free loopback ports, for the demo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gym_telemetry_demo.ports import free_port


class SidecarChild:
    """Start (``start``: blocks until ``/readyz`` answers 200) and stop (``stop``: SIGTERM,
    then the exit code) a sidecar writing into the local store at ``store_dir``."""

    def __init__(self, store_dir: Path, workdir: Path, config: dict[str, Any]) -> None:
        self.grpc_endpoint = f"127.0.0.1:{free_port()}"
        self.http_url = f"http://127.0.0.1:{free_port()}"
        self.admin_url = f"http://127.0.0.1:{free_port()}"
        self.store_dir = store_dir
        self.workdir = workdir
        self.config = config
        self.log_path = workdir / "sidecar.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, config_path: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gym_sidecar.cli",
            "run",
            "--config",
            str(config_path),
            "--grpc-listen",
            self.grpc_endpoint,
            "--http-listen",
            self.http_url.removeprefix("http://"),
            "--admin-listen",
            self.admin_url.removeprefix("http://"),
            "--local-store",
            "--store-dir",
            str(self.store_dir),
        ]

    def start(self, timeout_s: float = 30.0) -> SidecarChild:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "sidecar.yaml"
        config_path.write_text(yaml.safe_dump(self.config), encoding="utf-8")
        # The sidecar reads GYM_SIDECAR_* from the environment; a developer's shell
        # settings must not change what the demo shows.
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
        with self.log_path.open("wb") as log:
            # its own session, like the Gym servers: a terminal's Ctrl-C reaches the demo
            # alone, which then stops every child once and in order
            self.proc = subprocess.Popen(
                self.command(config_path),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the sidecar exited; log:\n{self.log_tail()}")
            if self._ready():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the sidecar did not become ready; log:\n{self.log_tail()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.admin_url + "/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (the sidecar drains into the store and flushes its metrics); the exit
        code, or None if it was not running. Kills it after ``timeout_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode
