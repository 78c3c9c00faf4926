"""The trace scanner (``wire/protobuf/scan.py``): the index it builds agrees with the upb
parser on every request hypothesis writes at the wire level, it refuses exactly what
the receiver's protobuf decoding refuses (same reason, limit and message), and the
dispatch between the native and the pure-Python scanner.

The index and refusal properties run against :func:`scan_traces` as dispatched (the
pure-Python scanner until ``gym_sidecar_native`` is installed) and against the pure
path forced, so a native scanner is held to the same properties.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from google.protobuf.json_format import MessageToDict
from gym_sidecar.core.producers import SPLIT_SCOPES
from gym_sidecar.core.signals import SPECS
from gym_sidecar.core.stage import Signal
from gym_sidecar.core.traces import ResourceBlock, ScopeBlock, TraceRequest
from gym_sidecar.metrics.spans import SCAN_SPEC
from gym_sidecar.receiver.request import decode_batch
from gym_sidecar.wire.protobuf import scan as scanner
from gym_sidecar.wire.protobuf.decode import BadRequest, decode_protobuf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from testkit.otlp_samples import deep_json_text, trace_request
from tests.sidecar.wire.protobuf.wire_requests import (
    GYM_SCOPE,
    ROLLOUT_SCOPE,
    VERIFY_SCOPE,
    ld,
    trace_requests,
)

SPEC = SPECS[Signal.TRACES]
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

Scan = Callable[..., TraceRequest]


@pytest.fixture(params=["dispatched", "pure"])
def scan(request: pytest.FixtureRequest) -> Iterator[Scan]:
    if request.param == "dispatched":
        yield scanner.scan_traces
    else:
        with scanner.pure_python():
            yield scanner.scan_traces


def scan_for_derive(scan: Scan, data: bytes, max_depth: int = 100) -> TraceRequest:
    return scan(
        data,
        max_depth=max_depth,
        max_messages=1_000_000,
        derive_scopes=SCAN_SPEC.derive_scopes,
        attr_keys=SCAN_SPEC.attr_keys,
        event_keys=SCAN_SPEC.event_keys,
        split_scopes=SPLIT_SCOPES,
        sparse_scopes=SCAN_SPEC.sparse_scopes,
        sparse_keys=SCAN_SPEC.sparse_keys,
    )


def _scalar(value: Any) -> Any:
    kind = value.WhichOneof("value")
    scalar = kind not in (None, "array_value", "kvlist_value")
    return getattr(value, kind) if scalar else None


def last_values(
    span: Any, keys: tuple[str, ...], event_keys: tuple[tuple[str, str], ...] = ()
) -> tuple[Any, ...]:
    """The DerivedSpan contract, read from upb: each key's last attribute's scalar, then
    for each event key the last event of that name having the key, its last value (for
    ERROR spans only)."""
    values: list[Any] = [None] * len(keys)
    for kv in span.attributes:
        if kv.key in keys:
            values[keys.index(kv.key)] = _scalar(kv.value)
    for name, key in event_keys:
        found: Any = None
        for event in span.events if span.status.code == 2 else ():
            if event.name != name:
                continue
            for kv in event.attributes:
                if kv.key == key:
                    found = _scalar(kv.value)
        values.append(found)
    return tuple(values)


def check_index(view: TraceRequest, data: bytes) -> None:
    """The index agrees with upb's parse of ``data``, field by field."""
    parsed = ExportTraceServiceRequest.FromString(data)
    assert view.raw is data
    assert view.SerializeToString() is data  # nothing changed: the bytes received
    assert len(view.blocks) == len(parsed.resource_spans)
    covered = sorted([(b.start, b.end) for b in view.blocks] + list(view.other), key=lambda r: r[0])
    pos = 0
    for start, end in covered:  # the request's fields, back to back
        assert start == pos
        pos = end
    assert pos == len(data)
    for block, rs in zip(view.blocks, parsed.resource_spans, strict=True):
        assert (block.resource is not None) == rs.HasField("resource")
        assert Resource.FromString(block.current_resource) == rs.resource
        assert block.resource_out is None and not block.edited
        assert [s.name for s in block.scopes] == [ss.scope.name for ss in rs.scope_spans]
        assert [s.spans for s in block.scopes] == [len(ss.spans) for ss in rs.scope_spans]
        for scope, ss in zip(block.scopes, rs.scope_spans, strict=True):
            alone = ExportTraceServiceRequest.FromString(ld(1, data[scope.start : scope.end]))
            assert alone.resource_spans[0].scope_spans == [ss]  # the range is the field
            if ss.scope.name in SPLIT_SCOPES:
                assert scope.split is not None
                assert [name for name, _, _ in scope.split] == [span.name for span in ss.spans]
                for (_, start, end), span in zip(scope.split, ss.spans, strict=True):
                    assert ScopeSpans.FromString(data[start:end]).spans == [span]
            else:
                assert scope.split is None
            if ss.scope.name not in SCAN_SPEC.derive_scopes:
                assert scope.derived is None
                continue
            want = [
                (
                    span.name,
                    span.start_time_unix_nano,
                    span.end_time_unix_nano,
                    span.trace_id,
                    span.span_id,
                    span.status.code,
                    last_values(span, SCAN_SPEC.attr_keys, SCAN_SPEC.event_keys),
                )
                for span in ss.spans
            ]
            if ss.scope.name in SCAN_SPEC.sparse_scopes:  # the marked spans only
                marks = [SCAN_SPEC.attr_keys.index(k) for k in SCAN_SPEC.sparse_keys]
                want = [d for d in want if any(d[6][i] is not None for i in marks)]
            assert scope.derived == want
        for value in (v for s in block.scopes for d in s.derived or () for v in d[6]):
            assert value is None or type(value) in (bool, int, float, str, bytes)
    assert view.span_count() == sum(
        len(ss.spans) for rs in parsed.resource_spans for ss in rs.scope_spans
    )


