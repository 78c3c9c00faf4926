"""A real OTLP/HTTP backend in a background thread (stdlib HTTP server), for tests.

It answers ``POST /v1/<signal>`` from a script of failures (status, Retry-After) and
then with 200, and records every accepted trace request.
"""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.ports import free_port


class ScriptedHttpBackend:
    """Thread-safe recorder; use as a context manager."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._script: list[tuple[int, str | None]] = []
        self.statuses: list[int] = []
        self.requests: list[ExportTraceServiceRequest] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                status, retry_after = backend._answer(self.path, body)
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def fail_next(self, count: int, status: int, retry_after: str | None = None) -> None:
        with self._lock:
            self._script.extend([(status, retry_after)] * count)

    def _answer(self, path: str, body: bytes) -> tuple[int, str | None]:
        with self._lock:
            status, retry_after = self._script.pop(0) if self._script else (200, None)
            self.statuses.append(status)
            if status == 200 and path == "/v1/traces":
                self.requests.append(ExportTraceServiceRequest.FromString(body))
            return status, retry_after

    def span_names(self) -> list[str]:
        with self._lock:
            reqs = list(self.requests)
        return [
            sp.name
            for r in reqs
            for rs in r.resource_spans
            for ss in rs.scope_spans
            for sp in ss.spans
        ]

    def __enter__(self) -> ScriptedHttpBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
