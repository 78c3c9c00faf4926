"""The OTLP/gRPC span exporter this package plugs in: the SDK exporter with a leaner
batch encoder.

``make_grpc_exporter(endpoint, insecure)`` returns the SDK's ``OTLPSpanExporter``
(same channel, retries, timeout, headers, compression, TLS, ``OTEL_EXPORTER_OTLP_*``
handling) whose per-batch encoding step is ``gym_telemetry._lean.span_encoding``: the batch is
written straight to OTLP bytes and parsed once by the protobuf runtime (C), instead of
being built as Python protobuf objects span by span (see that module for the figures).

The lean encoder is used only when

- ``GYM_TELEMETRY_ENCODER`` is not ``sdk`` (that value forces the stock encoder),
- the installed exporter has the ``_translate_data`` step it replaces, and
- ``self_check()`` passed: probe spans of every shape (events, links, remote parent,
  status, arrays, maps, a foreign span class) encode to exactly what the stock
  ``encode_spans`` produces with the installed SDK.

A batch the lean encoder refuses (``UnsupportedValue``: a value the stock encoder logs
and skips, an out-of-range integer) or fails on is encoded by the stock encoder
instead and counted (``LeanEncodingStats.fallbacks``), so what reaches the sidecar is
always what the stock exporter would have sent.

The request goes out as the lean encoder wrote it: the exporter's gRPC stub is
``BytesTraceStub``, which sends bytes, instead of the generated stub, which serializes a
message (so a batch is neither parsed into a message nor serialized again). Where the
installed exporter has no ``_channel`` / ``_client`` to put it on, the message is built
and sent the stock way.

This exporter takes span records (``span_encoding.encode_record``: a span already
encoded when it ended, queued as plain bytes by ``GymSpanProcessor``) in a batch in
place of spans. They encode to the same message; in a batch that falls back to the
stock encoder, the records (never refused themselves) follow the stock encoder's
blocks as their own ResourceSpans blocks.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from gym_telemetry import environment_variables as env_vars
from gym_telemetry._lean import span_encoding

_log = logging.getLogger(__name__)


class LeanEncodingStats:
    """Batches encoded by the lean encoder, and batches that fell back to the stock one
    (process-wide; plain int increments from the exporter's worker thread)."""

    __slots__ = ("batches", "fallbacks")

    def __init__(self) -> None:
        self.batches = 0
        self.fallbacks = 0


STATS: Final = LeanEncodingStats()
_check_lock = threading.Lock()
_check_result: list[bool] = []


def lean_encoding_requested() -> bool:
    """False when ``GYM_TELEMETRY_ENCODER=sdk``."""
    return os.environ.get(env_vars.GYM_TELEMETRY_ENCODER, "").strip().lower() != "sdk"


def translate(spans: Sequence[ReadableSpan | bytes]) -> Any:
    """``spans`` (spans, or the span records ``GymSpanProcessor`` queues in their place)
    as an ``ExportTraceServiceRequest``: lean-encoded, or by the stock ``encode_spans``
    when the lean encoder refuses the batch. Raises only what the stock encoder
    raises."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    try:
        request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(spans))
    except Exception as exc:  # refused or failed: the stock encoder decides
        STATS.fallbacks += 1
        if STATS.fallbacks == 1 or STATS.fallbacks % 1000 == 0:
            _log.info(
                "gym_telemetry: batch encoded by the stock encoder (%r; %d so far)",
                exc,
                STATS.fallbacks,
            )
        return _stock_request(spans, encode_spans)
    STATS.batches += 1
    return request


def translate_bytes(spans: Sequence[ReadableSpan | bytes]) -> bytes:
    """``translate`` as the serialized message: the lean encoder's bytes as they are (no
    parse into a message and serialization back, which the gRPC stub would otherwise do
    per batch), or the stock encoder's message serialized."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    try:
        data = span_encoding.encode_request(spans)
    except Exception as exc:  # refused or failed: the stock encoder decides
        STATS.fallbacks += 1
        if STATS.fallbacks == 1 or STATS.fallbacks % 1000 == 0:
            _log.info(
                "gym_telemetry: batch encoded by the stock encoder (%r; %d so far)",
                exc,
                STATS.fallbacks,
            )
        serialized: bytes = _stock_request(spans, encode_spans).SerializeToString()
        return serialized
    STATS.batches += 1
    return data


