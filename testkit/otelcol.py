"""The gateway Collector (``scripts/otelcol_build.py``) as processes, for tests.

:func:`gateway_binary` builds the distribution the first time on a machine (minutes; the
steps and the time taken go to the terminal) and reuses it after. :class:`Collector` runs
one instance with one of the ``deploy/gateway`` configs on free loopback ports, the way
the compose override and the Kubernetes manifests run it (same file, settings through
the ``GATEWAY_*`` environment variables). ``start`` blocks until its health_check
extension answers 200; ``kill`` is SIGKILL (a crash), ``stop`` SIGTERM (drains).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.procs import log_tail, spawn, stop_process

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "scripts" / "otelcol_build.py"
GATEWAY_DIR = REPO / "deploy" / "gateway"
TIER1 = GATEWAY_DIR / "tier1.yaml"
TIER1_DNS = GATEWAY_DIR / "tier1-dns.yaml"
TIER2 = GATEWAY_DIR / "tier2.yaml"
BUILD_TIMEOUT_S = 3600


def gateway_binary(report: Callable[[str], object] | None = None) -> Path:
    """Build (first call on a machine: minutes) or reuse the gateway binary; its path.

    Raises RuntimeError with the build's output when it fails."""
    proc = subprocess.Popen(
        [sys.executable, str(BUILD_SCRIPT), "ensure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if report is not None:
            report(line.rstrip())
    out = proc.stdout.read() if proc.stdout is not None else ""
    if proc.wait(timeout=BUILD_TIMEOUT_S) != 0:
        raise RuntimeError(
            f"scripts/otelcol_build.py ensure failed ({proc.returncode}):\n"
            + "".join(lines)[-4000:]
        )
    return Path(out.strip().splitlines()[-1])


class Collector:
    """One gateway Collector process (context manager)."""

    def __init__(
        self,
        binary: Path,
        config: Path,
        workdir: Path,
        name: str,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.binary = binary
        self.config = config
        self.workdir = workdir
        self.name = name
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.health_port = free_port()
        self.telemetry_port = free_port()
        self.extra_env = dict(env or {})
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_endpoint(self) -> str:
        """host:port of its OTLP gRPC receiver."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Its own telemetry (Prometheus text)."""
        return f"http://127.0.0.1:{self.telemetry_port}/metrics"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.update(
            GATEWAY_OTLP_GRPC_LISTEN=self.grpc_endpoint,
            GATEWAY_OTLP_HTTP_LISTEN=f"127.0.0.1:{self.http_port}",
            GATEWAY_HEALTH_LISTEN=f"127.0.0.1:{self.health_port}",
            GATEWAY_TELEMETRY_HOST="127.0.0.1",
            GATEWAY_TELEMETRY_PORT=str(self.telemetry_port),
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 120.0) -> Collector:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            # in our process group (Ctrl-C reaches it); dies with us on Linux
            self.proc = spawn(
                [str(self.binary), "--config", str(self.config)],
                stdout=log,
                env=self.env(),
                cwd=self.workdir,
                new_session=False,
            )
        try:
            wait_listening(self.grpc_port, timeout_s=timeout_s)
            deadline = time.monotonic() + timeout_s
            while not self.healthy():
                if self.proc.poll() is not None:
                    raise OSError(f"exited with {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError("health_check never answered 200")
                time.sleep(0.2)
        except (TimeoutError, OSError) as exc:
            self.stop()
            raise RuntimeError(f"{self.name} did not start ({exc}):\n{self.log_tail()}") from None
        except BaseException:
            self.stop()  # interrupted while it started (Ctrl-C, a stop signal)
            raise
        return self

    def healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/"
            with urllib.request.urlopen(url, timeout=5) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` (or ``name_total``, a counter's exposition
        name) in its own telemetry whose labels include ``labels`` (0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (name, name + "_total") and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def kill(self) -> None:
        """SIGKILL: what a crash or an OOM kill does (nothing is drained)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        return stop_process(self.proc, grace_s=60)

    def log_tail(self, chars: int = 4000) -> str:
        return log_tail(self.log_path, chars)

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
