"""Property-based: the native scan answers every request as upb and ``wire.protobuf.bounds``
do (support.reference), and its index says what upb's parse says.

Requests are built with the protobuf classes (every message of the trace schema, odd
values: NaN, extreme ints, empty and non-ASCII strings, open-enum values), then taken
apart into wire fields and mutated where the classes cannot go: unknown fields and
groups, a message field split in two (merged by protobuf), scalars repeated (last
wins), oneof members overwritten, known fields with the wrong wire type, invalid UTF-8,
field number 0 and bad wire types, non-minimal varints, kvlist/array chains near every
depth limit; then, sometimes, truncated, with bytes flipped, inserted or deleted. Limits
are drawn around what the request holds.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor
from gym_sidecar.wire.protobuf.bounds import count_messages
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    EntityRef,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.sidecar.wire.protobuf.native.support import (
    ATTR_KEYS,
    DERIVE_SCOPES,
    EVENT_KEYS,
    REQUEST,
    SPLIT_SCOPES,
    Field,
    check_same_answer,
    decode,
    encode,
    import_native,
)

native = import_native()

SCALE = float(os.environ.get("GYM_NATIVE_EXAMPLES", "1"))
"""Scales the example counts (a longer hunt: ``GYM_NATIVE_EXAMPLES=20``)."""


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


Draw = Callable[[st.SearchStrategy[Any]], Any]

TEXT = st.text(max_size=10)
KEYS = st.sampled_from([*ATTR_KEYS, "exception.type", "k", "", "ключ"])
SCOPE_NAMES = st.sampled_from(
    [*sorted(DERIVE_SCOPES), "gym_telemetry.server", "gym_telemetry.http_client", "", "ü"]
)
SPAN_NAMES = st.sampled_from(
    ["gym.rollout", "gym.verify", "gym.env.step", "gym.model.responses", "POST /run", "", "ü"]
)
EVENT_NAMES = st.one_of(st.sampled_from(["exception", "exception", "e"]), TEXT)
U32 = st.integers(0, 2**32 - 1)
U64 = st.one_of(st.sampled_from([0, 1, 2**63, 2**64 - 1]), st.integers(0, 2**64 - 1))
I32 = st.integers(-(2**31), 2**31 - 1)

ANY_DESC = AnyValue.DESCRIPTOR
KV_DESC = KeyValue.DESCRIPTOR
ARRAY_DESC = ArrayValue.DESCRIPTOR
KVLIST_DESC = KeyValueList.DESCRIPTOR


def _kv(key: str, value: AnyValue | None) -> KeyValue:
    kv = KeyValue(key=key)
    if value is not None:
        kv.value.CopyFrom(value)
    return kv


SCALARS = st.one_of(
    TEXT.map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.floats().map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=6).map(lambda b: AnyValue(bytes_value=b)),
    I32.map(lambda i: AnyValue(string_value_strindex=i)),
    st.just(AnyValue()),
)
ANY_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda v: AnyValue(array_value=ArrayValue(values=v))),
        st.lists(st.builds(_kv, KEYS, inner), max_size=3).map(
            lambda v: AnyValue(kvlist_value=KeyValueList(values=v))
        ),
    ),
    max_leaves=5,
)
KEY_VALUES = st.builds(_kv, KEYS, st.none() | ANY_VALUES)
ATTRIBUTES = st.lists(KEY_VALUES, max_size=4)


@st.composite
def spans(draw: Draw) -> Span:
    span = Span(name=draw(SPAN_NAMES), attributes=draw(ATTRIBUTES))
    if draw(st.booleans()):
        span.trace_id = draw(st.binary(max_size=17))
        span.span_id = draw(st.binary(max_size=9))
        span.start_time_unix_nano = draw(U64)
        span.end_time_unix_nano = draw(U64)
    if draw(st.booleans()):
        span.status.CopyFrom(Status(code=draw(I32), message=draw(TEXT)))  # open enum
    if draw(st.integers(0, 3)) == 0:
        span.parent_span_id = draw(st.binary(max_size=8))
        span.trace_state = draw(TEXT)
        span.kind = draw(I32)
        span.flags = draw(U32)
        span.dropped_attributes_count = draw(U32)
        span.dropped_events_count = draw(U32)
        span.dropped_links_count = draw(U32)
        event = span.events.add(time_unix_nano=draw(U64), name=draw(EVENT_NAMES))
        event.attributes.extend(draw(ATTRIBUTES))
        event.dropped_attributes_count = draw(U32)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # exception events, as Lens writes
        event = span.events.add(name=draw(EVENT_NAMES))
        event.attributes.extend(draw(ATTRIBUTES))
        link = span.links.add(
            trace_id=draw(st.binary(max_size=16)), trace_state=draw(TEXT), flags=draw(U32)
        )
        link.attributes.extend(draw(ATTRIBUTES))
    return span


@st.composite
def requests(draw: Draw) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = request.resource_spans.add()
        if draw(st.booleans()):
            rs.resource.CopyFrom(Resource(attributes=draw(ATTRIBUTES)))
            if draw(st.integers(0, 3)) == 0:
                rs.resource.dropped_attributes_count = draw(U32)
                rs.resource.entity_refs.append(
                    EntityRef(
                        schema_url=draw(TEXT),
                        type=draw(TEXT),
                        id_keys=draw(st.lists(TEXT, max_size=2)),
                        description_keys=draw(st.lists(TEXT, max_size=2)),
                    )
                )
        rs.schema_url = draw(TEXT)
        for _ in range(draw(st.integers(0, 3))):
            ss = rs.scope_spans.add(schema_url=draw(TEXT))
            if draw(st.integers(0, 4)):
                ss.scope.CopyFrom(InstrumentationScope(name=draw(SCOPE_NAMES)))
                if draw(st.integers(0, 3)) == 0:
                    ss.scope.version = draw(TEXT)
                    ss.scope.attributes.extend(draw(ATTRIBUTES))
            ss.spans.extend(draw(st.lists(spans(), max_size=3)))
    return request


# --- wire-level mutations ---------------------------------------------------------------

INVALID_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"]


def _nodes(fields: list[Field], desc: Descriptor, level: int = 1) -> list[Any]:
    """(fields, type, level) of every message of the tree."""
    out: list[Any] = [(fields, desc, level)]
    for f in fields:
        if f.descriptor is not None and isinstance(f.value, list):
            out += _nodes(f.value, f.descriptor, level + 1)
    return out


def _random_fields(draw: Draw, depth: int = 0) -> list[Field]:
    """Fields of no schema: what an unknown length-delimited field or group holds."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        number = draw(st.sampled_from([0, 1, 2, 5, 9, 15, 99]))
        wire_type = draw(st.sampled_from([0, 1, 2, 5, 3] if depth < 2 else [0, 1, 2, 5]))
        out.append(_value_field(draw, number, wire_type, depth))
    return out


