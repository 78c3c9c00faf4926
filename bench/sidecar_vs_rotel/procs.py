"""The collectors under test as processes, and what /proc says about them.

The paths end in a counting sink: over gRPC ``testkit.sink.RecordingSink``, over
OTLP/HTTP ``testkit.http_sink.HttpSink`` (both accept up to 64 MiB, as rotel's
~3 MB batches need):

- ``direct``: no collector; the load generator sends to the gRPC sink (the transport
  ceiling).
- ``sidecar``: a real ``gym-sidecar run`` process (``tests.support.sidecar_proc``) with
  its full pipeline (enrich, derive, gate, queue, export), span groups ``all`` so every
  span is forwarded, ``--backend-compression`` gzip or none, exporting over gRPC or
  OTLP/HTTP (``--backend-protocol``; gzip at the default ``compression_level``).
  ``sidecar-h2`` and ``sidecar-grpcio`` force ``backend.grpc_client`` (the default,
  ``auto``, uses h2 with gzip and grpc.aio without).
- ``rotel``: rotel from PyPI (``testkit.rotel.rotel_binary``, installed into a
  cached venv), OTLP exporter over gRPC or HTTP (``--otlp-exporter-protocol``), gzip or
  none (``--otlp-exporter-compression``).
- ``jaeger``: Jaeger v2 (built from the Go module proxy, see :func:`jaeger_binary`) in a
  pure collector role: the OpenTelemetry Collector's ``otlp`` receiver, ``batch``
  processor and ``otlp`` (gRPC) or ``otlphttp`` exporter, gzip or none; no storage, no
  query service. Its build has no ``resource`` processor, so it adds no attributes
  (the closest, ``attributes``, would write every span, more work than the others do).

- ``otelcol``: the OpenTelemetry Collector doing the sidecar's job, the project's
  distribution (``scripts/otelcol_build.py``, core + contrib v0.161.0) with
  ``otelcol-same-job.yaml``: ``resource`` (the same 2 attributes), ``batch``, OTLP export
  at the path's protocol and compression, and ``filter`` + ``span_metrics`` deriving
  gym.rollout/gym.verify histograms; with default span groups it also drops the groups
  the sidecar's gate drops.

The sidecar, rotel and otelcol add the same two static resource attributes
(``BENCH_RESOURCE``). ``groups`` (the sidecar and otelcol) is the span-group spec: ``all``
forwards every span, ``default`` drops the derive-only and off groups after deriving.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml
from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.procs import spawn
from gym_telemetry_demo.sidecar import SidecarProcess

from testkit.rotel import ROTEL_VERSION, rotel_binary

BENCH_RESOURCE = {"deployment.environment.name": "bench", "k8s.cluster.name": "gym-bench"}
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def status_mib(pid: int, key: str) -> float:
    """A ``kB`` field of /proc/<pid>/status (``VmHWM`` peak RSS, ``VmRSS``) in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def pin(pid: int, cores: set[int]) -> None:
    """Pin every thread of ``pid`` to ``cores`` (threads started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # a thread that just ended
            continue


class Collector(Protocol):
    """A path's receiving end; ``pid`` is None when there is no collector process."""

    name: str
    pid: int | None
    http_target: str | None

    @property
    def grpc_target(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class Direct:
    """No collector: the generator talks to the sink itself."""

    sink_endpoint: str
    name: str = "direct"
    pid: int | None = None
    http_target: str | None = None

    @property
    def grpc_target(self) -> str:
        return self.sink_endpoint

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


class Sidecar:
    """``gym-sidecar run`` with the full pipeline, exporting to the sink."""

    def __init__(
        self,
        sink_endpoint: str,
        compression: str,
        workdir: Path,
        export: str = "grpc",
        gzip_level: int | None = None,
        grpc_client: str = "auto",
        env: dict[str, str] | None = None,
        groups: str = "all",
        derive: bool = True,
    ) -> None:
        kind = "sidecar" if grpc_client == "auto" else f"sidecar-{grpc_client}"
        if not derive:
            kind = "sidecar-noderive"
        if gzip_level and compression == "gzip":
            kind += f"@{gzip_level}"  # a level other than the default: its own path
        self.name = f"{kind}:{export}/{compression}"
        protocol = "grpc" if export == "grpc" else "http/protobuf"
        self.proc = SidecarProcess(
            backend=sink_endpoint,
            extra_args=[
                "--backend-compression",
                compression,
                "--backend-protocol",
                protocol,
                "--log-level",
                "warning",
            ],
            config={
                "span_groups": {"spec": groups},
                "enrich": {"attributes": dict(BENCH_RESOURCE)},
                "metrics": {"enabled": derive},
                "backend": {
                    "grpc_client": grpc_client,
                    **({"compression_level": gzip_level} if gzip_level else {}),
                },
            },
            env=env,
            log_dir=workdir,
        )
        self.grpc_target = self.proc.grpc_endpoint
        self.http_target: str | None = self.proc.http_url
        self.pid: int | None = None
        self.scanner: str | None = None
        """The trace scanner the sidecar reported at start (``native`` or ``python``):
        recorded with every run, since the two differ ~2x in CPU per span and an
        environment that lost the native module runs the other without a word."""

    def start(self) -> None:
        self.proc.start()
        assert self.proc.proc is not None
        self.pid = self.proc.proc.pid
        self.scanner = self.proc.trace_scanner()

    def stop(self) -> None:
        code = self.proc.stop()
        if code != 0:
            raise RuntimeError(f"sidecar exited with {code}: {self.proc.log_text()[-2000:]}")


class _ChildCollector:
    """A collector run as a child process writing to ``<workdir>/<name>.out``, listening on
    ``grpc_port`` and ``http_port``; the start and stop that Rotel and Jaeger share."""

    workdir: Path
    grpc_port: int
    http_port: int
    proc: subprocess.Popen[bytes] | None
    pid: int | None

    def _launch(self, cmd: list[str], name: str, timeout_s: float) -> None:
        """Start ``cmd`` and wait until both ports listen; on timeout stop it and raise."""
        with (self.workdir / f"{name}.out").open("wb") as out:
            # in our process group (Ctrl-C reaches it); dies with us on Linux
            self.proc = spawn(cmd, stdout=out, new_session=False)
        self.pid = self.proc.pid
        try:
            wait_listening(self.grpc_port, timeout_s=timeout_s)
            wait_listening(self.http_port, timeout_s=timeout_s)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"{name} did not start; see {self.workdir}") from None
        except BaseException:
            self.stop()  # interrupted while it started
            raise

    def stop(self) -> None:
        self._terminate()

    def _terminate(self) -> bool:
        """SIGTERM, then SIGKILL after 15 s. False when there was no running process."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return True


class Rotel(_ChildCollector):
    """rotel (PyPI) with its OTLP exporter pointed at the sink."""

    def __init__(
        self, sink_endpoint: str, workdir: Path, export: str = "grpc", compression: str = "gzip"
    ) -> None:
        self.name = f"rotel:{export}/{compression}"
        self.export = export
        self.compression = compression
        self.version = ROTEL_VERSION
        self.binary = rotel_binary()
        self.grpc_port, self.http_port = free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.http_target: str | None = f"http://127.0.0.1:{self.http_port}"
        self.sink_endpoint = sink_endpoint
        self.workdir = Path(tempfile.mkdtemp(prefix="rotel-", dir=workdir))
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None

    def start(self) -> None:
        cmd = [
            str(self.binary),
            "start",
            "--otlp-grpc-endpoint",
            self.grpc_target,
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            f"http://{self.sink_endpoint}",
            "--otlp-exporter-protocol",
            self.export,
            "--otlp-exporter-compression",
            self.compression,
            "--otel-resource-attributes",
            ",".join(f"{k}={v}" for k, v in BENCH_RESOURCE.items()),
            "--pid-file",
            str(self.workdir / "rotel.pid"),
            "--log-file",
            str(self.workdir / "rotel.log"),
        ]
        self._launch(cmd, "rotel", timeout_s=20)


JAEGER_MODULE_VERSION = "v1.76.0"
"""The Go module version of github.com/jaegertracing/jaeger (Jaeger v2.13.0)."""


def jaeger_binary() -> Path:
    """The Jaeger v2 binary: ``$GYM_BENCH_JAEGER``, else the peers cache, else /tmp/jtrial.

    The harness builds nothing itself: the real-backends tooling builds and caches the
    binary under ``~/.cache/gym-telemetry/peers/jaeger-<version>/bin/jaeger``.
    """
    candidates = [
        os.environ.get("GYM_BENCH_JAEGER", ""),
        str(
            Path("~/.cache/gym-telemetry/peers").expanduser()
            / f"jaeger-{JAEGER_MODULE_VERSION}"
            / "bin"
            / "jaeger"
        ),
        "/tmp/jtrial/jaeger",
    ]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise RuntimeError("no Jaeger v2 binary; build it first (set GYM_BENCH_JAEGER=<path>)")


class Jaeger(_ChildCollector):
    """Jaeger v2 as an OpenTelemetry Collector: otlp receiver -> batch -> otlp(http) exporter."""

    def __init__(
        self, sink_endpoint: str, workdir: Path, export: str = "grpc", compression: str = "gzip"
    ) -> None:
        self.name = f"jaeger:{export}/{compression}"
        self.binary = jaeger_binary()
        self.grpc_port, self.http_port = free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.http_target: str | None = f"http://127.0.0.1:{self.http_port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="jaeger-", dir=workdir))
        exporter = "otlp" if export == "grpc" else "otlphttp"
        exporter_config: dict[str, object] = {"compression": compression}
        if export == "grpc":
            exporter_config |= {"endpoint": sink_endpoint, "tls": {"insecure": True}}
        else:
            exporter_config["endpoint"] = f"http://{sink_endpoint}"
        config = {
            "receivers": {
                "otlp": {
                    "protocols": {
                        "grpc": {"endpoint": self.grpc_target, "max_recv_msg_size_mib": 64},
                        "http": {"endpoint": f"127.0.0.1:{self.http_port}"},
                    }
                }
            },
            "processors": {"batch": {}},
            "exporters": {exporter: exporter_config},
            "service": {
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}},
                "pipelines": {
                    "traces": {
                        "receivers": ["otlp"],
                        "processors": ["batch"],
                        "exporters": [exporter],
                    }
                },
            },
        }
        self.config_path = self.workdir / "collector.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None

    def start(self) -> None:
        cmd = [str(self.binary), "--config", str(self.config_path)]
        self._launch(cmd, "jaeger", timeout_s=30)

    def stop(self) -> None:
        if self._terminate():
            shutil.rmtree(self.workdir, ignore_errors=True)


OTELCOL_CONFIG = Path(__file__).with_name("otelcol-same-job.yaml")
"""The same-job Collector's configuration (beside the harness; see its comments)."""
OTELCOL_CACHE_BINARY = (
    Path("~/.cache/gym-telemetry/peers").expanduser()
    / "otelcol-gym-gateway-v0.161.0"
    / "bin"
    / "otelcol-gym-gateway"
)


