"""rotel (a Rust OpenTelemetry collector from PyPI) as an independent OTLP peer for tests.

:func:`rotel_binary` installs the pinned pre-release into its own venv under
``~/.cache/gym-telemetry/peers/`` (outside the repository) the first time it is called,
reuses it afterwards, and returns the path of the ``rotel-agent`` binary. It needs
``python3.11`` (the wheel links libpython3.11) and pip access to PyPI.

:class:`RotelBlackhole` runs rotel on free loopback ports with the blackhole exporter and
the detailed debug log, and parses that log back into spans with their attributes;
:class:`RotelForwarder` runs it as a client of another OTLP/gRPC server (its exporter).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.procs import spawn

ROTEL_VERSION = "0.0.1a15"
PEERS_DIR = Path(os.environ.get("GYM_TELEMETRY_PEERS_DIR", "~/.cache/gym-telemetry/peers"))


def _python311() -> str:
    found = shutil.which("python3.11")
    if found is None:
        raise RuntimeError("rotel needs python3.11 on PATH (its wheel links libpython3.11)")
    return found


def rotel_binary(version: str = ROTEL_VERSION) -> Path:
    """Install rotel==version into its cached venv if missing; return the binary path.

    Idempotent: a venv whose binary exists is reused. A half-built venv (interrupted
    install) is removed and rebuilt. Blocks while pip runs (about a minute cold).
    """
    venv = PEERS_DIR.expanduser() / f"rotel-{version}"
    marker = venv / ".installed"
    if marker.exists():
        found = sorted(venv.glob("lib/python3*/site-packages/rotel/rotel-agent"))
        if found:
            return found[0]
    if venv.exists():
        shutil.rmtree(venv)  # half-built by an interrupted install
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([_python311(), "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", f"rotel=={version}"], check=True
    )
    found = sorted(venv.glob("lib/python3*/site-packages/rotel/rotel-agent"))
    if not found:
        raise RuntimeError(f"rotel {version} installed into {venv} but no rotel-agent binary")
    marker.write_text(version)
    return found[0]


@dataclass
class DebugSpan:
    """One span as rotel's detailed debug log printed it."""

    name: str
    attributes: dict[str, str] = field(default_factory=dict)
    """Key -> the typed value as printed, e.g. ``Str(text)``, ``Int(42)``."""
    resource: dict[str, str] = field(default_factory=dict)
    scope: str = ""


# Lines look like (collector debug-exporter layout):
#   Resource attributes:
#        -> service.name: Str(svc)
#   InstrumentationScope gym.rollout 1.0
#   Span #0
#       Name           : rollout
#   Attributes:
#        -> nemo.gym.rollout.id: Str(r-1)
_ATTR = re.compile(r"^\s*->\s*([^:]+):\s*(\w+)\((.*)\)\s*$")
_NAME = re.compile(r"^\s*Name\s*:\s*(.*?)\s*$")
_SCOPE = re.compile(r"^\s*InstrumentationScope\s+(\S+)")


def parse_debug_spans(text: str) -> list[DebugSpan]:
    """Parse rotel's ``--debug-log-verbosity detailed`` trace output into spans."""
    spans: list[DebugSpan] = []
    resource: dict[str, str] = {}
    scope = ""
    section = ""
    current: DebugSpan | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ResourceSpans #"):
            resource, scope, current, section = {}, "", None, ""
            continue
        if line.startswith("Resource attributes"):
            section = "resource"
            continue
        m = _SCOPE.match(line)
        if m:
            scope, section, current = m.group(1), "", None
            continue
        if line.startswith("Span #"):
            current = DebugSpan(name="", resource=dict(resource), scope=scope)
            spans.append(current)
            section = "span"
            continue
        if line.startswith("Attributes:") and current is not None:
            section = "span_attrs"
            continue
        if line.startswith(("Events:", "Links:", "SpanEvent", "SpanLink")):
            section = "other"
            continue
        m = _ATTR.match(raw)
        if m:
            key, value = m.group(1).strip(), f"{m.group(2)}({m.group(3)})"
            if section == "resource":
                resource[key] = value
            elif section == "span_attrs" and current is not None:
                current.attributes[key] = value
            continue
        m = _NAME.match(raw)
        if m and current is not None and section == "span" and not current.name:
            current.name = m.group(1)
    return spans


