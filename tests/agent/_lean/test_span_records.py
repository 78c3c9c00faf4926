"""Span records: a span queued for export as its OTLP bytes (plain ``bytes``, never tracked
by the cyclic GC) instead of the span object. The exported message stays the stock
encoder's; spans the lean encoder refuses, unsampled spans and exporters that do not take
records keep the old path; a Gym-style request leaves no span object alive."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from gym_telemetry._export.processor import GymSpanProcessor, TrackingExporter
from gym_telemetry._lean import grpc_exporter, span_encoding
from gym_telemetry._lean import recorder as recording
from gym_telemetry._lean.otlp_wire import UnsupportedValue
from gym_telemetry._lean.probes import probe_spans
from gym_telemetry._lean.recorder import LeanRecorder, recorder_for
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags

from testkit.sink import RecordingSink

REPO_ROOT = Path(__file__).resolve().parents[3]


def _parse(data: bytes) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(data)


def _triples(request: ExportTraceServiceRequest) -> list[tuple[bytes, bytes, bytes]]:
    """(resource, scope, span) of every span, as serialized messages, sorted: the content
    of a request regardless of how its blocks are grouped."""
    out = []
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append(
                    (
                        rs.resource.SerializeToString(deterministic=True),
                        ss.scope.SerializeToString(deterministic=True),
                        span.SerializeToString(deterministic=True),
                    )
                )
    return sorted(out)


def test_records_are_plain_bytes_the_gc_never_tracks() -> None:
    for span in probe_spans():
        record = span_encoding.encode_record(span)
        assert record is not None and type(record) is bytes
        assert span_encoding.is_record(record) and not gc.is_tracked(record)
        assert not span_encoding.is_record(span)


@pytest.mark.parametrize("start", range(0, 13, 4))
def test_records_and_spans_mixed_encode_as_the_stock_encoder(start: int) -> None:
    spans = probe_spans()[start:] + probe_spans()[:start]
    expected = encode_spans(spans)
    records = [span_encoding.encode_record(s) for s in spans]
    assert _parse(span_encoding.encode_request(records)) == expected  # type: ignore[arg-type]
    mixed = [r if i % 2 else s for i, (s, r) in enumerate(zip(spans, records, strict=True))]
    assert _parse(span_encoding.encode_request(mixed)) == expected  # type: ignore[arg-type]


def test_a_refused_span_is_not_a_record() -> None:
    span = ReadableSpan(
        "raw",
        context=SpanContext(1, 2, is_remote=False),
        resource=Resource({"service.name": "t"}),
        attributes={"bad": 2**64},
        start_time=1,
        end_time=2,
    )
    with pytest.raises(UnsupportedValue):
        span_encoding.encode_record(span)


def test_a_full_source_registry_keeps_the_span(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_encoding, "MAX_RECORD_SOURCES", len(span_encoding._sources))
    span = ReadableSpan(
        "s",
        context=SpanContext(1, 2, is_remote=False),
        resource=Resource({"service.name": "not-registered-yet"}),
        start_time=1,
        end_time=2,
    )
    assert span_encoding.encode_record(span) is None


def test_a_batch_falling_back_to_the_stock_encoder_keeps_its_records() -> None:
    good = probe_spans()[:4]
    bad = ReadableSpan(
        "refused",
        context=SpanContext(1, 9, is_remote=False),
        resource=Resource({"service.name": "t"}),
        attributes={"ok": 1, "bad": 2**64},
        start_time=1,
        end_time=2,
    )
    batch = [span_encoding.encode_record(s) for s in good] + [bad]
    before = grpc_exporter.STATS.fallbacks
    request = grpc_exporter.translate(batch)  # type: ignore[arg-type]
    assert grpc_exporter.STATS.fallbacks == before + 1
    # the stock encoder's message for every span: the bad attribute skipped, nothing lost
    assert _triples(request) == _triples(encode_spans([*good, bad]))


class _Memory(SpanExporter):
    """Keeps the batches it is given (records included) and the translated requests."""

    accepts_span_records = True

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.batches.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    yield provider
    provider.shutdown()


def _switch(exporter: SpanExporter, provider: TracerProvider) -> tuple[GymSpanProcessor, Any]:
    batch = BatchSpanProcessor(exporter, schedule_delay_millis=60_000)
    switch = GymSpanProcessor()
    switch.plug(batch, TrackingExporter(exporter))
    provider.add_span_processor(switch)
    return switch, batch


def test_the_processor_queues_records_for_an_exporter_that_takes_them(
    provider: TracerProvider,
) -> None:
    memory = _Memory()
    switch, batch = _switch(memory, provider)
    recorder = recorder_for(provider.get_tracer("gym_telemetry.verify"))
    assert isinstance(recorder, LeanRecorder)
    span, token = recorder.start("gym.verify", {"succeeded": True})
    recording.context_api.detach(token)  # type: ignore[arg-type]
    span.end()
    provider.get_tracer("other").start_span("sdk-span").end()
    assert switch.records == 2
    assert batch.force_flush()
    (queued,) = memory.batches
    assert [type(item) for item in queued] == [bytes, bytes]


def test_records_are_not_used_for_an_exporter_that_does_not_take_them(
    provider: TracerProvider,
) -> None:
    memory = InMemorySpanExporter()
    switch, batch = _switch(memory, provider)
    provider.get_tracer("t").start_span("s").end()
    assert switch.records == 0
    assert batch.force_flush()
    assert [s.name for s in memory.get_finished_spans()] == ["s"]


def test_a_span_the_encoder_refuses_is_queued_as_itself(provider: TracerProvider) -> None:
    memory = _Memory()
    switch, batch = _switch(memory, provider)
    refused = ReadableSpan(
        "refused",
        context=SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
        resource=Resource({"service.name": "t"}),
        attributes={"bad": 2**64},
        start_time=1,
        end_time=2,
    )
    switch.on_end(refused)
    assert (switch.records, switch.record_failures) == (0, 1)
    assert batch.force_flush()
    assert memory.batches == [[refused]]


def test_a_failing_queue_step_never_reaches_the_span(provider: TracerProvider) -> None:
    switch, _batch = _switch(_Memory(), provider)

    def broken(item: object) -> None:
        raise RuntimeError("queue changed")

    switch._emit = broken
    provider.get_tracer("t").start_span("s").end()  # does not raise
    assert switch.records == 0


def test_an_unsampled_recording_span_is_not_queued() -> None:
    provider = TracerProvider(
        sampler=sampling.StaticSampler(sampling.Decision.RECORD_ONLY), shutdown_on_exit=False
    )
    memory = _Memory()
    switch, batch = _switch(memory, provider)
    span = provider.get_tracer("t").start_span("record-only")
    assert span.is_recording()
    span.end()
    assert batch.force_flush()
    assert switch.records == 0 and memory.batches == []
    provider.shutdown()


def test_recorded_spans_reach_a_real_grpc_sink_as_the_stock_message(
    provider: TracerProvider,
) -> None:
    ended = InMemorySpanExporter()  # sees the same ended spans, as the stock path would
    provider.add_span_processor(SimpleSpanProcessor(ended))
    with RecordingSink() as sink:
        exporter = grpc_exporter.make_grpc_exporter(sink.endpoint, insecure=True)
        switch, batch = _switch(exporter, provider)
        recorder = recorder_for(provider.get_tracer("gym_telemetry.server"))
        assert isinstance(recorder, LeanRecorder)
        for i in range(5):
            span, token = recorder.start("POST", {"http.request.method": "POST", "i": i})
            child = provider.get_tracer("gym_telemetry.verify").start_span(
                "gym.verify", attributes={"succeeded": True}
            )
            child.add_event("e", {"k": "v"})
            child.end()
            recording.context_api.detach(token)  # type: ignore[arg-type]
            span.set_attribute("http.response.status_code", 200)
            span.end()
        assert switch.records == 10
        assert batch.force_flush()
        assert sink.wait_for(lambda: len(sink.requests["traces"]) == 1)
        assert sink.requests["traces"] == [encode_spans(ended.get_finished_spans())]


def test_a_gym_style_request_leaves_no_span_alive() -> None:
    """``bench/agent_allocations.py``'s in-process Gym-style ``/verify`` app with the
    SERVER and ``gym.verify`` spans on: GC-tracked objects still alive per request with
    every span still queued. Each span object kept alive until export would add at least
    one (it was 5.1: two spans and three span contexts)."""
    from bench.agent_allocations import _CHILD

    result = subprocess.run(
        [sys.executable, "-c", _CHILD, "default,verify"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO_ROOT,
    )
    match = re.search(
        r"([\d.]+) spans/req .*?([\d.]+) survivors/req .*?([\d.]+) promoted/req", result.stdout
    )
    assert match, result.stdout + result.stderr
    spans, survivors, promoted = float(match[1]), float(match[2]), float(match[3])
    assert spans == 2.0, result.stdout  # the SERVER span and gym.verify, both queued
    assert survivors <= 1.0, result.stdout
    assert promoted <= 1.0, result.stdout


def test_a_forked_child_registers_sources_with_a_fresh_lock() -> None:
    import os
    import signal

    span = ReadableSpan(
        "s",
        context=SpanContext(1, 2, is_remote=False),
        resource=Resource({"service.name": "forked-child"}),
        start_time=1,
        end_time=2,
    )
    with span_encoding._sources_lock[0]:  # held while forking, as another thread might
        pid = os.fork()
        if pid == 0:  # child: registering must not wait for the parent's lock
            signal.alarm(60)  # a deadlocked child dies instead of hanging the test
            os._exit(0 if span_encoding.encode_record(span) is not None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