def otelcol_binary(build: bool = True) -> Path:
    """The project's Collector distribution: ``$GYM_BENCH_OTELCOL``, else
    ``scripts/otelcol_build.py`` (the gateway tier's build, shared caches; it builds on
    first use when ``build``), else the binary in the peers cache."""
    env = os.environ.get("GYM_BENCH_OTELCOL", "")
    if env and Path(env).is_file():
        return Path(env)
    script = Path(__file__).resolve().parents[2] / "scripts" / "otelcol_build.py"
    if script.is_file():
        import importlib.util

        spec = importlib.util.spec_from_file_location("otelcol_build", script)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        path = Path(mod.binary_path())
        if path.is_file():
            return path
        if build:
            return Path(mod.ensure())
    if OTELCOL_CACHE_BINARY.is_file():
        return OTELCOL_CACHE_BINARY
    raise RuntimeError("no Collector distribution; build it with scripts/otelcol_build.py")


def dropped_scopes(groups: str) -> list[str]:
    """The ``gym_telemetry.<group>`` scopes a span-group spec does not forward."""
    import gym_telemetry_semconv as semconv

    modes = semconv.resolve_modes(groups)
    return sorted(semconv.scope_name(g) for g, m in modes.items() if m != semconv.Mode.ON)


class OtelCol(_ChildCollector):
    """The OpenTelemetry Collector doing the sidecar's job (``otelcol-same-job.yaml``):
    resource attributes, batch, export; filter + span_metrics for the derived metrics;
    with span groups other than ``all``, the groups not forwarded dropped after deriving."""

    def __init__(
        self,
        sink_endpoint: str,
        workdir: Path,
        export: str = "grpc",
        compression: str = "gzip",
        groups: str = "all",
        derive: bool = True,
    ) -> None:
        self.name = f"otelcol{'' if derive else '-noderive'}:{export}/{compression}"
        self.binary = otelcol_binary()
        self.grpc_port, self.http_port = free_port(), free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.http_target: str | None = f"http://127.0.0.1:{self.http_port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="otelcol-", dir=workdir))
        config = yaml.safe_load(OTELCOL_CONFIG.read_text(encoding="utf-8"))
        drop = dropped_scopes(groups)
        pipelines = config["service"]["pipelines"]
        if not drop:
            pipelines["traces/export"]["processors"].remove("filter/groups")
            del config["processors"]["filter/groups"]
        if not derive:  # the export pipeline alone: what deriving costs is the difference
            del pipelines["traces/derive"], pipelines["metrics/derived"]
            del config["connectors"], config["processors"]["filter/derived"]
        if export == "http":
            grpc_exp = config["exporters"].pop("otlp_grpc")
            config["exporters"]["otlp_http"] = {
                "endpoint": f"http://{sink_endpoint}",
                "compression": grpc_exp["compression"],
            }
            for pipe in pipelines.values():
                pipe["exporters"] = [
                    "otlp_http" if e == "otlp_grpc" else e for e in pipe["exporters"]
                ]
        self.env = {
            **os.environ,
            "BENCH_GRPC_LISTEN": self.grpc_target,
            "BENCH_HTTP_LISTEN": f"127.0.0.1:{self.http_port}",
            "BENCH_SINK": sink_endpoint,
            "BENCH_COMPRESSION": compression,
            # `[.]` for a dot: OTTL's string literal rejects a backslash escape such as `\.`
            "BENCH_DROP_SCOPES": "^(" + "|".join(s.replace(".", "[.]") for s in drop) + ")$",
        }
        self.config_path = self.workdir / "otelcol.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None

    def start(self) -> None:
        cmd = [str(self.binary), "--config", str(self.config_path)]
        with (self.workdir / "otelcol.out").open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.pid = self.proc.pid
        try:
            wait_listening(self.grpc_port, timeout_s=60)
            wait_listening(self.http_port, timeout_s=60)
        except TimeoutError:
            self.stop()
            log = (self.workdir / "otelcol.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"otelcol did not start: {log}") from None

    def stop(self) -> None:
        if self._terminate():
            shutil.rmtree(self.workdir, ignore_errors=True)