class RotelBlackhole:
    """rotel on free loopback ports, exporting to blackhole and logging every span."""

    def __init__(self, workdir: Path) -> None:
        self.binary = rotel_binary()
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.workdir = workdir
        self.log_file = workdir / "rotel.log"
        self.stdout_file = workdir / "rotel.stdout"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self) -> RotelBlackhole:
        cmd = [
            str(self.binary),
            "start",
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{self.grpc_port}",
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            "--exporter",
            "blackhole",
            "--debug-log",
            "traces",
            "--debug-log-verbosity",
            "detailed",
            "--pid-file",
            str(self.workdir / "rotel.pid"),
            "--log-file",
            str(self.log_file),
        ]
        with self.stdout_file.open("wb") as out:
            # in our process group (Ctrl-C reaches it); dies with us on Linux
            self.proc = spawn(cmd, stdout=out, new_session=False)
        try:
            wait_listening(self.grpc_port, timeout_s=20)
            wait_listening(self.http_port, timeout_s=20)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"rotel did not start: {self.output()[-2000:]}") from None
        except BaseException:
            self.stop()  # interrupted while it started
            raise
        return self

    def output(self) -> str:
        """Everything rotel printed so far (stdout/stderr and its log file)."""
        parts = []
        for f in (self.stdout_file, self.log_file):
            if f.exists():
                parts.append(f.read_text(errors="replace"))
        return "\n".join(parts)

    def spans(self) -> list[DebugSpan]:
        return parse_debug_spans(self.output())

    def wait_spans(self, n: int, timeout_s: float = 20.0) -> list[DebugSpan]:
        deadline = time.monotonic() + timeout_s
        spans = self.spans()
        while len(spans) < n and time.monotonic() < deadline:
            time.sleep(0.1)
            spans = self.spans()
        return spans

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class RotelForwarder:
    """rotel on free loopback ports, forwarding what it receives with its OTLP exporter
    over gRPC to ``endpoint`` (``http://host:port``), gzip or not: rotel as a client of
    another OTLP server (its exporter is tonic/hyper, Rust's gRPC stack)."""

    def __init__(self, workdir: Path, endpoint: str, compression: str = "gzip") -> None:
        self.binary = rotel_binary()
        self.endpoint = endpoint
        self.compression = compression
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.workdir = workdir
        self.log_file = workdir / "rotel-forwarder.log"
        self.stdout_file = workdir / "rotel-forwarder.stdout"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_endpoint(self) -> str:
        """Its OTLP/gRPC receiver, ``host:port``."""
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> RotelForwarder:
        cmd = [
            str(self.binary),
            "start",
            "--otlp-grpc-endpoint",
            self.grpc_endpoint,
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            self.endpoint,
            "--otlp-exporter-protocol",
            "grpc",
            "--otlp-exporter-compression",
            self.compression,
            "--batch-timeout",
            "100ms",
            "--pid-file",
            str(self.workdir / "rotel-forwarder.pid"),
            "--log-file",
            str(self.log_file),
        ]
        with self.stdout_file.open("wb") as out:
            self.proc = spawn(cmd, stdout=out, new_session=False)
        try:
            wait_listening(self.grpc_port, timeout_s=20)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"rotel did not start: {self.output()[-2000:]}") from None
        except BaseException:
            self.stop()  # interrupted while it started
            raise
        return self

    def output(self) -> str:
        parts = []
        for f in (self.stdout_file, self.log_file):
            if f.exists():
                parts.append(f.read_text(errors="replace"))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM (rotel flushes what it holds), SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    print(rotel_binary(), file=sys.stdout)
