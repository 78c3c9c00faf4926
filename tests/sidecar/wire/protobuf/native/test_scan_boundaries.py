"""Hand-written cases for the native scan at every boundary of its contract: upb's wire
rules and depth limit, the configured depth and message count, the receiver's order of
refusals, protobuf's merge semantics in the index and derive tuples, and the schema
compiled in against the installed opentelemetry-proto."""

from __future__ import annotations

import re

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from gym_sidecar.core.traces import ResourceBlock, ScopeBlock, TraceRequest
from gym_sidecar.wire.protobuf.bounds import count_messages, message_depth_exceeds
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from bench.loadgen import build_requests
from tests.sidecar.wire.protobuf.native.support import (
    ATTR_KEYS,
    PARSER_LEVELS,
    REQUEST,
    Field,
    Refused,
    check_same_answer,
    decode,
    encode,
    import_native,
    scan,
    varint,
)

native = import_native()


def ld(number: int, body: bytes) -> bytes:
    """A length-delimited field."""
    return varint(number << 3 | 2) + varint(len(body)) + body


def span_request(span: bytes, scope: str = "gym_telemetry.verify") -> bytes:
    """A request of one resource, one scope named ``scope``, one span of body ``span``."""
    scope_spans = ld(1, ld(1, scope.encode())) + ld(2, span)
    return ld(1, ld(2, scope_spans))


def at_level(level: int, inner: bytes = b"", tail: bytes = b"") -> bytes:
    """A request whose innermost message, holding ``inner``, is at ``level`` (>= 5):
    request, ResourceSpans, Resource, KeyValue, AnyValue, then ArrayValue and AnyValue
    alternating. ``tail`` ends the level-5 AnyValue."""
    body = inner
    for lvl in range(level, 5, -1):
        body = ld(5, body) if (lvl - 5) % 2 else ld(1, body)
    return ld(1, ld(1, ld(1, ld(2, body + tail))))  # request, RS, resource, KV.value


def upb(data: bytes) -> str:
    try:
        ExportTraceServiceRequest.FromString(data)
    except DecodeError as exc:
        return str(exc).rsplit(": ", 1)[-1]
    return "ok"


def derived(
    data: bytes,
    keys: tuple[str, ...] = ATTR_KEYS,
    event_keys: tuple[tuple[str, str], ...] = (),
) -> list[tuple[object, ...]]:
    got = scan(native, data, attr_keys=keys, event_keys=event_keys)
    assert not isinstance(got, Refused), got
    [block] = got[0]
    [scope] = block.scopes
    assert scope.derived is not None
    return scope.derived


# --- depth ------------------------------------------------------------------------------


def test_upb_itself_allows_101_levels() -> None:
    """What upb does: the request and 100 levels under it; level 102 is MaxDepth."""
    assert upb(at_level(PARSER_LEVELS)) == "ok"
    assert upb(at_level(PARSER_LEVELS + 1)) == "Exceeded upb_DecodeOptions_MaxDepth"
    parsed = ExportTraceServiceRequest.FromString(at_level(PARSER_LEVELS))
    assert message_depth_exceeds(parsed, 100)
    assert not message_depth_exceeds(parsed, 101)


@pytest.mark.parametrize("max_depth", [8, 9, 50, 99, 100, 101, 1000])
def test_depth_limit_is_max_depth_below_100_and_upbs_101_from_there(max_depth: int) -> None:
    """The receiver walks the parsed request for a configured depth only below 100 and
    leaves the rest to upb, whose bound is 101 levels (docs/native.md)."""
    limit = max_depth if max_depth < 100 else PARSER_LEVELS
    for level in range(max(min(limit, 100) - 1, 5), 104):
        got = scan(native, at_level(level), max_depth=max_depth)
        if level <= limit:
            assert not isinstance(got, Refused), level
        else:
            assert got == Refused("TooDeep"), level
        check_same_answer(native, at_level(level), max_depth)