@PROPERTY
@given(trace_requests())
def test_the_index_agrees_with_the_parser(data: bytes) -> None:
    check_index(scan_for_derive(scanner.scan_traces, data), data)
    with scanner.pure_python():
        check_index(scan_for_derive(scanner.scan_traces, data), data)


def test_gym_shaped_requests_are_indexed(scan: Scan) -> None:
    from testkit.rollout_requests import Rollout
    from testkit.rollout_requests import trace_request as rollouts_request

    rollouts = [
        Rollout(f"{i}-0", 1_700_000_000_000_000_000, 900.0 + i, i % 3 != 0) for i in range(6)
    ]
    body = rollouts_request(rollouts).SerializeToString()
    view = scan_for_derive(scan, body)
    check_index(view, body)
    derived = [d for b in view.blocks for s in b.scopes for d in s.derived or ()]
    assert {d[0] for d in derived} == {semconv.SPAN_ROLLOUT, semconv.SPAN_VERIFY}
    assert len(derived) == 12


@PROPERTY
@given(trace_requests(), st.data())
def test_removing_spans_of_a_split_scope_splices_as_upb_would(
    data: bytes, draw: st.DataObject
) -> None:
    """The gate's span-level removal (``ScopeBlock.keep_spans``): the request written
    out is upb's parse of the received one without exactly those spans."""
    view = scan_for_derive(scanner.scan_traces, data)
    want = ExportTraceServiceRequest.FromString(data)
    for block, rs in zip(view.blocks, want.resource_spans, strict=True):
        for scope, ss in zip(block.scopes, rs.scope_spans, strict=True):
            if scope.split is None:
                continue
            kept = [i for i in range(len(scope.split)) if draw.draw(st.booleans())]
            scope.keep_spans(kept)
            block.edited = True
            spans = [ss.spans[i] for i in kept]
            del ss.spans[:]
            ss.spans.extend(spans)
            assert scope.spans == len(kept)
    got = ExportTraceServiceRequest.FromString(view.SerializeToString())
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