class BytesTraceStub:
    """The OTLP trace service stub, sending an already serialized request (``bytes``)."""

    def __init__(self, channel: Any) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceResponse,
        )

        self.Export = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None,  # the request is already bytes
            response_deserializer=ExportTraceServiceResponse.FromString,
        )


def _stock_request(batch: Sequence[ReadableSpan | bytes], encode_spans: Any) -> Any:
    """The stock encoder's message for the spans of ``batch``; its span records (already
    lean-encoded, so never refused) follow as their own ResourceSpans blocks."""
    records = [item for item in batch if span_encoding.is_record(item)]
    if not records:
        return encode_spans(batch)
    request = encode_spans([item for item in batch if not span_encoding.is_record(item)])
    request.MergeFromString(span_encoding.encode_request(records))
    return request


def self_check() -> bool:
    """Whether the lean encoder reproduces ``encode_spans`` on the installed SDK, for
    probe spans of every shape (computed once per process; never raises)."""
    with _check_lock:
        if not _check_result:
            _check_result.append(_run_self_check())
        return _check_result[0]


def _run_self_check() -> bool:
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        from gym_telemetry._lean.probes import probe_spans

        spans = probe_spans()
        lean = ExportTraceServiceRequest.FromString(span_encoding.encode_request(spans))
        if lean != encode_spans(spans):
            _log.info("gym_telemetry: lean span encoder differs here; using the stock one")
            return False
        records = [span_encoding.encode_record(span) or span for span in spans]
        as_records = span_encoding.encode_request(records)
        if ExportTraceServiceRequest.FromString(as_records) != lean:
            _log.info("gym_telemetry: span records encode differently here; stock encoder")
            return False
        # The step the lean exporter overrides must still be "spans in, the stock
        # encoder's message out" on this SDK; anything else (renamed, another signature,
        # another return type, needs the instance) keeps the stock exporter.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        stock_step = getattr(OTLPSpanExporter, "_translate_data", None)
        if not callable(stock_step) or stock_step(None, spans) != lean:
            _log.info("gym_telemetry: the SDK exporter's encoding step changed; stock encoder")
            return False
        return True
    except Exception as exc:  # any surprise: the stock encoder
        _log.info("gym_telemetry: lean span encoder self-check failed (%r)", exc)
        return False


_lean_class: list[type[SpanExporter]] = []


def _lean_exporter_class() -> type[SpanExporter] | None:
    """The SDK's gRPC span exporter with ``_translate_data`` replaced, or None when the
    installed exporter has no such step."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if not callable(getattr(OTLPSpanExporter, "_translate_data", None)):
        return None
    if not _lean_class:

        class LeanOTLPSpanExporter(OTLPSpanExporter):
            """``OTLPSpanExporter`` encoding its batches with ``translate``; its batches
            may hold span records (``GymSpanProcessor``). Its stub sends the lean
            encoder's bytes as they are (``BytesTraceStub``), also after the exporter
            re-creates its channel (it builds the stub from ``_stub``)."""

            accepts_span_records = True

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                channel = getattr(self, "_channel", None)
                if channel is not None and getattr(self, "_client", None) is not None:
                    self._stub = BytesTraceStub
                    self._client = BytesTraceStub(channel)  # type: ignore[assignment]

            def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
                if isinstance(getattr(self, "_client", None), BytesTraceStub):
                    return translate_bytes(data)
                return translate(data)

        _lean_class.append(LeanOTLPSpanExporter)
    return _lean_class[0]


def make_grpc_exporter(endpoint: str, insecure: bool | None) -> SpanExporter:
    """An OTLP/gRPC span exporter to ``endpoint`` (module docstring for which encoder).
    Does no network I/O (the channel connects lazily)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    cls: type[SpanExporter] = OTLPSpanExporter
    if lean_encoding_requested() and self_check():
        cls = _lean_exporter_class() or OTLPSpanExporter
    exporter: SpanExporter = cls(endpoint=endpoint, insecure=insecure)  # type: ignore[call-arg]
    return exporter