def test_too_deep_message_names_the_limit() -> None:
    with pytest.raises(native.TooDeep, match="deeper than 20 message levels"):
        native.scan_traces(at_level(21), 20, 10**6, frozenset(), (), ResourceBlock, ScopeBlock)
    with pytest.raises(native.TooDeep, match=r"deeper than 100 message levels \(the message at"):
        native.scan_traces(at_level(102), 100, 10**6, frozenset(), (), ResourceBlock, ScopeBlock)


def test_a_replaced_oneof_member_does_not_count_for_depth() -> None:
    """A deep kvlist that a later AnyValue member replaces is not in the parsed tree, so
    ``message_depth_exceeds`` does not see it; across two ``value`` fields of one
    KeyValue too (protobuf merges them). upb's own limit counts the wire."""
    deep = at_level(40)
    assert scan(native, deep, max_depth=20) == Refused("TooDeep")
    # the same request with string_value appended to the level-5 AnyValue
    kv_value = ld(2, ld(5, b"") + ld(1, b"x"))  # array_value, then string_value
    replaced = ld(1, ld(1, ld(1, kv_value)))
    assert check_same_answer(native, replaced, 6) == "accepted"
    two_values = ld(1, ld(1, ld(1, ld(2, ld(5, ld(1, b""))) + ld(2, b"\x18\x00"))))
    assert check_same_answer(native, two_values, 6) == "accepted"
    # the same member twice merges: the deeper one still counts
    merged = ld(1, ld(1, ld(1, ld(2, ld(5, ld(1, ld(5, b"")))) + ld(2, ld(5, b"")))))
    assert check_same_answer(native, merged, 7) == "TooDeep"
    # past upb's limit the replaced member is refused all the same
    assert check_same_answer(native, at_level(40, tail=ld(1, b"x")), 20) == "accepted"
    assert check_same_answer(native, at_level(102, tail=ld(1, b"x"))) == "TooDeep"


def test_groups_count_as_levels_and_overflow_as_corrupt() -> None:
    """Nested unknown groups: messages and groups together up to 101 levels; past that
    upb says the wire format is corrupt (not MaxDepth)."""

    def groups(n: int) -> bytes:
        return b"\x7b" * n + b"\x7c" * n  # field 15, start and end

    assert upb(groups(100)) == "ok"
    assert upb(groups(101)) == "Wire format was corrupt"
    assert check_same_answer(native, groups(100)) == "accepted"
    assert check_same_answer(native, groups(101)) == "DecodeError"
    for level in (5, 50, 100, 101):
        for n in (PARSER_LEVELS - level, PARSER_LEVELS - level + 1):
            data = at_level(level, groups(n))
            check_same_answer(native, data)
            assert (upb(data) == "ok") == (level + n <= PARSER_LEVELS)


# --- message count ------------------------------------------------------------------------


def test_message_count_boundary() -> None:
    data = ld(1, ld(2, b"\x12\x00" * 200))  # request, RS, SS, 200 spans: 203 messages
    assert count_messages(data, REQUEST, 1000) == 203
    assert len(data) > 2 * 202
    assert check_same_answer(native, data, max_messages=203) == "accepted"
    assert check_same_answer(native, data, max_messages=202) == "TooManyMessages"
    with pytest.raises(native.TooManyMessages, match="more than 202 protobuf messages"):
        native.scan_traces(data, 100, 202, frozenset(), (), ResourceBlock, ScopeBlock)


def test_bodies_up_to_twice_the_limit_are_not_counted() -> None:
    """As the receiver: a body of at most 2 x the limit bytes is not counted; it holds at
    most limit + 1 messages (here exactly: 10 empty ResourceSpans and the request)."""
    data = b"\x0a\x00" * 10
    assert count_messages(data, REQUEST, 100) == 11
    assert check_same_answer(native, data, max_messages=10) == "accepted"
    assert check_same_answer(native, data, max_messages=9) == "TooManyMessages"