def test_gym_own_telemetry_spans_are_read_and_split(scan: Scan) -> None:
    """Gym's own dialect: one scope for every group, a failure as an exception event."""
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    ss.scope.name = GYM_SCOPE
    ok = ss.spans.add(name=semconv.SPAN_VERIFY, start_time_unix_nano=5, end_time_unix_nano=9)
    failed = ss.spans.add(name=semconv.SPAN_VERIFY, start_time_unix_nano=5, end_time_unix_nano=9)
    failed.status.code = 2  # type: ignore[assignment]
    failed.events.add(name="exception").attributes.add(key="exception.type").value.CopyFrom(
        AnyValue(string_value="__main__.VerifierCrash")
    )
    ss.spans.add(name=semconv.SPAN_MODEL_RESPONSES)
    data = req.SerializeToString()
    view = scan_for_derive(scan, data)
    check_index(view, data)
    (scope,) = view.blocks[0].scopes
    assert scope.derived is not None
    nothing = (None,) * len(SCAN_SPEC.attr_keys)
    assert [d[6] for d in scope.derived] == [
        (*nothing, None),
        (*nothing, "__main__.VerifierCrash"),
        (*nothing, None),
    ]
    assert scope.split is not None
    assert [name for name, _, _ in scope.split] == [
        semconv.SPAN_VERIFY,
        semconv.SPAN_VERIFY,
        semconv.SPAN_MODEL_RESPONSES,
    ]
    assert ok.name == semconv.SPAN_VERIFY


def verdict(fn: Callable[[], object]) -> tuple[str, str, str | None] | None:
    try:
        fn()
    except BadRequest as exc:
        return (str(exc), exc.reason, exc.limit)
    return None