def _value_field(draw: Draw, number: int, wire_type: int, depth: int = 0) -> Field:
    value: int | bytes | list[Field]
    if wire_type == 0:
        value = draw(st.sampled_from([0, 1, 2**31, 2**63, 2**64 - 1]) | st.integers(0, 2**64 - 1))
    elif wire_type == 1:
        value = draw(st.integers(0, 2**64 - 1))
    elif wire_type == 5:
        value = draw(U32)
    elif wire_type == 3:
        value = _random_fields(draw, depth + 1)
    else:
        value = draw(st.binary(max_size=8) | st.sampled_from(INVALID_UTF8))
    return Field(number, wire_type, value)


def _chain(number: int, target: int, level: int) -> Field:
    """An attribute (field ``number``): a KeyValue at ``level`` whose value nests arrays so
    that its innermost message is at level ``target`` (at least its AnyValue's)."""
    inner: list[Field] = []  # the contents of the innermost message
    for lvl in range(max(target, level + 1), level + 1, -1):
        if (lvl - level) % 2 == 1:  # an AnyValue: an element of the ArrayValue above
            inner = [Field(1, 2, inner, ANY_DESC)]
        else:  # an ArrayValue: the AnyValue's array_value
            inner = [Field(5, 2, inner, ARRAY_DESC)]
    kv = [Field(1, 2, b"deep"), Field(2, 2, inner, ANY_DESC)]
    return Field(number, 2, kv, KV_DESC)


