"""What both receivers share: OTLP message types per signal, decoding, item counting,
responses, and handing a decoded request to the pipeline.

Decoding never raises anything but :class:`BadRequest`, whose message is safe to send
back to the client. Item counts walk ResourceX/ScopeX blocks only (plus the metric list
for data points), never individual spans' contents.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
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

from gym_sidecar.pipeline.stage import Backpressure, Batch, ExportRequest, Signal, Stage
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)


class BadRequest(Exception):
    """The client sent something that is not a valid OTLP request (permanent error)."""

    def __init__(self, message: str, reason: str = "bad_request") -> None:
        super().__init__(message)
        self.reason = reason


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    BACKPRESSURE = "backpressure"


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """The OTLP types and names of one signal."""

    signal: Signal
    request_type: type[Message]
    response_type: type[Message]
    grpc_service: str
    http_path: str
    count: Callable[[Any], int]


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


SPECS: dict[Signal, SignalSpec] = {
    Signal.TRACES: SignalSpec(
        Signal.TRACES,
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
        "opentelemetry.proto.collector.trace.v1.TraceService",
        "/v1/traces",
        count_spans,
    ),
    Signal.METRICS: SignalSpec(
        Signal.METRICS,
        ExportMetricsServiceRequest,
        ExportMetricsServiceResponse,
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        "/v1/metrics",
        count_data_points,
    ),
    Signal.LOGS: SignalSpec(
        Signal.LOGS,
        ExportLogsServiceRequest,
        ExportLogsServiceResponse,
        "opentelemetry.proto.collector.logs.v1.LogsService",
        "/v1/logs",
        count_log_records,
    ),
}


def decode_protobuf(spec: SignalSpec, data: bytes) -> ExportRequest:
    """Parse binary protobuf with the upb backend; BadRequest when it is not one."""
    msg = spec.request_type()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        raise BadRequest(f"body is not a valid {spec.request_type.__name__}: {exc}") from None
    return msg  # type: ignore[return-value]


# OTLP/JSON spells these bytes fields as hex, not as proto3-JSON base64 (OTLP spec,
# "JSON Protobuf Encoding"). They occur only as keys of span, link, log record and
# exemplar objects; attribute keys live under "key" values, never as object keys.
_HEX_ID_FIELDS = frozenset(
    {"traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"}
)


def _hex_ids_to_base64(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_ID_FIELDS and isinstance(value, str):
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raise BadRequest(f"{key} must be a hex string, got {value[:64]!r}") from None
                node[key] = base64.b64encode(raw).decode("ascii")
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def decode_json(spec: SignalSpec, data: bytes) -> ExportRequest:
    """Parse OTLP/JSON: hex ids, camelCase or snake_case names, enums as ints or names.

    Unknown fields are ignored, as the OTLP spec asks of receivers.
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    _hex_ids_to_base64(doc)
    msg = spec.request_type()
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, binascii.Error, ValueError, TypeError) as exc:
        raise BadRequest(
            f"body is not a valid OTLP/JSON {spec.signal.value} request: {exc}"
        ) from None
    return msg  # type: ignore[return-value]


def build_response(spec: SignalSpec, batch: Batch) -> Message:
    """The Export*ServiceResponse, with ``partial_success`` when a stage rejected items."""
    resp = spec.response_type()
    if batch.rejected > 0:
        partial = resp.partial_success  # type: ignore[attr-defined]
        field = {
            Signal.TRACES: "rejected_spans",
            Signal.METRICS: "rejected_data_points",
            Signal.LOGS: "rejected_log_records",
        }[spec.signal]
        setattr(partial, field, batch.rejected)
        partial.error_message = "; ".join(batch.rejection_messages)[:1024]
    return resp


async def submit(
    head: Stage, batch: Batch, transport: str, metrics: SelfMetrics
) -> Backpressure | None:
    """Hand ``batch`` to the pipeline; count it; return the Backpressure if refused.

    Counted: ``received{signal,transport}`` for accepted items,
    ``refused{signal,reason}`` for items refused with backpressure, and items a stage
    rejected as ``refused{reason="rejected"}`` (they are reported in partial_success).
    """
    signal = batch.signal.value
    offered = batch.items
    try:
        await head.consume(batch)
    except Backpressure as bp:
        metrics.refused.labels(signal, bp.reason).inc(offered)
        return bp
    metrics.received.labels(signal, transport).inc(offered - batch.rejected)
    if batch.rejected:
        metrics.refused.labels(signal, "rejected").inc(batch.rejected)
    return None
