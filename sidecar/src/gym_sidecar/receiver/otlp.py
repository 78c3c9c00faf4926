"""What both receivers share: decoding, responses, and handing a decoded request to the
pipeline. The per-signal OTLP table (message types, names, item counting) is
:mod:`gym_sidecar.core.otlp`.

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
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from gym_sidecar.core.otlp import SignalSpec
from gym_sidecar.core.stage import Backpressure, Batch, ExportRequest, Stage
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
        setattr(partial, spec.rejected_field, batch.rejected)
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