def test_count_comes_first_on_a_corrupt_request() -> None:
    """The receiver counts before parsing, in count_messages' order (a message's fields,
    then its last child first): a fault it meets only after passing the limit is a
    TooManyMessages, one it meets before is upb's refusal."""
    spans = b"\x12\x00" * 10
    # wire type 6 in the first block: count_messages reads the second one first
    fault_late = ld(1, ld(2, b"\x12\x00\x0e")) + ld(1, ld(2, spans))
    assert count_messages(fault_late, REQUEST, 8) == 9
    assert check_same_answer(native, fault_late, max_messages=8) == "TooManyMessages"
    fault_top = ld(1, ld(2, spans)) + b"\x0e"  # at the top level, seen before the spans
    assert count_messages(fault_top, REQUEST, 8) == 2
    assert check_same_answer(native, fault_top, max_messages=8) == "DecodeError"
    too_deep = ld(1, ld(2, spans)) + at_level(102)
    assert check_same_answer(native, too_deep, max_messages=8) == "TooManyMessages"
    assert check_same_answer(native, too_deep) == "TooDeep"


# --- wire format --------------------------------------------------------------------------

WIRE_CASES = {
    "empty": b"",
    "field 0": b"\x00\x01",
    "field 0 in a group": b"\x13\x00\x01\x02\x00\x03\x04\x14",
    "field 0 group at the top": b"\x03\x04",
    "wire type 6": b"\x0e",
    "wire type 7": b"\x0f",
    "end group outside": b"\x0c",
    "end group in a message": ld(1, b"\x0c"),
    "group": b"\x13\x08\x01\x1b\x1c\x14",
    "group of a known field number": b"\x0b\x0c",
    "group mismatched": b"\x13\x1c",
    "group unclosed": b"\x13",
    "group across a message end": ld(1, b"\x1b") + b"\x1c",
    "varint of 10 bytes": b"\x10" + b"\xff" * 9 + b"\x7f",
    "varint of 11 bytes": b"\x10" + b"\xff" * 10 + b"\x01",
    "tag of 5 bytes": b"\x90\x80\x80\x80\x00\x01",
    "tag of 6 bytes": b"\x90\x80\x80\x80\x80\x00\x01",
    "tag above 2^32": b"\x90\x80\x80\x80\x10\x01",
    "highest field number": varint((2**29 - 1) << 3) + b"\x01",
    "length past the end": b"\x0a\x05\x00",
    "length 2^31 - 1": b"\x1a" + varint(2**31 - 1),
    "length of 5 bytes": b"\x1a" + b"\x80" * 4 + b"\x00",
    "length of 6 bytes": b"\x1a" + b"\x80" * 5 + b"\x00",
    "length of 6 bytes in a group": b"\x13\x0a" + b"\x80" * 5 + b"\x00\x14",
    "varint past its message": b"\x0a\x02\x18\x96\x01",
    "tag past its message": b"\x0a\x01\x98\x01\x00",
    "fixed64 past its message": b"\x0a\x03\x19\x00\x00" + b"\x00" * 6,
    "fixed32 truncated": b"\x15\x00\x00",
    "resource_spans as a varint": b"\x08\x01",
    "bad UTF-8 in schema_url": ld(1, ld(3, b"\xff")),
    "bad UTF-8 in an unknown field": ld(1, ld(5, b"\xff")),
    "bad UTF-8 in bytes": span_request(ld(1, b"\xff")),
    "surrogate": ld(1, ld(3, b"\xed\xa0\x80")),
    "overlong": ld(1, ld(3, b"\xc0\x80")),
    "past U+10FFFF": ld(1, ld(3, b"\xf4\x90\x80\x80")),
    "4-byte UTF-8": ld(1, ld(3, "𝄞".encode())),
    "truncated UTF-8": ld(1, ld(3, "é".encode()[:1])),
}


