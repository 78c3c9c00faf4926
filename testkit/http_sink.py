"""A real OTLP/HTTP backend that counts what arrives: the HTTP twin of ``sink.RecordingSink``.

``HttpSink`` runs an aiohttp server on a free loopback port in a background thread with
its own event loop. ``POST /v1/traces`` (``/v1/metrics``, ``/v1/logs``) takes
``application/x-protobuf`` bodies, plain or ``Content-Encoding: gzip`` (inflated by
aiohttp), parses them as the OTLP export request of that signal, counts the spans of
trace requests (``span_count``) and answers 200 with an empty export response. A body
that does not parse gets 400 and is counted in ``bad_requests``. Bodies up to 64 MiB
(after inflation) are accepted, like the gRPC sink's messages.

    with HttpSink() as sink:                     # sink.url == "http://127.0.0.1:<port>"
        ... export to sink.url ...
        sink.wait_spans(n)

Run as a process (``python -m testkit.http_sink --port N``) it counts and prints
the totals on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from typing import Any

from aiohttp import web
from google.protobuf.message import DecodeError
from gym_telemetry_demo.ports import free_port, wait_listening
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from testkit.sink import serve_until_signalled
from testkit.wait import DEFAULT_TIMEOUT_S, wait_for

MAX_BODY_BYTES = 64 * 1024 * 1024

_SIGNALS: dict[str, tuple[Any, Any]] = {
    "traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
}


class HttpSink:
    """An OTLP/HTTP protobuf backend counting spans and requests (thread-safe reads)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.endpoint}"
        self.span_count = 0
        self.calls = 0
        self.bad_requests = 0
        self.gzip_requests = 0
        self.logs: list[ExportLogsServiceRequest] = []
        """The log export requests received, parsed (``/v1/logs``)."""
        self.log_headers: list[dict[str, str]] = []
        """Their HTTP headers."""
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> HttpSink:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        wait_listening(self.port, timeout_s=10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> HttpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading -------------------------------------------------------------------
    def wait_spans(self, n: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Poll until at least ``n`` spans were counted; return whether they were."""
        return wait_for(lambda: self.span_count >= n, timeout_s)

    # -- serving -------------------------------------------------------------------
    async def _serve(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/{signal}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        kinds = _SIGNALS.get(request.match_info["signal"])
        if kinds is None:
            return web.Response(status=404, text="unknown signal")
        req_type, resp_type = kinds
        body = await request.read()  # inflated when Content-Encoding: gzip
        try:
            msg = req_type.FromString(body)
        except DecodeError as exc:
            with self._lock:
                self.bad_requests += 1
            return web.Response(status=400, text=f"not an OTLP export request: {exc}")
        spans = 0
        if isinstance(msg, ExportTraceServiceRequest):
            spans = sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.calls += 1
            self.span_count += spans
            if isinstance(msg, ExportLogsServiceRequest):
                self.logs.append(msg)
                self.log_headers.append(dict(request.headers))
            if request.headers.get("Content-Encoding", "").lower() == "gzip":
                self.gzip_requests += 1
        return web.Response(
            body=resp_type().SerializeToString(), content_type="application/x-protobuf"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="Counting OTLP/HTTP sink")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    sink = HttpSink(port=args.port).start()
    serve_until_signalled(
        f"http sink listening on {sink.url}",
        sink.stop,
        lambda: f"spans={sink.span_count} calls={sink.calls} bad={sink.bad_requests}",
    )


if __name__ == "__main__":
    main()
