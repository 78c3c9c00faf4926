"""A real Jaeger v2, built from the Go module proxy, on free loopback ports.

Used by ``make demo --jaeger`` and by the backend tests (``tests/support/jaeger.py``).

:func:`jaeger_binary` builds the pinned release once per machine with
``scripts/jaeger_build.py`` (cached under ``~/.cache/gym-telemetry/peers/``; the first
build takes minutes and prints how long it took) and returns the binary's path.

:class:`JaegerServer` runs that binary with :func:`jaeger_config`: the traces pipeline
of Jaeger's built-in all-in-one configuration, which is what ``docker-compose.yml``'s
``jaeger`` service runs (OTLP receiver, batch processor, in-memory storage, the query
service), with every listener on 127.0.0.1 and a free port. The all-in-one's other
listeners (Jaeger/Zipkin receivers, remote sampling, health check, expvar, zpages, its
own Prometheus endpoint on 8888) are left out so that several instances never collide on
a fixed port. Query tracing is off, so the store holds only what was sent to it.

Its query service is read through the HTTP API that Jaeger's UI calls (``/api/services``,
``/api/traces?service=..&tags=..``, ``/api/traces/{id}``): :meth:`JaegerServer.api`. The
UI's own pages are not in the Go module (a module build serves a placeholder page).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.procs import log_tail, run_in_group, spawn, stop_process

#: The first build downloads and compiles a few hundred Go modules.
BUILD_TIMEOUT_S: Final = 3600


@dataclass(frozen=True)
class JaegerSpan:
    """One span of a trace as the query API returns it (the UI's model)."""

    span_id: str
    parent_id: str | None
    """The span a ``CHILD_OF`` reference points to (None for a root)."""
    operation: str
    service: str
    tags: dict[str, Any] = field(default_factory=dict)
    """Span tags by key: OTLP attributes, plus ``span.kind``, ``error``, ``otel.*``."""

    @property
    def kind(self) -> str | None:
        kind = self.tags.get("span.kind")
        return str(kind) if kind is not None else None


@dataclass(frozen=True)
class JaegerTrace:
    """A trace from ``GET /api/traces/{id}`` (or one entry of a search)."""

    trace_id: str
    spans: list[JaegerSpan]
    warnings: list[str]

    @classmethod
    def parse(cls, data: dict[str, Any]) -> JaegerTrace:
        services = {pid: p["serviceName"] for pid, p in (data.get("processes") or {}).items()}
        spans = []
        for raw in data["spans"]:
            parents = [
                r["spanID"]
                for r in raw.get("references") or []
                if r.get("refType") == "CHILD_OF" and r.get("traceID") == raw["traceID"]
            ]
            spans.append(
                JaegerSpan(
                    span_id=raw["spanID"],
                    parent_id=parents[0] if parents else None,
                    operation=raw["operationName"],
                    service=services.get(raw["processID"], ""),
                    tags={t["key"]: t["value"] for t in raw.get("tags") or []},
                )
            )
        warnings = [str(w) for w in data.get("warnings") or []]
        return cls(str(data["traceID"]), spans, warnings)

    def services(self) -> set[str]:
        return {s.service for s in self.spans}

    def by_id(self) -> dict[str, JaegerSpan]:
        return {s.span_id: s for s in self.spans}

    def roots(self) -> list[JaegerSpan]:
        return [s for s in self.spans if s.parent_id is None]

    def orphans(self) -> list[JaegerSpan]:
        ids = self.by_id()
        return [s for s in self.spans if s.parent_id is not None and s.parent_id not in ids]

    def parent(self, span: JaegerSpan) -> JaegerSpan | None:
        return self.by_id().get(span.parent_id or "")

    def named(self, operation: str) -> list[JaegerSpan]:
        return [s for s in self.spans if s.operation == operation]

    def tag_values(self, key: str) -> set[Any]:
        return {s.tags.get(key) for s in self.spans}


def same_trace_id(a: str, b: str) -> bool:
    """Whether two hex trace ids name the same trace (Jaeger may drop leading zeros)."""
    return a.lower().lstrip("0") == b.lower().lstrip("0")


def jaeger_binary(repo: Path, report: Callable[[str], object] | None = None) -> Path:
    """Build (first call on a machine) or reuse the cached Jaeger binary with ``repo``'s
    ``scripts/jaeger_build.py``; its path.

    What the build script printed (its steps and the time the build took; nothing when
    the cached binary was reused) is passed line by line to ``report`` (default: this
    process's stderr). Raises RuntimeError with the build's output when it fails (no Go,
    no module proxy).
    """
    # its own process group: `go build` stops with it when the demo stops meanwhile
    result = run_in_group(
        [sys.executable, str(repo / "scripts" / "jaeger_build.py"), "ensure"], BUILD_TIMEOUT_S
    )
    for line in result.stderr.splitlines():
        (report or (lambda text: sys.stderr.write(text + "\n")))(line)
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(
            f"scripts/jaeger_build.py ensure failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return Path(result.stdout.strip().splitlines()[-1])


def jaeger_config(
    otlp_grpc: int, otlp_http: int, query_http: int, query_grpc: int, otlp_host: str = "127.0.0.1"
) -> str:
    """Jaeger's all-in-one traces pipeline on the given loopback ports (module doc); the
    OTLP receivers on ``otlp_host`` (another address of this machine, for senders that
    cannot reach its loopback: a pod on a bridge the caller created)."""
    host = "127.0.0.1"
    config: dict[str, Any] = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {
                "resource": {"service.name": "jaeger"},
                # no own /metrics listener (the all-in-one opens one on port 8888)
                "metrics": {"level": "none"},
                "logs": {"level": "info"},
            },
        },
        "extensions": {
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100000}}}},
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "enable_tracing": False,
                "http": {"endpoint": f"{host}:{query_http}"},
                "grpc": {"endpoint": f"{host}:{query_grpc}"},
            },
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"{otlp_host}:{otlp_grpc}"},
                    "http": {"endpoint": f"{otlp_host}:{otlp_http}"},
                }
            }
        },
        "processors": {"batch": {}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }
    return yaml.safe_dump(config, sort_keys=False)


