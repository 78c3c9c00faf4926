"""The lean path's straight lines must do exactly what the public API and the general path
do: the runtime context reached directly, span contexts built and read as tuples, the
recorder's fast start against its general one, a lean span's record written in one pass
(and the memo of attribute fields behind it), the batch queue appended to directly, a
lean span's one-call writers and its W3C headers, the exporter's bytes stub."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import pytest
from gym_telemetry._export.processor import GymSpanProcessor, TrackingExporter
from gym_telemetry._lean import context as lean_context
from gym_telemetry._lean import grpc_exporter, otlp_wire, sdk_hooks, span_encoding
from gym_telemetry._lean.otlp_wire import UnsupportedValue, key_value, len_prefixed
from gym_telemetry._lean.recorder import LeanRecorder, _parent_context, recorder_for
from gym_telemetry._lean.span import MAX_ATTRIBUTES, LeanSpan, clean_value
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import DEFAULT_TRACE_STATE, TraceState


@pytest.fixture(autouse=True)
def _context_restored() -> Iterator[None]:
    """Every test leaves the current context as it found it (a span left current would
    leak into the tests after it)."""
    before = context_api.get_current()
    yield
    assert context_api.get_current() is before


# --- the runtime context and span contexts ------------------------------------------------


def test_the_installed_api_takes_the_direct_paths() -> None:
    assert lean_context.TUPLE_LAYOUT
    assert lean_context.get_current is not context_api.get_current


def test_the_direct_context_is_the_apis() -> None:
    span = trace_api.NonRecordingSpan(SpanContext(1, 2, False))
    token = lean_context.attach(lean_context.with_span(span, context_api.Context()))
    try:
        assert context_api.get_current() is lean_context.get_current()
        assert trace_api.get_current_span() is span
    finally:
        lean_context.detach(token)
    assert trace_api.get_current_span() is not span
    token = context_api.attach(trace_api.set_span_in_context(span))
    try:
        assert lean_context.get_current() is context_api.get_current()
    finally:
        context_api.detach(token)


def test_with_span_is_the_apis_set_value() -> None:
    span = trace_api.NonRecordingSpan(SpanContext(1, 2, False))
    base = context_api.set_value("other", 5, context_api.Context())
    direct = lean_context.with_span(span, base)
    stock = trace_api.set_span_in_context(span, base)
    assert type(direct) is type(stock) and direct == stock
    assert direct is not base and "current-span" not in base  # the base is unchanged
    assert trace_api.get_current_span(direct) is span and direct.get("other") == 5


def test_a_second_detach_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    token = lean_context.attach(context_api.Context())
    lean_context.detach(token)
    lean_context.detach(token)  # ContextVar.reset refuses a used token: logged, as the API does
    assert "Failed to detach context" in caplog.text


@pytest.mark.parametrize("remote", [True, False])
@pytest.mark.parametrize("state", [DEFAULT_TRACE_STATE, TraceState([("k", "v")])])
def test_span_contexts_built_directly_equal_the_apis(remote: bool, state: TraceState) -> None:
    flags = TraceFlags(1)
    built = lean_context.span_context(7, 9, remote, flags, state)
    stock = SpanContext(7, 9, remote, flags, state)
    assert type(built) is SpanContext and built == stock
    assert (built.trace_id, built.span_id, built.is_remote, built.is_valid) == (7, 9, remote, True)
    assert built.trace_flags is flags and built.trace_state is state


# --- a lean span's record ------------------------------------------------------------------


class _Queue(SpanExporter):
    accepts_span_records = True

    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


@pytest.fixture
def lean() -> Iterator[tuple[TracerProvider, GymSpanProcessor]]:
    provider = TracerProvider(resource=Resource({"service.name": "fast-paths"}))
    switch = GymSpanProcessor()
    exporter = TrackingExporter(_Queue())
    switch.plug(BatchSpanProcessor(exporter, schedule_delay_millis=60_000), exporter)
    provider.add_span_processor(switch)
    yield provider, switch
    switch.shutdown()


def _recorder(provider: TracerProvider, group: str) -> LeanRecorder:
    recorder = recorder_for(provider.get_tracer(f"gym_telemetry.{group}"))
    assert isinstance(recorder, LeanRecorder) and recorder.fast
    return recorder


def _queued(switch: GymSpanProcessor) -> list[Any]:
    queue, _bound = sdk_hooks.batch_queue(switch.delegate)  # type: ignore[arg-type]
    return list(reversed(queue))  # oldest first


def _spans_of_every_shape(provider: TracerProvider) -> list[LeanSpan]:
    server = _recorder(provider, "server")
    verify = _recorder(provider, "verify")
    remote = SpanContext(0xABC, 0xDEF, True, TraceFlags(1), DEFAULT_TRACE_STATE)
    stated = SpanContext(0xABC, 0xDEE, True, TraceFlags(1), TraceState([("v", "1")]))
    out: list[LeanSpan] = []
    for parent in (remote, stated, None):
        span, token = server.start_under(
            "POST",
            {"http.request.method": "POST", "nemo.gym.rollout.id": "1-0"},
            SpanKind.SERVER,
            parent,
        )
        inner, inner_token = verify.start(
            "gym.verify",
            {
                "server": "w",
                "nemo.gym.rollout.id": "1-0",
                "n": 1,
                "f": 1.5,
                "flag": True,
                "one": 1,
                "tuple": ("a", "b"),
                "grüße": "ünïcode",
                "long": "x" * 300,
            },
        )
        lean_context.detach(inner_token)
        assert isinstance(inner, LeanSpan)
        inner.end_with({"succeeded": True, "again": 1})
        lean_context.detach(token)
        assert isinstance(span, LeanSpan)
        span.add_event("e", {"x": 1})
        span.add_link(SpanContext(5, 6, False))
        span.end_with(
            {"http.route": "/verify", "http.response.status_code": 500}, "POST /verify", error=True
        )
        out += [inner, span]
    odd, token = verify.start("odd", {"map": 1})
    lean_context.detach(token)
    assert isinstance(odd, LeanSpan)
    odd.set_status(Status(StatusCode.ERROR, "broken"))
    odd.end()
    evented, token = verify.start("evented", {"k": "v"})  # an event alone, then ended
    lean_context.detach(token)
    evented.add_event("only", {"n": 2}, timestamp=5)
    evented.end_with({"done": True})
    linked, token = verify.start("linked", {})  # a link alone
    lean_context.detach(token)
    linked.add_link(SpanContext(7, 8, True, TraceFlags(1)), {"why": "x"})
    linked.end()
    ok, token = verify.start("ok", {})  # an OK status alone
    lean_context.detach(token)
    ok.set_status(Status(StatusCode.OK))
    ok.end_with(None, None, error=True)
    return [*out, odd, evented, linked, ok]


def test_lean_records_are_the_general_records(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, switch = lean
    spans = _spans_of_every_shape(provider)
    records = _queued(switch)
    assert len(records) == len(spans) and all(type(r) is bytes for r in records)
    assert records == [span_encoding.encode_record(s) for s in spans]
    assert switch.records == len(spans) and switch.record_failures == 0
    request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(records))
    assert request == encode_spans(spans)


def test_true_one_and_one_point_zero_keep_their_types(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, switch = lean
    verify = _recorder(provider, "verify")
    spans = []
    for value in (True, 1, 1.0, 1, True, 0, False, 0.0):
        span, token = verify.start("v", {"k": value})
        lean_context.detach(token)
        span.end()
        spans.append(span)
    request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(_queued(switch)))
    assert request == encode_spans(spans)


def test_a_second_processor_gets_the_span_too(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    """The direct hand-over to the one processor stops as soon as there are two."""
    provider, switch = lean
    verify = _recorder(provider, "verify")
    span, token = verify.start("first", {})
    lean_context.detach(token)
    span.end()
    assert verify.direct_end is not None
    seen: list[ReadableSpan] = []

    class Seeing(BatchSpanProcessor):  # a quiet processor class, so hooks stay skipped
        def on_end(self, span: ReadableSpan) -> None:
            seen.append(span)

    extra = Seeing(_Queue(), schedule_delay_millis=60_000)
    provider.add_span_processor(extra)
    try:
        second, token = verify.start("second", {})
        lean_context.detach(token)
        second.end_with({"k": 1})
        assert seen == [second]
        assert [r[1:] for r in _queued(switch)] == [
            span_encoding.encode_span(s) for s in (span, second)
        ]
    finally:
        extra.shutdown()


def test_a_span_the_fast_encoder_refuses_is_queued_as_itself(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, switch = lean
    span, token = _recorder(provider, "verify").start("big", {"n": 2**70})
    lean_context.detach(token)
    span.end()
    assert _queued(switch) == [span] and switch.record_failures == 1


def test_a_record_of_any_size_round_trips(lean: tuple[TracerProvider, GymSpanProcessor]) -> None:
    """Span messages below and above the precomputed ``ScopeSpans.spans`` prefixes."""
    provider, switch = lean
    verify = _recorder(provider, "verify")
    spans = []
    for size in (*range(940, 960), 70_000):  # span messages of 1014-1033 bytes, and one huge
        span, token = verify.start("v", {"text": "y" * size})
        lean_context.detach(token)
        span.end()
        spans.append(span)
    records = _queued(switch)
    sizes = {len(r) - 1 for r in records}
    assert {span_encoding._PREFIXED_SIZES - 1, span_encoding._PREFIXED_SIZES} <= sizes
    request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(records))
    assert request == encode_spans(spans)


def test_a_wide_registry_index_round_trips() -> None:
    for index in (0, 254, 255, 4000):
        head = span_encoding._pack_index(index)
        assert len(head) == (1 if index < 255 else 3)
        record = head + b"payload"
        start = 1 if record[0] != 255 else 3
        read = record[0] if start == 1 else span_encoding._unpack_wide_index(record, 1)[0]
        assert (read, record[start:]) == (index, b"payload")


def test_records_past_the_one_byte_registry_indexes_encode_as_the_stock_encoder() -> None:
    resource = Resource({"service.name": "many-scopes"})
    spans = [
        ReadableSpan(
            "s",
            context=SpanContext(1, i + 1, is_remote=False),
            resource=resource,
            instrumentation_scope=InstrumentationScope(f"scope-{i}"),
            start_time=1,
            end_time=2,
        )
        for i in range(300)
    ]
    records = [span_encoding.encode_record(s) for s in spans]
    assert all(r is not None for r in records)
    assert any(r[0] == span_encoding._WIDE for r in records if r is not None)
    request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(records))  # type: ignore[arg-type]
    assert request == encode_spans(spans)


# --- the memo of encoded attribute fields ------------------------------------------------


def _field(key: str, value: Any) -> bytes:
    """What the memo must return: the field as the general encoder writes it."""
    return len_prefixed(span_encoding._T_ATTRIBUTE, key_value(key, value))


def test_a_high_cardinality_key_is_bounded_and_read_from_its_last_value_slot(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, switch = lean
    verify = _recorder(provider, "verify")
    key = "fast-paths.rollout.id"
    count = span_encoding.MAX_MEMO_VALUES_PER_KEY * 3
    spans = []
    for i in range(count):
        span, token = verify.start("v", {key: f"{i}-0", "other": f"{i}-0"})
        lean_context.detach(token)
        span.end()
        spans.append(span)
    assert span_encoding._memoized[key] == span_encoding.MAX_MEMO_VALUES_PER_KEY
    memoized = sum(1 for k in span_encoding._fields if k[0] == key)
    assert memoized == span_encoding.MAX_MEMO_VALUES_PER_KEY
    assert span_encoding._last[key][0] == f"{count - 1}-0"
    request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(_queued(switch)))
    assert request == encode_spans(spans)


def test_the_last_value_slot_never_answers_for_another_value() -> None:
    key = "fast-paths.slot"
    for i in range(span_encoding.MAX_MEMO_VALUES_PER_KEY):
        span_encoding._attribute_field(key, 10_000 + i)  # the key's memo is full
    for value in (5, 5, True, 1, 1, 6, "6", "6", 6, False, 0):
        assert span_encoding._attribute_field(key, value) == _field(key, value), value
        assert span_encoding._last[key][:2] == (value, value.__class__)


def test_new_values_past_the_bound_leave_no_tracked_object_behind() -> None:
    key = "fast-paths.gc"
    for i in range(span_encoding.MAX_MEMO_VALUES_PER_KEY + 1):
        span_encoding._attribute_field(key, f"warm-{i}")
    values = [f"rollout-{i}" for i in range(2000)]  # made before counting
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for value in values:
            span_encoding._attribute_field(key, value)
        after = len(gc.get_objects())
    finally:
        gc.enable()
    assert after - before < 50  # one tuple per value would be 2000
    assert span_encoding._memoized[key] == span_encoding.MAX_MEMO_VALUES_PER_KEY


def test_a_memo_with_too_many_keys_is_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(span_encoding, "MAX_MEMO_KEYS", len(span_encoding._memoized) + 3)
    for i in range(4):
        key = f"fast-paths.k{i}"
        assert span_encoding._attribute_field(key, i) == _field(key, i)
    assert len(span_encoding._memoized) == 1 and span_encoding._memoized["fast-paths.k3"] == 1
    assert list(span_encoding._fields) == [("fast-paths.k3", 3, int)]


def test_values_that_are_not_memoized_still_encode() -> None:
    key = "fast-paths.kinds"
    long_text = "z" * (span_encoding.MAX_MEMO_TEXT + 1)
    for value in (1.5, ("a", "b"), (1, 2), long_text, "ünï", "a" * 39, "a" * 40, 2**62, -1):
        assert span_encoding._attribute_field(key, value) == _field(key, value), value
    assert not any(k[0] == key and k[1] == long_text for k in span_encoding._fields)
    # floats are memoized (a verifier's rewards repeat), apart from ints and bools
    assert span_encoding._fields[(key, 1.5, float)] == _field(key, 1.5)
    for value in (1.0, 1, True):
        assert span_encoding._attribute_field(key, value) == _field(key, value), value
    assert span_encoding._fields[(key, 1.0, float)] != span_encoding._fields[(key, 1, int)]


_KEYS = st.sampled_from(
    ["fast-paths.p.str", "fast-paths.p.int", "fast-paths.p.float", "k" * 120, "ключ"]
)
_SCALARS = st.one_of(
    st.text(max_size=50),
    st.text(alphabet="abc-_.0123456789", min_size=30, max_size=45),  # near the length bound
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=0, max_value=20_000),  # one-, two- and three-byte varints
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
_VALUES = st.one_of(
    _SCALARS,
    st.tuples(st.text(max_size=12)),
    st.lists(st.text(max_size=12), max_size=10).map(tuple),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3).map(tuple),
    st.tuples(st.booleans(), st.booleans()),
)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(key=_KEYS, value=_VALUES, known=st.booleans())
def test_every_attribute_field_is_the_general_encoders(key: str, value: Any, known: bool) -> None:
    """The scalar shortcuts (a known key's str, int and float), the memo (tuples of
    strings included) and the last-value slot write what ``key_value`` writes, whether
    the key's prefix is known yet or not, cold and warm."""
    if not known:
        otlp_wire.KEY_PREFIXES.pop(key, None)
    expected = None
    for _ in range(2):  # cold, then from the memo or the last-value slot
        field = span_encoding._attribute_field(key, value)
        expected = expected or _field(key, value)
        assert field == expected
    assert span_encoding._encode_attribute(key, value, value.__class__) == expected