@pytest.mark.parametrize("name", sorted(WIRE_CASES))
def test_wire_rules_as_upb(name: str) -> None:
    data = WIRE_CASES[name]
    outcome = check_same_answer(native, data)
    assert (outcome == "accepted") == (upb(data) == "ok")


def test_decode_error_is_upbs_message_with_what_and_where() -> None:
    """The message is upb's own (the receiver answers the same text whichever scanner
    ran); ``detail`` and ``offset`` say what is wrong and where."""
    corrupt = ld(1, b"") + b"\x0a\x00\x0e"
    with pytest.raises(native.DecodeError) as info:
        native.scan_traces(corrupt, 100, 10**6, frozenset(), (), ResourceBlock, ScopeBlock)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == upb_error(corrupt)
    assert info.value.offset == 4
    assert "wire type" in info.value.detail and "at byte 4" in info.value.detail
    bad_name = span_request(ld(5, b"\xff"))
    with pytest.raises(native.DecodeError) as info:
        native.scan_traces(bad_name, 100, 10**6, frozenset(), (), ResourceBlock, ScopeBlock)
    assert str(info.value) == upb_error(bad_name)
    assert re.fullmatch(
        r"string field Span\.name is not valid UTF-8, at byte \d+", info.value.detail
    )
    assert bad_name[info.value.offset] == 0x2A  # the name field's tag


def upb_error(data: bytes) -> str:
    with pytest.raises(DecodeError) as info:
        ExportTraceServiceRequest.FromString(data)
    return str(info.value)


def _paths() -> dict[str, list[tuple[int, Descriptor]]]:
    """For every message type of the schema, one path of (field number, type) to it."""
    paths: dict[str, list[tuple[int, Descriptor]]] = {REQUEST.full_name: []}
    todo = [REQUEST]
    while todo:
        desc = todo.pop(0)
        for fd in desc.fields:
            child = fd.message_type
            if child is not None and child.full_name not in paths:
                paths[child.full_name] = [*paths[desc.full_name], (fd.number, child)]
                todo.append(child)
    return paths


def _nest(path: list[tuple[int, Descriptor]], body: bytes) -> bytes:
    for number, _ in reversed(path):
        body = ld(number, body)
    return body


def _string_fields() -> list[tuple[str, int]]:
    return [
        (desc.full_name, fd.number)
        for desc in {REQUEST, *[p[-1][1] for p in _paths().values() if p]}
        for fd in desc.fields
        if fd.type == FieldDescriptor.TYPE_STRING
    ]


@pytest.mark.parametrize(("message", "number"), sorted(_string_fields()))
def test_every_string_field_is_checked_for_utf8(message: str, number: int) -> None:
    path = _paths()[message]
    good = _nest(path, ld(number, "ünï".encode()))
    bad = _nest(path, ld(number, b"ok\xff"))
    assert check_same_answer(native, good) == "accepted"
    assert check_same_answer(native, bad) == "DecodeError"
    assert upb(bad) == "String field had bad UTF-8"


def test_every_field_with_every_wire_type() -> None:
    """Each field of each message, with its own wire type and the three others: a field of
    the schema with another wire type is an unknown field to upb and to the scan."""
    values = {0: varint(2**64 - 1), 1: b"\xff" * 8, 5: b"\x01\x02\x03\x04", 2: ld(0, b"")[1:]}
    outcomes = set()
    for name, path in _paths().items():
        desc = path[-1][1] if path else REQUEST
        assert desc.full_name == name
        for fd in desc.fields:
            for wire_type, value in values.items():
                body = varint(fd.number << 3 | wire_type) + value
                outcomes.add(check_same_answer(native, _nest(path, body)))
    assert outcomes == {"accepted"}


# --- the index and the derive tuples --------------------------------------------------