def same_verdict(scan: Scan, data: bytes, max_depth: int = 100, most: int = 1_000_000) -> None:
    expected = verdict(lambda: decode_protobuf(SPEC, data, max_depth, most))
    got = verdict(
        lambda: scan(
            data,
            max_depth=max_depth,
            max_messages=most,
            derive_scopes=SCAN_SPEC.derive_scopes,
            attr_keys=SCAN_SPEC.attr_keys,
        )
    )
    assert got == expected, data[:200]
    if got is None:
        check_index(scan_for_derive(scan, data, max_depth), data)


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A valid request cut short, with a byte changed, or with bytes inserted."""
    data = draw(trace_requests())
    how = draw(st.sampled_from(["cut", "flip", "nudge", "insert"]))
    pos = draw(st.integers(0, len(data)))
    if how == "cut":
        return data[:pos]
    if how == "nudge" and pos < len(data):
        # a length or tag byte off by a little: a field running past its message's end
        byte = (data[pos] + draw(st.sampled_from([-2, -1, 1, 2]))) & 0xFF
        return data[:pos] + bytes([byte]) + data[pos + 1 :]
    if how == "flip" and pos < len(data):
        return data[:pos] + bytes([draw(st.integers(0, 255))]) + data[pos + 1 :]
    return data[:pos] + draw(st.binary(min_size=1, max_size=6)) + data[pos:]


@PROPERTY
@given(st.one_of(damaged(), st.binary(max_size=64)))
def test_refusals_are_the_parsers(data: bytes) -> None:
    same_verdict(scanner.scan_traces, data)
    with scanner.pure_python():
        same_verdict(scanner.scan_traces, data)


def resource_with(kv: bytes, after: bytes) -> bytes:
    """A request whose resource holds the attribute field ``kv`` (as written: its tag,
    length and body may run past its end) and then the bytes ``after``."""
    body = b"\x0a" + bytes([len(kv)]) + kv + after
    return ld(1, ld(1, body))


# upb reads a field's tag and length past its message's end and checks a string's UTF-8
# (within the request) before it checks that the field ended inside its message.
@pytest.mark.parametrize(
    ("kv", "after", "refused_for"),
    [
        (b"\x0a", b"\x03\x80bc", "String field had bad UTF-8"),  # length past the end
        (b"\x0a", b"\x03abc", "Wire format was corrupt"),
        (b"\x0a\x83", b"\x00\x80bc", "String field had bad UTF-8"),  # length straddles it
        (b"\x8a", b"\x00\x03\x80bc", "String field had bad UTF-8"),  # a two-byte tag does
        (b"\x8a", b"\x00\x03abc", "Wire format was corrupt"),
        (b"\x0a\x03\x80", b"bc", "String field had bad UTF-8"),  # the bytes straddle it
        (b"\x0a\x05\x80b", b"c", "Wire format was corrupt"),  # past the request's end
        (b"\x12\x03\x0a\x05\x80", b"bcdef", "String field had bad UTF-8"),  # two levels
        (b"\x12\x04\x0a\x02", b"\x80b", "Wire format was corrupt"),  # a message: never
        (b"\x12", b"\x04\x0a\x02\x80b", "Wire format was corrupt"),
    ],
)
def test_a_string_running_past_its_message_is_refused_as_upb_does(
    scan: Scan, kv: bytes, after: bytes, refused_for: str
) -> None:
    data = resource_with(kv, after)
    same_verdict(scan, data)
    refused = verdict(lambda: scan_for_derive(scan, data))
    assert refused is not None and refused[0].endswith(refused_for)


def test_invalid_utf8_in_a_scope_name_is_refused(scan: Scan) -> None:
    scope = ld(1, ld(1, b"\xff\xfe"))  # InstrumentationScope.name, not UTF-8
    data = ld(1, ld(2, scope))
    same_verdict(scan, data)
    assert verdict(lambda: scan_for_derive(scan, data)) is not None


def test_depth_and_message_limits_are_the_receivers(scan: Scan) -> None:
    deep = ExportTraceServiceRequest()
    span = deep.resource_spans.add().scope_spans.add().spans.add(name="deep")
    value = span.attributes.add(key="k").value
    for _ in range(10):  # 10 kvlist levels: 3 message levels each
        value = value.kvlist_value.values.add(key="k").value
    value.string_value = "leaf"
    data = deep.SerializeToString()
    for max_depth in (8, 20, 30, 40, 100):
        same_verdict(scan, data, max_depth)
    too_deep = verdict(lambda: scan_for_derive(scan, data, 20))
    assert too_deep is not None and too_deep[1:] == ("too_deep", "max_message_depth")
    many = trace_request("m", spans=400).SerializeToString()  # > 2 x 100 bytes: counted
    for most in (100, 10_000):
        same_verdict(scan, many, most=most)
    refused = verdict(
        lambda: scan(many, max_depth=100, max_messages=100, derive_scopes=frozenset(), attr_keys=())
    )
    assert refused is not None and refused[1:] == ("too_many_messages", "max_request_messages")


def test_a_scope_outside_derive_scopes_is_not_read(scan: Scan) -> None:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for name in (ROLLOUT_SCOPE, VERIFY_SCOPE, "other"):
        ss = rs.scope_spans.add()
        ss.scope.name = name
        sp = ss.spans.add(name=semconv.SPAN_VERIFY, start_time_unix_nano=5, end_time_unix_nano=9)
        sp.attributes.add(key="k").value.CopyFrom(AnyValue(bool_value=True))
    data = req.SerializeToString()
    view = scan(
        data,
        max_depth=100,
        max_messages=1000,
        derive_scopes=frozenset({VERIFY_SCOPE}),
        attr_keys=("k", "absent"),
    )
    rollout, verify, other = view.blocks[0].scopes
    assert rollout.derived is None and other.derived is None
    assert verify.derived == [(semconv.SPAN_VERIFY, 5, 9, b"", b"", 0, (True, None))]


def test_a_sparse_scope_lists_its_marked_spans_only(scan: Scan) -> None:
    """``sparse_scopes``: of a hop block, only the spans with a value for one of the
    sparse keys (a retried or failed hop) are listed, each with every key's value; a
    block with none lists nothing; a non-sparse derive scope lists every span."""
    hops = semconv.scope_name(semconv.GROUP_HTTP_CLIENT)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    plain, retried, failed = rs.scope_spans.add(), rs.scope_spans.add(), rs.scope_spans.add()
    for ss in (plain, retried, failed):
        ss.scope.name = hops
    for i in range(3):  # plain hops: a target, no mark
        sp = plain.spans.add(name="POST /v1/responses", start_time_unix_nano=1 + i)
        sp.attributes.add(key="target").value.string_value = "model"
    retried.spans.add(name="POST /a").attributes.add(key="target").value.string_value = "a"
    sp = retried.spans.add(name="POST /b", start_time_unix_nano=7)
    sp.attributes.add(key="target").value.string_value = "b"
    sp.attributes.add(key="resends").value.int_value = 2
    sp = failed.spans.add(name="POST /c")
    sp.attributes.add(key="error").value.string_value = "timeout"
    sp.attributes.add(key="resends").value.array_value.SetInParent()  # no value: unmarked
    failed.spans.add(name="POST /d").attributes.add(key="error").value.string_value = "500"
    other = rs.scope_spans.add()
    other.scope.name = ROLLOUT_SCOPE
    other.spans.add(name="x")
    view = scan(
        req.SerializeToString(),
        max_depth=100,
        max_messages=1000,
        derive_scopes=frozenset({hops, ROLLOUT_SCOPE}),
        attr_keys=("target", "resends", "error"),
        sparse_scopes=frozenset({hops}),
        sparse_keys=("resends", "error"),
    )
    got = [scope.derived for scope in view.blocks[0].scopes]
    assert got == [
        [],
        [("POST /b", 7, 0, b"", b"", 0, ("b", 2, None))],
        [
            ("POST /c", 0, 0, b"", b"", 0, (None, None, "timeout")),
            ("POST /d", 0, 0, b"", b"", 0, (None, None, "500")),
        ],
        [("x", 0, 0, b"", b"", 0, (None, None, None))],
    ]
    assert [scope.spans for scope in view.blocks[0].scopes] == [3, 2, 2, 1]  # counts: all


def test_a_sparse_scope_reads_alike_whatever_its_fields_order(scan: Scan) -> None:
    """The native pass keeps no record of a sparse block's spans and reports from the
    ones it marked only when it read every span of the block as sparse: a scope name
    after or among the spans, a scope named twice and an attribute under a non-minimal
    tag (read elsewhere than in place) report the same hops as the name first."""
    hops = semconv.scope_name(semconv.GROUP_HTTP_CLIENT)
    plain = Span(name="GET", start_time_unix_nano=1)
    plain.attributes.add(key="target").value.string_value = "model"
    retried = Span(name="POST", start_time_unix_nano=2)
    retried.attributes.add(key="resends").value.int_value = 3
    kv = KeyValue(key="error")
    kv.value.string_value = "timeout"
    # Span.attributes (field 9) under a two-byte tag: the pass reads it through `field`
    failed = Span(name="PUT").SerializeToString() + b"\xca\x00" + ld(9, kv.SerializeToString())[1:]
    bodies = [ld(2, s) for s in (plain.SerializeToString(), retried.SerializeToString(), failed)]
    name = ld(1, InstrumentationScope(name=hops).SerializeToString())
    other = ld(1, InstrumentationScope(name="elsewhere").SerializeToString())
    expected = [
        ("POST", 2, 0, b"", b"", 0, (None, 3, None)),
        ("PUT", 0, 0, b"", b"", 0, (None, None, "timeout")),
    ]
    for scope_spans in (
        name + b"".join(bodies),
        b"".join(bodies) + name,
        bodies[0] + name + b"".join(bodies[1:]),
        other + bodies[0] + name + b"".join(bodies[1:]),
    ):
        data = ld(1, ld(2, scope_spans))
        view = scan(
            data,
            max_depth=100,
            max_messages=1000,
            derive_scopes=frozenset({hops}),
            attr_keys=("target", "resends", "error"),
            sparse_scopes=frozenset({hops}),
            sparse_keys=("resends", "error"),
        )
        assert [scope.derived for scope in view.blocks[0].scopes] == [expected]


def test_otlp_json_traces_are_scanned_like_protobuf() -> None:
    req = trace_request("j", spans=4)
    req.resource_spans[0].scope_spans[0].scope.name = VERIFY_SCOPE
    body = json.dumps(MessageToDict(req)).encode()  # ids in base64: proto3 JSON ...
    doc = json.loads(body)
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # ... OTLP wants hex
        for key in ("traceId", "spanId"):
            span[key] = __import__("base64").b64decode(span[key]).hex()
    kwargs: dict[str, Any] = {
        "max_depth": 100,
        "max_messages": 1000,
        "scan": SCAN_SPEC,
        "peer": "10.0.0.1:5",
    }
    from_json = decode_batch(SPEC, json.dumps(doc).encode(), json=True, **kwargs)
    from_pb = decode_batch(SPEC, req.SerializeToString(), json=False, **kwargs)
    assert isinstance(from_json.message, TraceRequest)
    assert isinstance(from_pb.message, TraceRequest)
    assert from_json.items == from_pb.items == 4 and from_json.peer == "10.0.0.1:5"
    assert from_json.message.raw == from_pb.message.raw
    assert [s.derived for s in from_json.message.blocks[0].scopes] == [
        s.derived for s in from_pb.message.blocks[0].scopes
    ]
    with pytest.raises(BadRequest) as refused:
        decode_batch(SPEC, deep_json_text(40), json=True, **{**kwargs, "max_depth": 20})
    assert refused.value.reason == "too_deep"


# -- dispatch ----------------------------------------------------------------------


@pytest.fixture
def fresh_selection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A selection not yet resolved, and no native module unless a test installs one."""
    monkeypatch.setattr(scanner, "_SELECTION", scanner._Selection())
    monkeypatch.delitem(sys.modules, "gym_sidecar_native", raising=False)
    monkeypatch.delenv("GYM_SIDECAR_NATIVE", raising=False)
    yield