def test_ints_outside_int64_are_refused_by_the_shortcut_too() -> None:
    key = "fast-paths.p.int"
    _field(key, 1)  # the key's prefix is known: the shortcut is taken for ints in range
    for value in (2**63, -(2**63) - 1):
        with pytest.raises(UnsupportedValue):
            span_encoding._encode_attribute(key, value, int)


def test_tuples_of_strings_are_memoized_and_other_tuples_keep_their_types() -> None:
    key = "fast-paths.tuples"
    for value in (("1",), (1,), (True,), (1.0,), ("stop", "length"), ("x" * 300,)):
        assert span_encoding._attribute_field(key, value) == _field(key, value), value
    memoized = {k[1] for k in span_encoding._fields if k[0] == key}
    assert memoized == {("1",), ("stop", "length")}  # equal keys (1,) (True,) (1.0,): never
    items = tuple(str(i) for i in range(span_encoding.MAX_MEMO_ITEMS + 1))
    span_encoding._attribute_field(key, items)
    assert (key, items, tuple) not in span_encoding._fields


# --- the recorder's fast start against its general one ----------------------------------


def _identity(span: Any) -> tuple[Any, ...]:
    context, parent = span.get_span_context(), getattr(span, "parent", None)
    return (
        type(span),
        context.trace_id,
        int(context.trace_flags),
        context.trace_state,
        context.is_remote,
        None if parent is None else (parent.span_id, parent.is_remote),
        getattr(span, "kind", None),
        dict(getattr(span, "attributes", None) or {}),
    )