def mutate(draw: Draw, tree: list[Field], max_depth: int) -> None:
    """Applies a few random wire-level mutations to ``tree`` in place."""
    for _ in range(draw(st.integers(0, 5))):
        fields, desc, level = draw(st.sampled_from(_nodes(tree, REQUEST)))
        kind = draw(
            st.sampled_from(
                ["unknown", "split", "repeat", "utf8", "oneof", "wire_type", "bad", "pad", "deep"]
            )
        )
        pos = draw(st.integers(0, len(fields)))
        event(kind)
        if kind == "unknown":
            number = draw(st.sampled_from([17, 31, 100, 2**29 - 1]) | st.integers(1, 20))
            wire_type = draw(st.sampled_from([0, 1, 2, 3, 5]))
            fields.insert(pos, _value_field(draw, number, wire_type))
        elif kind == "bad":
            bad = draw(st.sampled_from([(0, 0), (0, 2), (3, 4), (3, 6), (3, 7), (0, 3)]))
            fields.insert(pos, Field(bad[0], bad[1], 1 if bad[1] == 0 else b""))
        elif not fields:
            continue
        elif kind == "pad":
            # tags and lengths: up to 5 bytes; varint values: up to 10
            for f in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=3)):
                f.tag_pad = draw(st.sampled_from([0, 1, 3, 4, 5]))
                f.len_pad = draw(st.sampled_from([0, 1, 3, 4, 5, 9]))
        elif kind == "wire_type":
            i = draw(st.integers(0, len(fields) - 1))
            f = fields[i]
            wire_type = draw(st.sampled_from([w for w in (0, 1, 2, 5) if w != f.wire_type]))
            fields[i] = _value_field(draw, f.number, wire_type)
        elif kind == "repeat":
            i = draw(st.integers(0, len(fields) - 1))
            f = fields[i]
            if f.descriptor is None and f.wire_type != 3:
                copy = _value_field(draw, f.number, f.wire_type)
                fields.insert(draw(st.integers(0, len(fields))), copy)
        elif kind == "split":
            i = draw(st.integers(0, len(fields) - 1))
            f = fields[i]
            if f.descriptor is not None and isinstance(f.value, list):
                cut = draw(st.integers(0, len(f.value)))
                second = Field(f.number, 2, f.value[cut:], f.descriptor)
                f.value = f.value[:cut]
                fields.insert(draw(st.integers(i + 1, len(fields))), second)
        elif kind == "utf8":
            strings = [
                f
                for f in fields
                if f.wire_type == 2 and isinstance(f.value, bytes) and f.descriptor is None
            ]
            if strings:
                f = draw(st.sampled_from(strings))
                assert isinstance(f.value, bytes)
                cut = draw(st.integers(0, len(f.value)))
                f.value = f.value[:cut] + draw(st.sampled_from(INVALID_UTF8)) + f.value[cut:]
        elif kind == "oneof" and desc is ANY_DESC:
            member = draw(st.sampled_from([(1, 2), (2, 0), (3, 0), (4, 1), (7, 2), (8, 0)]))
            if draw(st.booleans()):
                kv = Field(1, 2, [Field(1, 2, b"k")], KV_DESC)
                fields.insert(pos, Field(6, 2, [kv], KVLIST_DESC))
            else:
                fields.insert(pos, _value_field(draw, *member))
        elif kind == "deep" and desc in (Span.DESCRIPTOR, Resource.DESCRIPTOR):
            target = draw(
                st.sampled_from([max_depth - 1, max_depth, max_depth + 1, 100, 101, 102, 103])
            )
            number = 9 if desc is Span.DESCRIPTOR else 1  # attributes
            fields.insert(pos, _chain(number, target, level + 1))


@st.composite
def byte_mutations(draw: Draw, data: bytes) -> bytes:
    """Sometimes truncates ``data``, flips, inserts or deletes a few bytes."""
    choice = draw(st.integers(0, 9))
    if not data or choice < 6:
        return data
    if choice == 6:
        return data[: draw(st.integers(0, len(data) - 1))]
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(out) - 1))
        if choice == 7:
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif choice == 8:
            out.insert(i, draw(st.integers(0, 255)))
        elif len(out) > 1:
            del out[i]
    return bytes(out)


LIMIT_CASES = st.sampled_from([None, None, None, 1, 0, -1, -2])
"""max_messages relative to the request's count (None: far above; hypothesis favours the
first choices)."""


def test_scan_answers_as_upb_and_the_limits() -> None:
    seen: Counter[str] = Counter()

    @settings(
        max_examples=examples(600),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        max_depth = data.draw(st.sampled_from([8, 9, 20, 50, 99, 100, 101, 150]))
        tree = decode(data.draw(requests()).SerializeToString())
        mutate(data.draw, tree, max_depth)
        wire = data.draw(byte_mutations(encode(tree)))
        holds = count_messages(wire, REQUEST, 10**9)
        delta = data.draw(LIMIT_CASES)
        max_messages = 10**9 if delta is None else max(holds + delta, 0)
        assert native.count_messages(wire, max_messages) == count_messages(
            wire, REQUEST, max_messages
        )
        scopes = data.draw(st.sampled_from([DERIVE_SCOPES, frozenset(), frozenset({"", "ü"})]))
        keys = data.draw(st.sampled_from([ATTR_KEYS, (), ("k", "k", "")]))
        events = data.draw(
            st.sampled_from([EVENT_KEYS, (), (("e", "k"), ("exception", "exception.type"))])
        )
        split = data.draw(st.sampled_from([SPLIT_SCOPES, frozenset(), frozenset({"", "ü"})]))
        outcome = check_same_answer(
            native, wire, max_depth, max_messages, scopes, keys, events, split
        )
        seen[outcome] += 1

    run()
    # The generator reaches every answer (else this test could not fail where it matters).
    assert set(seen) == {"accepted", "DecodeError", "TooDeep", "TooManyMessages"}, seen
    assert seen["accepted"] >= sum(seen.values()) // 5, seen


def test_count_port_agrees_on_arbitrary_bytes() -> None:
    """``count_messages`` on garbage too: the scan relies on its port for corrupt input."""

    @settings(max_examples=examples(400), deadline=None, database=None)
    @given(st.binary(max_size=64), st.integers(0, 40))
    def run(data: bytes, limit: int) -> None:
        assert native.count_messages(data, limit) == count_messages(data, REQUEST, limit)
        check_same_answer(native, data, 100, limit)

    run()