def fake_native(monkeypatch: pytest.MonkeyPatch, fail: str | None = None) -> types.ModuleType:
    """A stand-in ``gym_sidecar_native`` with the native contract, built on the pure
    scanner; ``fail`` makes it raise that error class instead."""
    module = types.ModuleType("gym_sidecar_native")

    class DecodeError(ValueError): ...

    class TooDeep(ValueError): ...

    class TooManyMessages(ValueError): ...

    calls: list[bytes] = []

    def scan_traces(
        data: bytes,
        max_depth: int,
        max_messages: int,
        derive_scopes: frozenset[str],
        attr_keys: tuple[str, ...],
        resource_block: type[ResourceBlock],
        scope_block: type[ScopeBlock],
        event_keys: tuple[tuple[str, str], ...] = (),
        split_scopes: frozenset[str] = frozenset(),
        sparse_scopes: frozenset[str] = frozenset(),
        sparse_keys: tuple[str, ...] = (),
    ) -> tuple[list[ResourceBlock], list[tuple[int, int]]]:
        assert resource_block is ResourceBlock and scope_block is ScopeBlock
        calls.append(data)
        if fail is not None:
            raise getattr(module, fail)("detail from the scanner")
        view = scanner.scan_python(
            data,
            max_depth=max_depth,
            max_messages=max_messages,
            derive_scopes=derive_scopes,
            attr_keys=attr_keys,
            event_keys=event_keys,
            split_scopes=split_scopes,
            sparse_scopes=sparse_scopes,
            sparse_keys=sparse_keys,
        )
        return view.blocks, view.other

    module.__dict__.update(
        DecodeError=DecodeError,
        TooDeep=TooDeep,
        TooManyMessages=TooManyMessages,
        scan_traces=scan_traces,
        calls=calls,
    )
    monkeypatch.setitem(sys.modules, "gym_sidecar_native", module)
    return module