@pytest.mark.parametrize("flags", [0x01, 0x03, 0x00, 0x02])
@pytest.mark.parametrize("state", [DEFAULT_TRACE_STATE, TraceState([("v", "1")])])
@pytest.mark.parametrize("remote", [True, False])
def test_fast_starts_make_the_general_paths_span(
    lean: tuple[TracerProvider, GymSpanProcessor], flags: int, state: TraceState, remote: bool
) -> None:
    provider, _switch = lean
    recorder = _recorder(provider, "verify")
    parent = SpanContext(0x1234, 0x5678, remote, TraceFlags(flags), state)
    context = trace_api.set_span_in_context(trace_api.NonRecordingSpan(parent))
    made = []

    def keep(started: tuple[Any, object]) -> None:
        span, span_token = started
        lean_context.detach(span_token)  # in order: the context is back to what it was
        span.end()
        made.append(span)

    token = context_api.attach(context)
    try:
        keep(recorder.start("s", {"a": 1}, SpanKind.CLIENT))  # fast, current context
        keep(recorder._start("s", {"a": 1}, SpanKind.CLIENT, context))  # general
    finally:
        context_api.detach(token)
    keep(recorder.start_under("s", {"a": 1}, SpanKind.CLIENT, parent))
    keep(recorder._start("s", {"a": 1}, SpanKind.CLIENT, _parent_context(parent)))
    fast, general, fast_under, general_under = (_identity(s) for s in made)
    assert fast == general and fast_under == general_under and fast == fast_under
    assert (fast[0] is LeanSpan) is bool(flags & 1)


