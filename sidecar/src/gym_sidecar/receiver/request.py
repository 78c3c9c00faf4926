"""What both receivers share, whatever the transport: a request body in, a
:class:`Batch` out (:func:`decode_batch`), the response, and handing the batch to the
pipeline. The per-signal OTLP table (message types, names, item counting) is
:mod:`gym_sidecar.core.signals`; decoding into protobuf messages is
:mod:`gym_sidecar.wire.protobuf.decode`, and a trace request's wire view
:mod:`gym_sidecar.wire.protobuf.scan`.

Decoding never raises anything but :class:`BadRequest`, whose message is safe to send
back to the client. Item counts walk ResourceX/ScopeX blocks only (plus the metric list
for data points), never individual spans' contents.
"""

from __future__ import annotations

import logging

from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gym_sidecar.core.signals import SignalSpec
from gym_sidecar.core.stage import Backpressure, Batch, Signal, Stage
from gym_sidecar.core.traces import ScanSpec
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.protobuf.decode import BadRequest, decode_json, decode_protobuf
from gym_sidecar.wire.protobuf.scan import scan_request

logger = logging.getLogger(__name__)

__all__ = ["BadRequest", "build_response", "decode_batch", "submit"]


def decode_batch(
    spec: SignalSpec,
    body: bytes,
    *,
    json: bool,
    max_depth: int,
    max_messages: int,
    scan: ScanSpec,
    peer: str | None,
) -> Batch:
    """The batch a request body (protobuf, or OTLP/JSON when ``json``) makes, or
    :class:`BadRequest`.

    Traces become their wire view (:func:`~gym_sidecar.wire.protobuf.scan.scan_request`,
    reading what ``scan`` asks for); OTLP/JSON traces are decoded as JSON, serialized,
    then scanned (JSON is the rare, slow path anyway). Metrics and logs are decoded
    into protobuf messages. ``max_depth`` and ``max_messages`` are the
    ``limits.max_message_depth`` and ``limits.max_request_messages`` bounds; ``peer``
    (``ip:port``) is kept for enrichment.
    """
    if spec.signal is Signal.TRACES:
        if json:
            body = decode_json(spec, body, max_depth, max_messages).SerializeToString()
        request = scan_request(body, max_depth=max_depth, max_messages=max_messages, scan=scan)
        return Batch(spec.signal, request, request.span_count(), peer=peer)
    decode = decode_json if json else decode_protobuf
    message = decode(spec, body, max_depth, max_messages)
    assert not isinstance(message, ExportTraceServiceRequest)  # traces were scanned above
    return Batch(spec.signal, message, spec.count(message), peer=peer)


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
