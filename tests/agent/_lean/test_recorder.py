"""The lean recording path produces the spans the SDK path does, through the same
provider pipeline, and honours samplers, processors and span API calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry._lean.recorder import LeanRecorder, SdkRecorder, recorder_for
from gym_telemetry._lean.span import LeanSpan, clean_value
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode


class Pipeline:
    def __init__(self, sampler: sampling.Sampler | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        kwargs: dict[str, Any] = {"resource": Resource({"service.name": "rec-test"})}
        if sampler is not None:
            kwargs["sampler"] = sampler
        self.provider = TracerProvider(shutdown_on_exit=False, **kwargs)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("gym_telemetry.verify")

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    p = Pipeline()
    yield p
    p.provider.shutdown()


def _record(recorder: LeanRecorder | SdkRecorder, attrs: dict[str, Any]) -> None:
    span, token = recorder.start("gym.verify", attrs)
    context_api.detach(token)  # type: ignore[arg-type]
    span.set_attributes({"succeeded": True})
    span.end()


def test_lean_recorder_is_chosen_for_an_sdk_tracer(pipeline: Pipeline) -> None:
    assert isinstance(recorder_for(pipeline.tracer), LeanRecorder)
    assert isinstance(recorder_for(trace.NoOpTracer()), SdkRecorder)


def test_sdk_recorder_forced_by_environment(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_vars.GYM_TELEMETRY_RECORDER, "sdk")
    assert isinstance(recorder_for(pipeline.tracer), SdkRecorder)


def test_lean_and_sdk_spans_export_the_same(pipeline: Pipeline) -> None:
    attrs = {"nemo.gym.server.name": "s", "n": 3, "tags": ("a", "b")}
    _record(recorder_for(pipeline.tracer), dict(attrs))
    _record(SdkRecorder(pipeline.tracer), dict(attrs))
    lean, sdk = pipeline.spans()
    assert isinstance(lean, LeanSpan) and not isinstance(sdk, LeanSpan)
    for field in ("name", "kind", "resource", "instrumentation_scope", "parent", "links"):
        assert getattr(lean, field) == getattr(sdk, field), field
    assert dict(lean.attributes or {}) == dict(sdk.attributes or {})
    assert lean.status.status_code is sdk.status.status_code is StatusCode.UNSET
    assert lean.context is not None and lean.context.trace_flags.sampled
    assert lean.start_time is not None and lean.end_time is not None
    assert lean.start_time <= lean.end_time
    assert lean.to_json()  # what debugging exporters call


def test_children_parent_on_the_lean_span_and_current_span_api_works(
    pipeline: Pipeline,
) -> None:
    recorder = recorder_for(pipeline.tracer)
    span, token = recorder.start("gym.rollout", {})
    try:
        current = trace.get_current_span()
        assert current is span
        current.set_attribute("added.by.handler", "yes")
        current.set_attribute("bad", {"not": "allowed"})  # type: ignore[arg-type]
        current.add_event("step", {"i": 1})
        current.update_name("gym.rollout.renamed")
        child = pipeline.tracer.start_span("child")
        child.end()
        try:
            raise KeyError("k")
        except KeyError as exc:
            current.record_exception(exc)
            current.set_status(StatusCode.ERROR, "failed")
    finally:
        context_api.detach(token)  # type: ignore[arg-type]
        span.end()
    span.set_attribute("after.end", 1)  # ignored
    child_span, parent_span = pipeline.spans()
    assert child_span.parent is not None
    assert child_span.parent.span_id == parent_span.context.span_id  # type: ignore[union-attr]
    assert child_span.context.trace_id == parent_span.context.trace_id  # type: ignore[union-attr]
    assert parent_span.name == "gym.rollout.renamed"
    assert parent_span.attributes == {"added.by.handler": "yes"}
    assert [e.name for e in parent_span.events] == ["step", "exception"]
    assert parent_span.events[1].attributes["exception.type"] == "KeyError"  # type: ignore[index]
    assert parent_span.status.status_code is StatusCode.ERROR
    assert parent_span.status.description == "failed"


def test_remote_parent_is_continued() -> None:
    p = Pipeline()
    parent = trace.SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    token = context_api.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent)))
    try:
        span, inner = recorder_for(p.tracer).start("gym.verify", {})
        context_api.detach(inner)  # type: ignore[arg-type]
        span.end()
    finally:
        context_api.detach(token)
    (done,) = p.spans()
    assert done.context.trace_id == 0xABC  # type: ignore[union-attr]
    assert done.parent == parent


@pytest.mark.parametrize("sampled_parent", [False, True])
def test_default_sampler_follows_the_parent_decision(sampled_parent: bool) -> None:
    p = Pipeline()
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled_parent else 0)
    parent = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=flags)
    token = context_api.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent)))
    try:
        span, inner = recorder_for(p.tracer).start("gym.verify", {})
        assert span.is_recording() is sampled_parent
        context_api.detach(inner)  # type: ignore[arg-type]
        span.end()
    finally:
        context_api.detach(token)
    assert len(p.spans()) == int(sampled_parent)


def test_custom_sampler_is_asked() -> None:
    off = Pipeline(sampler=sampling.ALWAYS_OFF)
    span, token = recorder_for(off.tracer).start("gym.verify", {"a": 1})
    assert not span.is_recording()
    assert trace.get_current_span().get_span_context().is_valid  # children still link up
    context_api.detach(token)  # type: ignore[arg-type]
    span.end()
    assert off.spans() == ()
    ratio = Pipeline(sampler=sampling.TraceIdRatioBased(1.0))
    span, token = recorder_for(ratio.tracer).start("gym.verify", {})
    context_api.detach(token)  # type: ignore[arg-type]
    span.end()
    assert len(ratio.spans()) == 1


def test_processors_with_start_hooks_are_called() -> None:
    p = Pipeline()
    seen: list[str] = []

    class Hooked(SpanProcessor):
        def on_start(self, span: Span, parent_context: Any = None) -> None:
            span.set_attribute("stamped", True)
            seen.append("start")

        def on_end(self, span: ReadableSpan) -> None:
            seen.append("end")

    p.provider.add_span_processor(Hooked())
    span, token = recorder_for(p.tracer).start("gym.verify", {})
    context_api.detach(token)  # type: ignore[arg-type]
    span.end()
    assert seen == ["start", "end"]
    assert p.spans()[0].attributes == {"stamped": True}


def test_clean_value() -> None:
    assert clean_value("x") == "x"
    assert clean_value([1, 2]) == (1, 2)
    assert clean_value([1, "a"]) is None
    assert clean_value(b"bytes") is None
    assert clean_value(None) is None
    assert clean_value({"a": 1}) is None