def test_a_root_span_from_the_fast_path_is_the_general_paths(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, _switch = lean
    recorder = _recorder(provider, "verify")
    identities = []
    for start in (
        lambda: recorder.start("s", {}, SpanKind.SERVER),
        lambda: recorder.start_under("s", {}, SpanKind.SERVER, None),
        lambda: recorder._start("s", {}, SpanKind.SERVER, context_api.Context()),
    ):
        span, token = start()
        lean_context.detach(token)
        span.end()
        identity = _identity(span)
        identities.append((identity[0], *identity[2:]))  # all but the trace id
        assert span.parent is None
    assert identities[0] == identities[1] == identities[2]


def test_a_tracer_disabled_by_its_config_records_nothing(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    from opentelemetry.sdk.trace import _TracerConfig

    provider, switch = lean
    tracer: Any = provider.get_tracer("gym_telemetry.verify")
    recorder = _recorder(provider, "verify")
    tracer._set_tracer_config(_TracerConfig(is_enabled=False))
    try:
        span, token = recorder.start("off", {})
        lean_context.detach(token)
        under, token = recorder.start_under("off", {}, SpanKind.SERVER, None)
        lean_context.detach(token)
        assert not span.is_recording() and not under.is_recording()
    finally:
        tracer._set_tracer_config(_TracerConfig(is_enabled=True))
    span, token = recorder.start("on", {})
    lean_context.detach(token)
    assert type(span) is LeanSpan
    span.end()
    assert len(_queued(switch)) == 1


# --- the batch queue, appended to directly -------------------------------------------------


class _Awaken:
    """Stands for the batch worker's wake-up event: records ``set`` and never wakes it
    (so nothing leaves the queue while a test looks at it)."""

    def __init__(self) -> None:
        self.sets = 0

    def is_set(self) -> bool:
        return self.sets > 0

    def set(self) -> None:
        self.sets += 1


@pytest.fixture
def quiet_batch() -> Iterator[tuple[BatchSpanProcessor, Any, _Awaken]]:
    processor = BatchSpanProcessor(
        _Queue(), schedule_delay_millis=60_000, max_queue_size=4, max_export_batch_size=3
    )
    inner: Any = processor._batch_processor  # type: ignore[attr-defined]
    real, awaken = inner._worker_awaken, _Awaken()
    inner._worker_awaken = awaken
    yield processor, inner, awaken
    inner._worker_awaken = real
    processor.shutdown()


def test_the_direct_append_queues_and_wakes_like_emit(
    quiet_batch: tuple[BatchSpanProcessor, Any, _Awaken],
) -> None:
    processor, inner, awaken = quiet_batch
    append = sdk_hooks.batch_append(processor)
    assert append is not inner.emit
    append(b"a")
    append(b"b")
    assert list(inner._queue) == [b"b", b"a"] and awaken.sets == 0
    append(b"c")  # a full batch wakes the worker, once
    append(b"d")
    assert list(inner._queue) == [b"d", b"c", b"b", b"a"] and awaken.sets == 1


def test_a_full_queue_drops_the_oldest_record_counted(
    quiet_batch: tuple[BatchSpanProcessor, Any, _Awaken],
) -> None:
    processor, inner, _awaken = quiet_batch
    provider = TracerProvider(resource=Resource({"service.name": "full-queue"}))
    switch = GymSpanProcessor()
    switch.plug(processor, TrackingExporter(_Queue()))
    provider.add_span_processor(switch)
    recorder = _recorder(provider, "verify")
    spans = []
    for i in range(6):
        span, token = recorder.start("s", {"i": i})
        lean_context.detach(token)
        span.end()
        spans.append(span)
    assert recorder.direct_end is not None  # the spans took on_end_lean
    assert switch.dropped == 2 and switch.records == 6
    assert list(reversed(inner._queue)) == [span_encoding.encode_record(s) for s in spans[2:]]
    switch.plug(None)


def test_after_shutdown_the_direct_append_leaves_the_item_to_emit() -> None:
    processor = BatchSpanProcessor(_Queue(), schedule_delay_millis=60_000)
    append = sdk_hooks.batch_append(processor)
    inner: Any = processor._batch_processor  # type: ignore[attr-defined]
    processor.shutdown()
    append(b"late")  # emit refuses it (and counts it), as for any span after shutdown
    assert not inner._queue


def test_after_a_fork_or_in_another_pid_the_direct_append_leaves_items_to_emit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processor = BatchSpanProcessor(_Queue(), schedule_delay_millis=60_000)
    inner: Any = processor._batch_processor  # type: ignore[attr-defined]
    seen: list[object] = []
    monkeypatch.setattr(inner, "emit", seen.append)
    append = sdk_hooks.batch_append(processor)
    monkeypatch.setattr(sdk_hooks, "_FORKED", [True])
    append(b"forked")
    monkeypatch.setattr(sdk_hooks, "_FORKED", [False])
    monkeypatch.setattr(inner, "_pid", os.getpid() + 1)
    append(b"other pid")
    assert seen == [b"forked", b"other pid"] and not inner._queue
    monkeypatch.setattr(inner, "_pid", os.getpid())
    processor.shutdown()


def test_a_forked_child_sets_the_fork_flag_and_appends_through_emit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    processor = BatchSpanProcessor(_Queue(), schedule_delay_millis=60_000)
    inner: Any = processor._batch_processor  # type: ignore[attr-defined]
    seen: list[object] = []
    monkeypatch.setattr(inner, "emit", seen.append)
    append = sdk_hooks.batch_append(processor)
    assert sdk_hooks._FORKED == [False]
    pid = os.fork()
    if pid == 0:  # child: the flag is set and the item goes to emit, not the queue
        signal.alarm(60)
        append(b"in child")
        ok = sdk_hooks._FORKED[0] and seen == [b"in child"] and not inner._queue
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sdk_hooks._FORKED == [False] and seen == []  # the parent is untouched
    monkeypatch.undo()
    processor.shutdown()


# --- a lean span's one-call writers and W3C headers ----------------------------------------


def _server_span(provider: TracerProvider) -> LeanSpan:
    """A SERVER span with ``{"a": 1}``, started on the lean path and not current."""
    span, token = _recorder(provider, "server").start("GET", {"a": 1}, SpanKind.SERVER)
    lean_context.detach(token)
    assert isinstance(span, LeanSpan)
    return span


def test_a_lean_span_is_made_by_new_span_only() -> None:
    """Calling the class would run ReadableSpan's __init__ on the recorder's arguments."""
    with pytest.raises(TypeError, match="new_span"):
        LeanSpan("x", SpanContext(1, 2, False), None, None, {})


def test_end_with_set_if_absent_and_scalar_writes(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    span = _server_span(lean[0])
    span.set_attributes({"s": "x", "l": [1, 2], "bad": object(), "": 3})  # type: ignore[dict-item]
    span.set_if_absent("a", lambda: 2, SpanKind.SERVER)  # present: kept
    span.set_if_absent("r", lambda: "7-1", SpanKind.INTERNAL)  # another kind: not set
    span.set_if_absent("r", lambda: None, SpanKind.SERVER)  # nothing to set
    span.set_if_absent("r", lambda: "7-1", SpanKind.SERVER)
    span.set_if_absent("n", lambda: 5, SpanKind.SERVER)  # not a str: cleaned
    span.end_with({"done": True}, "GET /x", error=True)
    assert dict(span.attributes) == {
        "a": 1,
        "s": "x",
        "l": (1, 2),
        "r": "7-1",
        "n": 5,
        "done": True,
    }
    assert span.name == "GET /x" and span.status.status_code is StatusCode.ERROR
    end = span.end_time
    span.end_with({"late": 1}, "renamed")
    span.set_attributes({"late": 1})
    span.set_if_absent("late", lambda: "x", SpanKind.SERVER)
    assert span.end_time == end and "late" not in span.attributes and span.name == "GET /x"


def _clean_the_long_way(value: Any) -> Any:
    """``clean_value``'s contract, written out: scalars as they are, a homogeneous
    sequence of one scalar type (not bytes) as a tuple, anything else dropped."""
    if isinstance(value, bool | str | int | float):
        return value
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        items = tuple(value)
        kinds = {type(v) for v in items}
        if not kinds or (len(kinds) == 1 and kinds <= {bool, str, int, float}):
            return items
    return None


class _Text(str):
    pass


class _Pair(NamedTuple):
    a: int
    b: int


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    value=st.one_of(
        _SCALARS,
        st.lists(st.one_of(st.integers(), st.booleans(), st.text(max_size=3), st.floats())),
        st.lists(st.integers(), max_size=4).map(tuple),
        st.lists(st.text(max_size=3), max_size=4).map(tuple),
        st.sampled_from(
            [b"x", bytearray(b"x"), range(3), _Text("t"), _Pair(1, 2), {"a": 1}, {1}, None]
        ),
    )
)
def test_clean_value_keeps_its_contract(value: Any) -> None:
    assert clean_value(value) == _clean_the_long_way(value)


def test_plain_writes_skip_the_checks_and_keep_the_bound(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    span = _server_span(lean[0])
    span.set_attributes({"s": "x", "n": 2, "f": 1.5, "b": False})  # plain: one update
    span.add_clean({"reasons": ("stop",), "tokens": 7})
    assert dict(span.attributes) == {
        "a": 1,
        "s": "x",
        "n": 2,
        "f": 1.5,
        "b": False,
        "reasons": ("stop",),
        "tokens": 7,
    }
    many = {f"k{i}": i for i in range(MAX_ATTRIBUTES)}
    span.set_attributes(many)  # past the bound: new keys dropped, present ones updated
    span.add_clean({"a": 3, **{f"c{i}": i for i in range(5)}})
    assert len(span.attributes) == MAX_ATTRIBUTES and span.attributes["a"] == 3
    span.end()
    span.add_clean({"late": 1})
    assert "late" not in span.attributes


def test_end_with_keeps_an_ok_status_as_set_status_does(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, _switch = lean
    span, token = _recorder(provider, "server").start("GET", {}, SpanKind.SERVER)
    lean_context.detach(token)
    span.set_status(Status(StatusCode.OK))
    span.end_with(None, None, error=True)
    assert span.status.status_code is StatusCode.OK


def test_w3c_headers_of_a_lean_span_are_the_propagators(
    lean: tuple[TracerProvider, GymSpanProcessor],
) -> None:
    provider, _switch = lean
    server = _recorder(provider, "server")
    for flags in (0x01, 0x03):
        for state in (DEFAULT_TRACE_STATE, TraceState([("vendor", "a"), ("b", "c")])):
            parent = SpanContext(0x1F, 0x2E, True, TraceFlags(flags), state)
            span, token = server.start_under("GET", {}, SpanKind.SERVER, parent)
            try:
                expected: dict[str, str] = {}
                TraceContextTextMapPropagator().inject(expected)
            finally:
                lean_context.detach(token)
            assert isinstance(span, LeanSpan)
            traceparent, tracestate = span.w3c_trace_context()
            assert traceparent == expected["traceparent"]
            assert tracestate == expected.get("tracestate")
            span.end()


def test_a_link_on_a_lean_span_is_kept(lean: tuple[TracerProvider, GymSpanProcessor]) -> None:
    provider, switch = lean
    span, token = _recorder(provider, "server").start_under("POST", {}, SpanKind.SERVER, None)
    lean_context.detach(token)
    span.add_link(SpanContext(3, 4, True, TraceFlags(1)))
    span.end()
    assert [link.context.span_id for link in span.links] == [4]  # type: ignore[attr-defined]
    request = ExportTraceServiceRequest.FromString(span_encoding.encode_request(_queued(switch)))
    assert request == encode_spans([span])  # type: ignore[list-item]


# --- the exporter's stub, sending the encoder's bytes ---------------------------------------


def test_the_lean_exporter_sends_bytes_also_after_its_channel_is_made_again() -> None:
    exporter: Any = grpc_exporter.make_grpc_exporter("127.0.0.1:9", insecure=True)
    try:
        assert isinstance(exporter._client, grpc_exporter.BytesTraceStub)
        exporter._initialize_channel_and_stub()  # what the SDK does after some failures
        assert isinstance(exporter._client, grpc_exporter.BytesTraceStub)
        span = ReadableSpan(
            "s",
            context=SpanContext(1, 2, is_remote=False),
            resource=Resource({"service.name": "bytes-stub"}),
            start_time=1,
            end_time=2,
        )
        data = exporter._translate_data([span])
        assert type(data) is bytes
        assert ExportTraceServiceRequest.FromString(data) == encode_spans([span])
        unsupported = ReadableSpan(
            "s",
            context=SpanContext(1, 2, is_remote=False),
            resource=Resource({"service.name": "bytes-stub"}),
            attributes={"n": 2**70},
            start_time=1,
            end_time=2,
        )
        fallbacks = grpc_exporter.STATS.fallbacks
        data = exporter._translate_data([unsupported])  # the stock encoder's, serialized
        assert type(data) is bytes and grpc_exporter.STATS.fallbacks == fallbacks + 1
        assert ExportTraceServiceRequest.FromString(data) == encode_spans([unsupported])
    finally:
        exporter.shutdown()
