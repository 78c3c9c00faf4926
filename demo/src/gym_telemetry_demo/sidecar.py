"""A real ``gym-sidecar run`` child process on free loopback ports: the one launcher of
the demo (``make demo``), the tests and the benchmarks.

    with SidecarProcess(backend=sink.endpoint, extra_args=["--log-level", "debug"]) as sc:
        post(sc.http_url + "/v1/traces", ...)        # or OTLP gRPC to sc.grpc_endpoint
    assert sc.returncode == 0                        # set by stop() (SIGTERM)

The process listens on free loopback ports, is considered started once ``/readyz``
answers 200, and writes its log to ``log_path`` (``sc.log_text()`` reads it; the log is
printed when startup fails). ``config`` (a dict) is written to a YAML file and passed
with ``--config``; ``env`` is added to the inherited environment, from which every
``GYM_SIDECAR_*`` variable is removed first so a developer's shell cannot leak in.

Startup waits ``startup_timeout_s`` (default ``DEFAULT_STARTUP_TIMEOUT_S``, generous: a
sidecar on a machine whose cores are all busy takes tens of seconds just to import).
On Linux the child gets SIGTERM when the process that started it dies without stopping
it (:func:`gym_telemetry_demo.procs.spawn`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gym_telemetry_demo.ports import free_port
from gym_telemetry_demo.procs import spawn, stop_process

#: How long ``start`` waits for ``/readyz`` by default (s).
DEFAULT_STARTUP_TIMEOUT_S = 180.0


class SidecarProcess:
    """A ``gym-sidecar run`` subprocess on free ports (context manager)."""

    def __init__(
        self,
        backend: str | None = None,
        *,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        log_dir: str | Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        new_session: bool = False,
    ) -> None:
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.admin_port = free_port()
        self.grpc_endpoint = f"127.0.0.1:{self.grpc_port}"
        self.http_url = f"http://127.0.0.1:{self.http_port}"
        self.admin_url = f"http://127.0.0.1:{self.admin_port}"
        self._dir = Path(log_dir or tempfile.mkdtemp(prefix="gym-sidecar-"))
        self.log_path = self._dir / f"sidecar-{self.grpc_port}.log"
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self._dir / f"sidecar-{self.grpc_port}.yaml"
            self.config_path.write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
        self.backend = backend
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        #: Start the child in its own session (the demo: a terminal's Ctrl-C reaches the
        #: demo alone, which then stops every child once and in order).
        self.new_session = new_session
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "gym_sidecar.cli",
            "run",
            "--grpc-listen",
            self.grpc_endpoint,
            "--http-listen",
            f"127.0.0.1:{self.http_port}",
            "--admin-listen",
            f"127.0.0.1:{self.admin_port}",
        ]
        if self.backend is not None:
            url = self.backend if "://" in self.backend else f"http://{self.backend}"
            cmd += ["--backend", url]
        if self.config_path is not None:
            cmd += ["--config", str(self.config_path)]
        return cmd + self.extra_args

    def start(self) -> SidecarProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Without a backend the sidecar writes into its local store, by default under
        # $XDG_DATA_HOME: keep each test's store in its own directory.
        env.setdefault("XDG_DATA_HOME", str(self._dir / "xdg-data"))
        with self.log_path.open("wb") as log:
            self.proc = spawn(self.command(), stdout=log, env=env, new_session=self.new_session)
        try:
            self.wait_ready(self.startup_timeout_s)
        except KeyboardInterrupt:
            self.stop()  # told to stop while it started (Ctrl-C, a stop signal)
            raise
        except BaseException:
            self.kill()
            sys.stderr.write(f"--- sidecar log ({self.log_path}) ---\n{self.log_text()}\n")
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``/readyz`` until 200; raise if the process exits or time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited early with code {self.proc.returncode}")
            if self.admin_get("/readyz")[0] == 200:
                return
            time.sleep(0.05)
        raise TimeoutError(f"sidecar not ready after {timeout_s}s")

    def admin_get(self, path: str) -> tuple[int, str]:
        """GET on the admin listener: (status, body); (0, error) when not reachable."""
        try:
            with urllib.request.urlopen(self.admin_url + path, timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            return 0, str(exc)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` on ``/metrics`` whose labels include ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.admin_get("/metrics")
        assert status == 200, text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def trace_scanner(self) -> str | None:
        """The trace scanner the running sidecar reports (``native`` or ``python``, from
        ``gym_sidecar_trace_scanner_info``), or None when it reports neither."""
        for scanner in ("native", "python"):
            if self.metric("gym_sidecar_trace_scanner_info", scanner=scanner) == 1.0:
                return scanner
        return None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (the sidecar drains and flushes) and wait; return (and remember) the
        exit code, None if it was never started. Kills it after ``timeout_s``."""
        if self.proc is None:
            return None
        self.returncode = stop_process(self.proc, grace_s=timeout_s)
        return self.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            self.returncode = self.proc.returncode

    def __enter__(self) -> SidecarProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