def test_index_of_a_request() -> None:
    unknown = ld(9, b"x")
    rs = ld(1, ld(1, ld(1, b"k"))) + ld(3, b"url") + ld(2, ld(1, ld(1, b"s"))) + unknown
    data = b"\x10\x01" + ld(1, rs) + ld(1, b"") + b"\x08\x05"
    got = scan(native, data)
    assert not isinstance(got, Refused)
    blocks, other = got
    assert other == [(0, 2), (len(data) - 2, len(data))]
    first, second = blocks
    assert (first.start, first.end) == (2, 2 + 2 + len(rs))
    assert first.resource == ld(1, ld(1, b"k"))
    assert [(s.name, s.spans, s.derived) for s in first.scopes] == [("s", 0, None)]
    assert len(first.other) == 2  # schema_url and the unknown field
    assert second.resource is None
    assert second.scopes == []
    assert check_same_answer(native, data) == "accepted"


def test_merged_messages_in_the_index() -> None:
    """``resource`` twice: the bodies concatenated (protobuf merges them); ``scope`` twice:
    the last name wins, a scope without a name keeps the earlier one."""
    rs = ld(1, ld(1, ld(1, b"a"))) + ld(2, ld(1, ld(1, b"first")) + ld(1, b"")) + ld(1, b"\x10\x07")
    data = ld(1, rs)
    [block], _ = scan(native, data)
    assert block.resource == ld(1, ld(1, b"a")) + b"\x10\x07"
    assert block.scopes[0].name == "first"
    two_names = ld(1, ld(2, ld(1, ld(1, b"first")) + ld(1, ld(1, b"second"))))
    [block], _ = scan(native, two_names)
    assert block.scopes[0].name == "second"
    assert check_same_answer(native, data) == "accepted"
    assert check_same_answer(native, two_names) == "accepted"


def test_derive_tuple_of_an_empty_span_is_protobuf_defaults() -> None:
    assert derived(span_request(b"")) == [("", 0, 0, b"", b"", 0, (None, None, None))]


def test_derive_tuple_last_occurrence_wins_and_status_merges() -> None:
    span = (
        ld(5, b"first")
        + b"\x39"
        + (5).to_bytes(8, "little")
        + ld(5, b"gym.verify")
        + b"\x39"
        + (7).to_bytes(8, "little")
        + ld(15, b"\x18\x02")  # status.code = 2
        + ld(15, ld(2, b"message only"))  # merged: the code stays
        + b"\x28\x05"  # name (field 5) as a varint: an unknown field
    )
    assert derived(span_request(span)) == [("gym.verify", 7, 0, b"", b"", 2, (None,) * 3)]
    assert check_same_answer(native, span_request(span)) == "accepted"


def test_an_empty_status_after_a_code_keeps_the_code() -> None:
    """``status`` twice merges: an empty second Status (UNSET, as SDKs write it) leaves
    the code of the first."""
    span = ld(15, b"\x18\x02") + ld(15, b"")
    assert derived(span_request(span))[0][5] == 2
    assert check_same_answer(native, span_request(span)) == "accepted"


def test_status_code_is_an_int32() -> None:
    span = ld(15, b"\x18" + varint(2**64 - 1)) + ld(15, b"\x18" + varint(2**32 + 5))
    [(_, _, _, _, _, code, _)] = derived(span_request(span))
    assert code == 5
    assert derived(span_request(ld(15, b"\x18" + varint(2**64 - 1))))[0][5] == -1


def _attr(key: str, value: AnyValue | None = None) -> bytes:
    kv = KeyValue(key=key)
    if value is not None:
        kv.value.CopyFrom(value)
    return ld(9, kv.SerializeToString())


