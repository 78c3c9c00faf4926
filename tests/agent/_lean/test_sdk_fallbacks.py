"""A new OpenTelemetry SDK release must never silently break span export.

The lean paths read private SDK fields. Each one checks itself against the installed
SDK first and falls back to the stock SDK path. These tests simulate the SDK changing
under each of them (the way a release would: a field renamed, an accessor reading
something new, a step with another contract) and show that spans are still exported,
through the stock path, to a real OTLP/gRPC sink.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

import pytest
from gym_telemetry._export.processor import GymSpanProcessor, batch_queue
from gym_telemetry._lean import grpc_exporter, span_encoding
from gym_telemetry._lean import recorder as recording
from gym_telemetry._lean.recorder import LeanRecorder, SdkRecorder, recorder_for
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.sink import RecordingSink


@pytest.fixture(autouse=True)
def fresh_checks() -> Iterator[None]:
    """Forget the cached self-check results before and after each test."""
    recording._layout_checked.clear()
    grpc_exporter._check_result.clear()
    yield
    recording._layout_checked.clear()
    grpc_exporter._check_result.clear()


def _attributes_read_from_a_new_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if a release stored finished attributes in a new private field that its
    ``ReadableSpan.__init__`` sets and its ``attributes`` accessor reads."""
    original_init = ReadableSpan.__init__

    def init(self: ReadableSpan, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self._attributes_v2 = self._attributes  # type: ignore[attr-defined]

    monkeypatch.setattr(ReadableSpan, "__init__", init)
    monkeypatch.setattr(ReadableSpan, "attributes", property(lambda s: s._attributes_v2))


def _status_read_differently(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if a release's ``status`` accessor read a field the SDK span keeps in step but
    the lean span does not know about (same field names, different meaning)."""
    monkeypatch.setattr(
        ReadableSpan,
        "status",
        property(lambda s: s.__dict__.get("_status_v2", s._status)),
    )
    original_set_status = recording.sdk_trace.Span.set_status

    def set_status(self: Any, status: Any, description: str | None = None) -> None:
        original_set_status(self, status, description)
        self._status_v2 = self._status

    monkeypatch.setattr(recording.sdk_trace.Span, "set_status", set_status)
    original_end = recording.sdk_trace.Span.end

    def end(self: Any, end_time: int | None = None) -> None:
        self._status_v2 = type(self._status)(self._status.status_code, "v2")
        original_end(self, end_time)

    monkeypatch.setattr(recording.sdk_trace.Span, "end", end)


@pytest.mark.parametrize(
    "change",
    [_attributes_read_from_a_new_field, _status_read_differently],
    ids=lambda f: f.__name__,
)
def test_a_changed_span_layout_selects_the_sdk_recorder(
    monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("gym_telemetry.verify")
    assert isinstance(recorder_for(tracer), LeanRecorder)  # the unchanged SDK passes
    recording._layout_checked.clear()

    change(monkeypatch)
    recorder = recorder_for(tracer)
    assert isinstance(recorder, SdkRecorder)
    span, token = recorder.start("gym.verify", {"succeeded": True})
    recording.context_api.detach(token)  # type: ignore[arg-type]
    span.end()
    (exported,) = memory.get_finished_spans()
    assert exported.name == "gym.verify"
    assert dict(exported.attributes or {}) == {"succeeded": True}


def test_a_changed_encoding_step_selects_the_stock_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if a release's exporter handed its encoding step's result to the wire as bytes.
    def serialized(self: Any, data: Any) -> bytes:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        return bytes(encode_spans(data).SerializeToString())

    monkeypatch.setattr(OTLPSpanExporter, "_translate_data", serialized)
    assert not grpc_exporter.self_check()
    exporter = grpc_exporter.make_grpc_exporter("127.0.0.1:1", insecure=True)
    try:
        assert type(exporter) is OTLPSpanExporter
    finally:
        exporter.shutdown()


def test_an_encoding_step_that_needs_the_instance_selects_the_stock_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def needs_self(self: Any, data: Any) -> Any:
        return self._encoder(data)

    monkeypatch.setattr(OTLPSpanExporter, "_translate_data", needs_self)
    assert not grpc_exporter.self_check()


def test_a_changed_batch_queue_is_left_to_the_sdk() -> None:
    class Inner:
        def __init__(self, queue: Any, bound: Any) -> None:
            self._queue, self._max_queue_size = queue, bound

    class Processor:
        def __init__(self, queue: Any, bound: Any) -> None:
            self._batch_processor = Inner(queue, bound)

    deque: collections.deque[int] = collections.deque(maxlen=8)
    assert batch_queue(Processor(deque, 8)) == (deque, 8)  # type: ignore[arg-type]
    assert batch_queue(Processor([], 8)) == (None, 0)  # type: ignore[arg-type]
    assert batch_queue(Processor(deque, "8")) == (None, 0)  # type: ignore[arg-type]
    assert batch_queue(Processor(collections.deque(maxlen=4), 8)) == (None, 0)  # type: ignore[arg-type]


def test_a_queue_that_breaks_does_not_cost_the_span_its_export() -> None:
    memory = InMemorySpanExporter()
    switch = GymSpanProcessor()
    switch.plug(SimpleSpanProcessor(memory))  # type: ignore[arg-type]

    class Broken:
        def __len__(self) -> int:
            raise TypeError("not a deque any more")

    switch._queue, switch._max_queue = Broken(), 1
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(switch)
    provider.get_tracer("t").start_span("s").end()
    assert [s.name for s in memory.get_finished_spans()] == ["s"]


def test_every_lean_path_refused_still_exports_to_a_real_sink(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _attributes_read_from_a_new_field(monkeypatch)  # the recorder's check fails
    monkeypatch.setattr(span_encoding, "encode_request", lambda spans: b"\xff")  # the encoder's
    with RecordingSink() as sink:
        exporter = grpc_exporter.make_grpc_exporter(sink.endpoint, insecure=True)
        assert type(exporter) is OTLPSpanExporter
        provider = TracerProvider(shutdown_on_exit=False)
        batch = BatchSpanProcessor(exporter, schedule_delay_millis=50)
        switch = GymSpanProcessor()
        switch.plug(batch)
        provider.add_span_processor(switch)
        recorder = recorder_for(provider.get_tracer("gym_telemetry.verify"))
        assert isinstance(recorder, SdkRecorder)
        span, token = recorder.start("gym.verify", {"succeeded": True})
        recording.context_api.detach(token)  # type: ignore[arg-type]
        span.end()
        assert sink.wait_spans(1)
        provider.shutdown()
        (recorded,) = sink.spans()
        assert recorded.span.name == "gym.verify"
        assert recorded.attributes["succeeded"] is True


def test_the_recorder_check_ignores_the_environment_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The check's own SDK span must record even when the process samples nothing.
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("gym_telemetry.verify")
    assert isinstance(recorder_for(tracer), LeanRecorder)