@pytest.mark.usefixtures("fresh_selection")
def test_the_pure_scanner_runs_without_the_native_module(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "gym_sidecar_native", None)  # import fails
    with caplog.at_level("INFO", logger=scanner.__name__):
        assert scanner.active_scanner() == "python"
        assert not scanner.native_available()
        view = scanner.scan_traces(
            b"", max_depth=100, max_messages=10, derive_scopes=frozenset(), attr_keys=()
        )
    assert view.blocks == [] and view.other == [] and view.SerializeToString() == b""
    lines = [r.getMessage() for r in caplog.records if r.name == scanner.__name__]
    assert lines == ["trace scanner: python (gym_sidecar_native is not installed)"]


@pytest.mark.usefixtures("fresh_selection")
def test_the_native_scanner_is_used_when_it_imports(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    native = fake_native(monkeypatch)
    data = trace_request("n").SerializeToString()
    with caplog.at_level("INFO", logger=scanner.__name__):
        assert scanner.active_scanner() == "native"
        view = scan_for_derive(scanner.scan_traces, data)
        scan_for_derive(scanner.scan_traces, data)
    assert native.calls == [data, data]
    check_index(view, data)
    with scanner.pure_python():
        assert scanner.active_scanner() == "python"
        scan_for_derive(scanner.scan_traces, data)
    assert len(native.calls) == 2
    assert scanner.active_scanner() == "native"
    lines = [r.getMessage() for r in caplog.records if r.name == scanner.__name__]
    assert lines == ["trace scanner: native (gym_sidecar_native)"]  # once


@pytest.mark.usefixtures("fresh_selection")
def test_gym_sidecar_native_0_keeps_the_pure_scanner(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    native = fake_native(monkeypatch)
    monkeypatch.setenv("GYM_SIDECAR_NATIVE", "0")
    with caplog.at_level("INFO", logger=scanner.__name__):
        assert scanner.active_scanner() == "python"
        scan_for_derive(scanner.scan_traces, trace_request("p").SerializeToString())
    assert native.calls == []
    assert "trace scanner: python (GYM_SIDECAR_NATIVE=0)" in caplog.text


@pytest.mark.usefixtures("fresh_selection")
@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            "DecodeError",
            (
                "body is not a valid ExportTraceServiceRequest: detail from the scanner",
                "bad_request",
                None,
            ),
        ),
        ("TooDeep", ("too_deep", "max_message_depth")),
        ("TooManyMessages", ("too_many_messages", "max_request_messages")),
    ],
)
def test_native_errors_become_the_receivers_refusals(
    monkeypatch: pytest.MonkeyPatch, error: str, expected: tuple[Any, ...]
) -> None:
    fake_native(monkeypatch, fail=error)
    data = trace_request("e").SerializeToString()
    got = verdict(
        lambda: scanner.scan_traces(
            data, max_depth=30, max_messages=50, derive_scopes=frozenset(), attr_keys=()
        )
    )
    assert got is not None
    if error == "DecodeError":
        assert got == expected
    else:
        assert got[1:] == expected
    if error == "TooDeep":
        assert got[0] == verdict(lambda: decode_protobuf(SPEC, deep_pb(40), 30))[0]  # type: ignore[index]
    if error == "TooManyMessages":
        many = trace_request("m", spans=400).SerializeToString()
        assert got[0] == verdict(lambda: decode_protobuf(SPEC, many, 100, 50))[0]  # type: ignore[index]


def deep_pb(levels: int) -> bytes:
    """A request whose span attribute nests ``levels`` kvlists."""
    req = ExportTraceServiceRequest()
    value = req.resource_spans.add().scope_spans.add().spans.add().attributes.add(key="k").value
    for _ in range(levels):
        value = value.kvlist_value.values.add(key="k").value
    return req.SerializeToString()