def test_derive_values_every_kind() -> None:
    keys = ("s", "b", "i", "d", "y", "x", "a", "l", "u", "none")
    span = b"".join(
        [
            _attr("s", AnyValue(string_value="ok ✓")),
            _attr("b", AnyValue(bool_value=True)),
            _attr("i", AnyValue(int_value=-(2**63))),
            _attr("d", AnyValue(double_value=-0.0)),
            _attr("y", AnyValue(bytes_value=b"\x00\xff")),
            _attr("x", AnyValue(string_value_strindex=-3)),
            _attr("a", AnyValue(array_value={"values": [AnyValue(int_value=1)]})),
            _attr("l", AnyValue(kvlist_value={"values": [KeyValue(key="k")]})),
            _attr("u", AnyValue()),
        ]
    )
    [(_, _, _, _, _, _, values)] = derived(span_request(span), keys)
    assert values == ("ok ✓", True, -(2**63), -0.0, b"\x00\xff", -3, None, None, None, None)
    assert [type(v) for v in values[:6]] == [str, bool, int, float, bytes, int]
    assert check_same_answer(native, span_request(span), attr_keys=keys) == "accepted"


def test_derive_values_last_attribute_and_last_member() -> None:
    """The last attribute with the key decides, even when its value is unset; within one
    AnyValue, the member set last is the value (also across two ``value`` fields)."""
    span = _attr("b", AnyValue(bool_value=False)) + _attr("b")
    assert derived(span_request(span), ("b",))[0][6] == (None,)
    kv = ld(1, b"b") + ld(2, ld(1, b"text") + b"\x10\x01") + ld(2, b"\x18\x09")
    assert derived(span_request(ld(9, kv)), ("b",))[0][6] == (9,)
    kv = ld(1, b"b") + ld(2, b"\x10\x01") + ld(2, b"")  # an empty second value merges
    assert derived(span_request(ld(9, kv)), ("b",))[0][6] == (True,)
    keyless = ld(9, ld(2, b"\x10\x01"))  # no key: the key is ""
    assert derived(span_request(keyless), ("", "b"))[0][6] == (True, None)
    for data, keys in [
        (span_request(span), ("b",)),
        (span_request(ld(9, kv)), ("b", "b")),
        (span_request(keyless), ("",)),
    ]:
        assert check_same_answer(native, data, attr_keys=keys) == "accepted"


def _event(name: bytes | None, *attrs: bytes, tag_pad: bool = False) -> bytes:
    """A span's ``events`` field: the event's ``name`` (omitted for None) after its
    attributes (``_attr`` fields re-tagged as Event.attributes, field 3)."""
    body = b"".join(b"\x1a" + a[1:] for a in attrs)
    if name is not None:
        body += ld(2, name)
    tag = b"\xda\x00" if tag_pad else b"\x5a"  # field 11, wire type 2; padded or not
    return tag + varint(len(body)) + body


EXC = (("exception", "exception.type"),)


def test_event_values_are_the_last_event_of_that_name_with_the_key() -> None:
    """Gym's own telemetry's failure: an ``exception`` event's ``exception.type``. The
    name may follow the attributes; a later event without the key leaves the value; a
    later one with it replaces it; an event of another name is not read; a non-minimal
    tag reads the same; a span whose status is not ERROR has no event values."""
    typ = AnyValue(string_value="a.B")
    other = AnyValue(string_value="c.D")
    cases: list[tuple[bytes, object]] = [
        (_event(b"exception", _attr("exception.type", typ)), "a.B"),
        (_event(b"exception", _attr("exception.type", typ), tag_pad=True), "a.B"),
        (_event(b"log", _attr("exception.type", typ)), None),
        (_event(None, _attr("exception.type", typ)), None),
        (
            _event(b"exception", _attr("exception.type", typ))
            + _event(b"exception", _attr("exception.message", other)),
            "a.B",
        ),
        (
            _event(b"exception", _attr("exception.type", typ))
            + _event(b"exception", _attr("exception.type", other)),
            "c.D",
        ),
        (
            _event(b"exception", _attr("exception.type", typ), _attr("exception.type", other)),
            "c.D",
        ),
        (_event(b"exception", _attr("exception.type", AnyValue(int_value=3))), 3),
        (_event(b"exception", _attr("exception.type")), None),
    ]
    error = ld(15, b"\x18\x02")  # status.code = ERROR
    for span, want in cases:
        for status, expected in ((error, want), (b"", None), (ld(15, b"\x18\x01"), None)):
            body = ld(5, b"gym.verify") + span + status
            data = span_request(body, scope="nemo.lens.helpers")
            assert derived(data, (), EXC)[0][6] == (expected,), span.hex()
            assert check_same_answer(native, data, attr_keys=(), event_keys=EXC) == "accepted"
    # the status may come first, or twice (merged)
    event = _event(b"exception", _attr("exception.type", typ))
    data = span_request(error + event + ld(15, b""), scope="nemo.lens.helpers")
    assert derived(data, (), EXC)[0][6] == ("a.B",)


