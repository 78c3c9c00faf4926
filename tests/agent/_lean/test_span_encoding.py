"""The lean span encoder sends what the stock OTLP encoder sends: same message for every
span shape, stock fallback for what it refuses, bounded caches, and a real gRPC export
to a recording sink."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry._lean import grpc_exporter, otlp_wire, span_encoding
from gym_telemetry._lean.probes import probe_spans
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext

from testkit.sink import RecordingSink


def _lean(spans: list[ReadableSpan]) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(span_encoding.encode_request(spans))


def _raw(**attributes: Any) -> ReadableSpan:
    return ReadableSpan(
        "raw",
        context=SpanContext(1, 2, is_remote=False),
        resource=Resource({"service.name": "t"}),
        attributes=attributes,
        start_time=1,
        end_time=2,
    )


@pytest.fixture
def fresh_check() -> Iterator[None]:
    """Forget the cached self-check result before and after the test."""
    grpc_exporter._check_result.clear()
    yield
    grpc_exporter._check_result.clear()


def test_probe_spans_encode_exactly_as_the_stock_encoder() -> None:
    spans = probe_spans()
    kinds = {type(s).__name__ for s in spans}
    assert {"ReadableSpan", "LeanSpan", "_RenamingSpan"} <= kinds
    expected = encode_spans(spans)
    assert len(expected.resource_spans) == 2  # equal resources grouped, as the SDK does
    assert _lean(spans) == expected


@pytest.mark.parametrize("start", range(0, 13, 3))
def test_every_slice_of_the_probes_encodes_as_the_stock_encoder(start: int) -> None:
    # Different first spans change the group order and which caches are warm.
    spans = probe_spans()[start:] + probe_spans()[:start]
    assert _lean(spans) == encode_spans(spans)


def test_empty_batch() -> None:
    assert span_encoding.encode_request([]) == b""
    assert _lean([]) == encode_spans([])


@pytest.mark.parametrize(
    "value",
    [2**63, -(2**63) - 1, "\ud800", object(), {"k": object()}],
    ids=["above-int64", "below-int64", "lone-surrogate", "object", "object-in-map"],
)
def test_values_the_stock_encoder_skips_are_refused(value: Any) -> None:
    with pytest.raises(ValueError):
        span_encoding.encode_request([_raw(bad=value)])


def test_refused_batch_goes_through_the_stock_encoder_and_is_counted() -> None:
    spans = [_raw(ok=1, bad=2**64)]
    before = grpc_exporter.STATS.fallbacks
    request = grpc_exporter.translate(spans)
    assert grpc_exporter.STATS.fallbacks == before + 1
    # what the stock exporter itself would have sent: the bad attribute skipped
    assert request == encode_spans(spans)
    assert [kv.key for kv in request.resource_spans[0].scope_spans[0].spans[0].attributes] == ["ok"]


def test_key_cache_stays_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp_wire, "MAX_CACHED_KEYS", 8)
    spans = [_raw(**{f"key{i}": i, "s": "v"}) for i in range(50)]
    assert _lean(spans) == encode_spans(spans)
    assert len(otlp_wire.KEY_PREFIXES) <= 8


def test_block_cache_stays_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_encoding, "MAX_CACHED_BLOCKS", 4)
    spans = [
        ReadableSpan(
            "s",
            context=SpanContext(1, i + 1, is_remote=False),
            resource=Resource({"service.name": f"svc{i}"}),
            start_time=1,
            end_time=2,
        )
        for i in range(20)
    ]
    assert _lean(spans) == encode_spans(spans)
    assert len(span_encoding._blocks) <= 4


def test_self_check_passes_on_the_installed_sdk(fresh_check: None) -> None:
    assert grpc_exporter.self_check()


def test_a_failed_self_check_selects_the_stock_exporter(
    fresh_check: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(span_encoding, "encode_request", lambda spans: b"")
    assert not grpc_exporter.self_check()
    exporter = grpc_exporter.make_grpc_exporter("127.0.0.1:1", insecure=True)
    try:
        assert type(exporter) is OTLPSpanExporter
    finally:
        exporter.shutdown()


def test_environment_forces_the_stock_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_vars.GYM_TELEMETRY_ENCODER, "sdk")
    exporter = grpc_exporter.make_grpc_exporter("127.0.0.1:1", insecure=True)
    try:
        assert type(exporter) is OTLPSpanExporter
    finally:
        exporter.shutdown()


def test_lean_exporter_delivers_the_stock_message_over_grpc() -> None:
    spans = probe_spans()
    with RecordingSink() as sink:
        exporter = grpc_exporter.make_grpc_exporter(sink.endpoint, insecure=True)
        try:
            assert type(exporter) is not OTLPSpanExporter
            assert isinstance(exporter, OTLPSpanExporter)
            before = grpc_exporter.STATS.batches
            assert exporter.export(spans) is SpanExportResult.SUCCESS
            assert grpc_exporter.STATS.batches == before + 1
        finally:
            exporter.shutdown()
        assert sink.requests["traces"] == [encode_spans(spans)]
