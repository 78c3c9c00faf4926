"""The one per-signal OTLP table: message classes, names, paths and item counting.

Both receivers and both OTLP exporters read it, so the service names, the HTTP paths
and the ``partial_success`` fields of each signal are written once. Counting walks
ResourceX / ScopeX blocks only (plus the metric list for data points), never the
contents of individual spans.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import DecodeError, Message
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

from gym_sidecar.core.stage import Signal

logger = logging.getLogger(__name__)

PROTOBUF: Final = "application/x-protobuf"
"""OTLP/HTTP content type of binary protobuf bodies (what the exporter sends)."""
JSON: Final = "application/json"
"""OTLP/HTTP content type of OTLP/JSON bodies (accepted by the receiver)."""


def count_spans(req: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


def count_log_records(req: ExportLogsServiceRequest) -> int:
    return sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)


def count_data_points(req: ExportMetricsServiceRequest) -> int:
    total = 0
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(m, kind).data_points)
    return total


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """The OTLP types and names of one signal."""

    signal: Signal
    request_type: type[Message]
    response_type: type[Message]
    grpc_service: str
    """Fully qualified gRPC service name, e.g. ``...trace.v1.TraceService``."""
    http_path: str
    """The OTLP/HTTP path, e.g. ``/v1/traces``."""
    count: Callable[[Any], int]
    """Items in a decoded request of this signal (spans, data points, log records); a
    trace batch carries its wire view, which counts itself (``span_count``)."""
    rejected_field: str
    """The ``partial_success`` field that counts rejected items of this signal."""

    @property
    def grpc_method(self) -> str:
        """The unary ``Export`` method's path, as a gRPC channel names it."""
        return f"/{self.grpc_service}/Export"


SPECS: dict[Signal, SignalSpec] = {
    Signal.TRACES: SignalSpec(
        Signal.TRACES,
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
        "opentelemetry.proto.collector.trace.v1.TraceService",
        "/v1/traces",
        count_spans,
        "rejected_spans",
    ),
    Signal.METRICS: SignalSpec(
        Signal.METRICS,
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        "/v1/metrics",
        count_data_points,
        "rejected_data_points",
    ),
    Signal.LOGS: SignalSpec(
        Signal.LOGS,
        ExportLogsServiceRequest,
        ExportLogsServiceResponse,
        "opentelemetry.proto.collector.logs.v1.LogsService",
        "/v1/logs",
        count_log_records,
        "rejected_log_records",
    ),
}


def rejected_items(signal: Signal, response: bytes) -> tuple[int, str]:
    """Items a backend rejected according to a serialized response's ``partial_success``.

    Returns ``(rejected, error_message)``. An unparsable response is logged and read as
    ``(0, "")``: the data was accepted; only the rejection count is lost.
    """
    spec = SPECS[signal]
    try:
        partial = spec.response_type.FromString(response).partial_success  # type: ignore[attr-defined]
    except DecodeError:
        logger.warning("backend sent an unparsable %s export response", signal.value)
        return 0, ""
    return int(getattr(partial, spec.rejected_field)), str(partial.error_message)
