"""A real OTLP/gRPC backend for tests and benchmarks: it records what arrives.

``RecordingSink`` runs a grpc server (TraceService, MetricsService, LogsService) on a
free loopback port in a background thread. It can be scripted to fail: ``fail_next``
queues status codes (with an optional RetryInfo delay) that the next calls answer
before accepting again; ``hold`` makes every call wait (a stalled backend or sidecar)
until ``release``, so a test can know, not guess, that an exporter is stuck in a call.
Messages up to 64 MiB are accepted (rotel sends ~3 MB batches).

Run as a process (``python -m testkit.sink --port N``) it only counts spans and
prints the totals on SIGTERM, for benchmarks.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from gym_telemetry_demo.ports import free_port
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
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.wait import DEFAULT_TIMEOUT_S, wait_for

MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_SERVICES = {
    "traces": (
        "opentelemetry.proto.collector.trace.v1.TraceService",
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    ),
    "metrics": (
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
    ),
    "logs": (
        "opentelemetry.proto.collector.logs.v1.LogsService",
        ExportLogsServiceRequest,
        ExportLogsServiceResponse,
    ),
}

_CODE_TO_RPC = {
    grpc.StatusCode.UNAVAILABLE: code_pb2.UNAVAILABLE,
    grpc.StatusCode.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL: code_pb2.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED: code_pb2.DEADLINE_EXCEEDED,
}


@dataclass
class RecordedSpan:
    """One span as it arrived, with its resource and scope flattened in."""

    span: Span
    resource: dict[str, Any]
    scope: str
    attributes: dict[str, Any]


def any_value(v: AnyValue) -> Any:
    """Convert an OTLP AnyValue into a plain Python value (for assertions)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attrs(kvs: Any) -> dict[str, Any]:
    """Repeated KeyValue -> dict."""
    return {kv.key: any_value(kv.value) for kv in kvs}


class RecordingSink:
    """A gRPC OTLP backend that records every accepted request (thread-safe)."""

    def __init__(self, port: int | None = None, record: bool = True) -> None:
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.record = record
        self._lock = threading.Lock()
        self.requests: dict[str, list[Any]] = {k: [] for k in _SERVICES}
        self.metadata: dict[str, dict[str, str]] = {}
        """Per signal, the request metadata (headers) of the latest call."""
        self.span_count = 0
        self.calls = 0
        self.rejected_calls = 0
        self._failures: list[tuple[grpc.StatusCode, float | None]] = []
        self.delay_s = 0.0
        self._open = threading.Event()
        self._open.set()
        self.held_calls = 0
        """Calls waiting in :meth:`hold` right now."""
        self.held: dict[str, int] = dict.fromkeys(_SERVICES, 0)
        """The same, per signal (``traces``, ``metrics``, ``logs``)."""
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=8),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        handlers = []
        for signal_name, (service, req_type, resp_type) in _SERVICES.items():
            handlers.append(
                grpc.method_handlers_generic_handler(
                    service,
                    {
                        "Export": grpc.unary_unary_rpc_method_handler(
                            self._handler(signal_name, resp_type),
                            request_deserializer=req_type.FromString,
                            response_serializer=resp_type.SerializeToString,
                        )
                    },
                )
            )
        self._server.add_generic_rpc_handlers(tuple(handlers))
        self._server.add_insecure_port(self.endpoint)

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> RecordingSink:
        self._server.start()
        return self

    def stop(self) -> None:
        self._open.set()  # a held call must not outlive the server
        self._server.stop(grace=1).wait()

    def __enter__(self) -> RecordingSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- scripting -----------------------------------------------------------------
    def fail_next(
        self, count: int, code: grpc.StatusCode, retry_after_s: float | None = None
    ) -> None:
        """Answer the next ``count`` calls with ``code`` (and RetryInfo if given)."""
        with self._lock:
            self._failures.extend([(code, retry_after_s)] * count)

    def hold(self) -> None:
        """From now on every call waits (without answering) until :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        """Let the held calls, and every later one, proceed as usual."""
        self._open.set()

    # -- reading -------------------------------------------------------------------
    def spans(self) -> list[RecordedSpan]:
        out: list[RecordedSpan] = []
        with self._lock:
            reqs = list(self.requests["traces"])
        for req in reqs:
            for rs in req.resource_spans:
                res = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        out.append(RecordedSpan(sp, res, ss.scope.name, attrs(sp.attributes)))
        return out

    def metric_requests(self) -> list[ExportMetricsServiceRequest]:
        with self._lock:
            return list(self.requests["metrics"])

    def log_requests(self) -> list[ExportLogsServiceRequest]:
        with self._lock:
            return list(self.requests["logs"])

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Poll ``predicate`` until it holds or the timeout passes; return the last value."""
        return wait_for(predicate, timeout_s)

    def wait_spans(self, n: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        return self.wait_for(lambda: self.span_count >= n, timeout_s)

    # -- serving -------------------------------------------------------------------
    def _handler(self, signal_name: str, resp_type: Any) -> Callable[[Any, Any], Any]:
        def export(request: Any, context: grpc.ServicerContext) -> Any:
            if not self._open.is_set():
                with self._lock:
                    self.held_calls += 1
                    self.held[signal_name] += 1
                self._open.wait()
                with self._lock:
                    self.held_calls -= 1
                    self.held[signal_name] -= 1
            if self.delay_s:
                time.sleep(self.delay_s)
            with self._lock:
                self.calls += 1
                self.metadata[signal_name] = {
                    str(k): str(v) for k, v in context.invocation_metadata() or ()
                }
                failure = self._failures.pop(0) if self._failures else None
                if failure is None:
                    if signal_name == "traces":
                        self.span_count += sum(
                            len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans
                        )
                    if self.record:
                        self.requests[signal_name].append(request)
                else:
                    self.rejected_calls += 1
            if failure is not None:
                code, retry_after = failure
                status = status_pb2.Status(code=_CODE_TO_RPC[code], message="scripted failure")
                if retry_after is not None:
                    info = error_details_pb2.RetryInfo(
                        retry_delay=duration_pb2.Duration(
                            seconds=int(retry_after), nanos=int((retry_after % 1) * 1e9)
                        )
                    )
                    status.details.add().Pack(info)
                context.abort_with_status(rpc_status.to_status(status))
            return resp_type()

        return export


def serve_until_signalled(banner: str, stop: Callable[[], None], totals: Callable[[], str]) -> None:
    """Run a sink as a benchmark process: print ``banner``, wait for SIGTERM or SIGINT,
    call ``stop``, then print ``totals()`` (the harnesses parse that last line)."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(banner, flush=True)
    done.wait()
    stop()
    print(totals(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Counting OTLP/gRPC sink")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    sink = RecordingSink(port=args.port, record=False).start()
    serve_until_signalled(
        f"sink listening on {sink.endpoint}",
        sink.stop,
        lambda: f"spans={sink.span_count} calls={sink.calls}",
    )


if __name__ == "__main__":
    main()