def test_a_split_scope_reports_each_span_field() -> None:
    """``split``: every span's name (the last ``name`` field) and field bytes, also with
    other fields between the spans and a non-minimal tag."""
    first = ld(5, b"gym.verify")
    second = ld(5, b"x") + ld(5, b"gym.model.responses")
    scope_spans = (
        ld(1, ld(1, b"nemo.lens.helpers"))
        + ld(2, first)
        + ld(3, b"schema")
        + b"\x92\x00"
        + varint(len(second))
        + second
    )
    data = ld(1, ld(2, scope_spans))
    [block], _ = scan(native, data)
    [scope] = block.scopes
    assert scope.split is not None
    assert [name for name, _, _ in scope.split] == ["gym.verify", "gym.model.responses"]
    assert check_same_answer(native, data) == "accepted"


def test_only_named_scopes_are_derived() -> None:
    data = span_request(ld(5, b"gym.rollout"), scope="gym_telemetry.server")
    [block], _ = scan(native, data)
    assert block.scopes[0].derived is None
    [block], _ = scan(
        native, data, derive_scopes=frozenset({"gym_telemetry.server"}), event_keys=()
    )
    assert block.scopes[0].derived == [("gym.rollout", 0, 0, b"", b"", 0, (None, None, None))]
    no_scope = ld(1, ld(2, ld(2, b"")))
    [block], _ = scan(native, no_scope, derive_scopes=frozenset({""}), event_keys=())
    assert block.scopes[0].name == ""
    assert block.scopes[0].derived == [("", 0, 0, b"", b"", 0, (None, None, None))]


@pytest.mark.parametrize("load", ["rollouts", "derive-heavy", "varied"])
def test_bench_loads(load: str) -> None:
    """The benchmark's own requests: accepted, indexed as upb parses them, and a request
    without the dropped block splices to what upb gives after removing it."""
    for data, spans in build_requests(128, 7, 3, load):
        assert check_same_answer(native, data) == "accepted"
        got = scan(native, data)
        assert not isinstance(got, Refused)
        request = TraceRequest(data, *got)
        assert request.span_count() == spans
        dropped = request.blocks[0].scopes.pop(0)
        request.blocks[0].edited = True
        msg = ExportTraceServiceRequest.FromString(data)
        del msg.resource_spans[0].scope_spans[0]
        assert ExportTraceServiceRequest.FromString(request.SerializeToString()) == msg
        assert dropped.spans > 0


# --- arguments and the schema --------------------------------------------------------------


def test_huge_and_negative_limits() -> None:
    data = ld(1, b"")
    assert check_same_answer(native, data, 2**100, 2**100) == "accepted"
    assert scan(native, data, max_messages=-(2**100)) == Refused("TooManyMessages")
    assert scan(native, data, max_depth=-5) == Refused("TooDeep")
    assert not isinstance(scan(native, b"", max_depth=-5), Refused)


def test_argument_types() -> None:
    with pytest.raises(TypeError):
        native.scan_traces(bytearray(b""), 100, 1, frozenset(), (), ResourceBlock, ScopeBlock)
    with pytest.raises(TypeError):
        native.scan_traces(b"", 100, 1, {"set"}, (), ResourceBlock, ScopeBlock)
    with pytest.raises(TypeError):
        native.scan_traces(b"", 100, 1, frozenset(), (b"key",), ResourceBlock, ScopeBlock)