class JaegerQueryClient:
    """The HTTP query API Jaeger's UI calls, at ``query_url`` (a Jaeger, or anything that
    answers the same API, such as the sidecar's web view)."""

    @property
    def query_url(self) -> str:
        """Base URL of the query API (no trailing slash)."""
        raise NotImplementedError

    def api(self, path: str, **params: str) -> Any:
        """GET ``path`` on the query service (the UI's HTTP API); the parsed JSON.

        Raises urllib.error.HTTPError on a non-2xx answer."""
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(self.query_url + path + query, timeout=10) as resp:
            return json.loads(resp.read())

    def services(self) -> list[str]:
        """``GET /api/services``: the service names the UI's search form offers."""
        return list(self.api("/api/services")["data"] or [])

    def find_traces(
        self, service: str, tags: dict[str, str] | None = None, limit: int = 1000
    ) -> list[JaegerTrace]:
        """``GET /api/traces?service=S&tags={json}&limit=N``: the UI's trace search."""
        params = {"service": service, "limit": str(limit)}
        if tags:
            params["tags"] = json.dumps(tags)
        found = self.api("/api/traces", **params)
        return [JaegerTrace.parse(t) for t in found["data"] or []]

    def trace(self, trace_id: str) -> JaegerTrace | None:
        """``GET /api/traces/{id}``: one trace as the UI's trace page loads it, or None
        when Jaeger does not have it (404)."""
        try:
            found = self.api(f"/api/traces/{trace_id}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        data = found["data"] or []
        return JaegerTrace.parse(data[0]) if data else None

    def trace_url(self, trace_id: str) -> str:
        """The ``GET /api/traces/{id}`` URL of one trace (what the UI's trace page loads)."""
        return f"{self.query_url}/api/traces/{trace_id}"

    def search_url(self, service: str, tags: dict[str, str]) -> str:
        """The ``GET /api/traces`` URL of a tag search (what the UI's search form calls)."""
        query = urllib.parse.urlencode({"service": service, "tags": json.dumps(tags)})
        return f"{self.query_url}/api/traces?{query}"


class JaegerAPI(JaegerQueryClient):
    """A :class:`JaegerQueryClient` for the query API at ``query_url``."""

    def __init__(self, query_url: str) -> None:
        self._query_url = query_url.rstrip("/")

    @property
    def query_url(self) -> str:
        return self._query_url


class JaegerServer(JaegerQueryClient):
    """A Jaeger v2 process (context manager). ``start`` blocks until the OTLP receivers
    listen and the query API answers; ``stop`` sends SIGTERM (kills after 20 s)."""

    def __init__(self, workdir: Path, binary: Path, otlp_host: str = "127.0.0.1") -> None:
        self.binary = binary
        self.workdir = workdir
        self.otlp_host = otlp_host
        self.otlp_grpc_port = free_port()
        self.otlp_http_port = free_port()
        self.query_http_port = free_port()
        self.query_grpc_port = free_port()
        self.config_path = workdir / "jaeger.yaml"
        self.log_path = workdir / "jaeger.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://{self.otlp_host}:{self.otlp_grpc_port}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://{self.otlp_host}:{self.otlp_http_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_http_port}"

    def start(self, timeout_s: float = 60.0) -> JaegerServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            jaeger_config(
                self.otlp_grpc_port,
                self.otlp_http_port,
                self.query_http_port,
                self.query_grpc_port,
                self.otlp_host,
            )
        )
        with self.log_path.open("wb") as log:
            # its own session: the demo stops it (Ctrl-C reaches the demo alone)
            self.proc = spawn(
                [str(self.binary), "--config", str(self.config_path)], stdout=log, cwd=self.workdir
            )
        try:
            for port in (self.otlp_grpc_port, self.otlp_http_port):
                wait_listening(port, timeout_s=timeout_s, host=self.otlp_host)
            wait_listening(self.query_http_port, timeout_s=timeout_s)
            deadline = time.monotonic() + timeout_s
            while not self._query_ready():
                if time.monotonic() > deadline:
                    raise TimeoutError("the query API did not answer")
                time.sleep(0.1)
        except (TimeoutError, OSError) as exc:
            self.stop()
            raise RuntimeError(f"Jaeger did not start ({exc}); log:\n{self.log_tail()}") from None
        except BaseException:
            self.stop()  # told to stop while it started
            raise
        return self

    def _query_ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise OSError(f"Jaeger exited with {self.proc.returncode}")
        try:
            self.api("/api/services")
        except (OSError, ValueError):
            return False
        return True

    def log_tail(self, chars: int = 4000) -> str:
        return log_tail(self.log_path, chars)

    def stop(self) -> int | None:
        return stop_process(self.proc, grace_s=20)

    def __enter__(self) -> JaegerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