def _kind(fd: FieldDescriptor) -> str:
    t = FieldDescriptor
    if fd.type == t.TYPE_MESSAGE:
        return "message"
    if fd.type == t.TYPE_STRING:
        return "string"
    if fd.type == t.TYPE_BYTES:
        return "bytes"
    if fd.type in (t.TYPE_FIXED64, t.TYPE_DOUBLE, t.TYPE_SFIXED64):
        return "fixed64"
    if fd.type in (t.TYPE_FIXED32, t.TYPE_FLOAT, t.TYPE_SFIXED32):
        return "fixed32"
    return "varint"


def test_compiled_schema_matches_the_installed_descriptors() -> None:
    """The scan's schema is compiled in; opentelemetry-proto may add fields (a new string
    would go unchecked for UTF-8). Also what the scan assumes of the schema: no packed
    repeated scalars, one oneof (AnyValue.value), the int types it reads as it reads them."""
    want = []
    oneofs = []
    for name, path in _paths().items():
        desc = path[-1][1] if path else REQUEST
        oneofs += [f"{name}.{o.name}" for o in desc.oneofs]
        for fd in desc.fields:
            child = fd.message_type.full_name if fd.message_type else None
            want.append((name, fd.number, fd.name, _kind(fd), child))
            assert not (fd.is_repeated and _kind(fd) in ("varint", "fixed64", "fixed32"))
    assert sorted(native.schema()) == sorted(want)
    assert oneofs == ["opentelemetry.proto.common.v1.AnyValue.value"]
    span, any_value = Span.DESCRIPTOR, AnyValue.DESCRIPTOR
    t = FieldDescriptor
    assert any_value.fields_by_name["int_value"].type == t.TYPE_INT64
    assert any_value.fields_by_name["string_value_strindex"].type == t.TYPE_INT32
    assert span.fields_by_name["status"].message_type.fields_by_name["code"].type == t.TYPE_ENUM
    assert span.fields_by_name["start_time_unix_nano"].type == t.TYPE_FIXED64


def test_decode_and_encode_round_trip() -> None:
    """The tests' wire tree (support.py) reproduces what it decodes."""
    for data, _ in build_requests(32, 3, 1, "varied"):
        assert encode(decode(data)) == data
    assert Field(1, 3, [Field(0, 0, 1)]).encode() == b"\x0b\x00\x01\x0c"


def test_derive_fields_whatever_the_order_and_encoding() -> None:
    """The pass records derive fields while it reads the spans of a scope it knows to be
    derived; a scope field after the spans, a name changed by a later scope field, or a
    field in an unusual encoding must give the same tuples as upb's parse."""
    span = (
        ld(5, b"gym.verify")
        + ld(1, b"t" * 16)
        + _attr("gym.verify.succeeded", AnyValue(bool_value=False))
    )
    verify, server = ld(1, ld(1, b"gym_telemetry.verify")), ld(1, ld(1, b"gym_telemetry.server"))
    padded_name = b"\xaa\x80\x00" + varint(11) + b"gym.rollout"  # field 5 in a 3-byte tag
    cases = [
        ld(2, span) + verify,  # the scope after its spans
        verify + ld(2, span) + server,  # derived while read, then renamed: not derived
        server + ld(2, span) + verify,  # renamed into a derived scope
        verify + ld(2, span + ld(15, ld(2, b"m") + b"\x18\x02")),  # a status with a message
        verify + ld(2, padded_name + ld(9, ld(1, b"error.type") + ld(2, b"")) + span),
        verify + ld(2, span + b"\x7b\x7c"),  # an unknown group in the span
    ]
    for scope_spans in cases:
        assert check_same_answer(native, ld(1, ld(2, scope_spans))) == "accepted"
