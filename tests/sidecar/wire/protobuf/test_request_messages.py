"""``limits.max_request_messages``: messages are counted on the wire before decoding,
exactly, and only for requests large enough to hold more than the limit."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import Message
from gym_sidecar.core.signals import SPECS
from gym_sidecar.core.stage import Signal
from gym_sidecar.receiver.request import BadRequest, decode_json, decode_protobuf
from gym_sidecar.wire.protobuf.bounds import count_messages, json_values_exceed

from testkit.otlp_samples import logs_request, metrics_request, trace_request
from tests.badinput.test_fuzz_receivers import field


def walk_count(message: Message) -> int:
    """Messages in ``message`` by walking the decoded tree (the reference)."""
    total = 1
    for fd, value in message.ListFields():
        if fd.message_type is None:
            continue
        for child in (value,) if isinstance(value, Message) else value:
            total += walk_count(child)
    return total


@pytest.mark.parametrize(
    "request_",
    [trace_request("t", 64), metrics_request("m", 20), logs_request("l", 20)],
    ids=["traces", "metrics", "logs"],
)
def test_wire_count_matches_the_decoded_tree(request_: Any) -> None:
    data = request_.SerializeToString()
    assert count_messages(data, request_.DESCRIPTOR, 10**9) == walk_count(request_)


def test_count_stops_past_the_limit() -> None:
    empty_spans = field(1, field(2, b"\x12\x00" * 50_000))
    spec = SPECS[Signal.TRACES]
    assert count_messages(empty_spans, spec.request_type.DESCRIPTOR, 1000) == 1001


def test_empty_span_flood_refused_before_decoding() -> None:
    """200k empty spans (400 KB on the wire, ~35 MB decoded): refused at 100k."""
    body = field(1, field(2, b"\x12\x00" * 200_000))
    spec = SPECS[Signal.TRACES]
    with pytest.raises(BadRequest) as info:
        decode_protobuf(spec, body, max_messages=100_000)
    assert info.value.reason == "too_many_messages"
    assert info.value.limit == "max_request_messages"
    decoded = decode_protobuf(spec, body, max_messages=300_000)  # within a higher limit
    assert spec.count(decoded) == 200_000


def test_small_requests_are_not_scanned() -> None:
    """At most 2 x limit bytes cannot hold more than ``limit`` messages: not counted."""
    body = field(1, field(2, b"\x12\x00" * 10))
    assert len(body) <= 2 * 30
    decode_protobuf(SPECS[Signal.TRACES], body, max_messages=30)


def test_json_value_bound() -> None:
    spec = SPECS[Signal.TRACES]
    flood = b'{"resourceSpans":[' + b"{}," * 100_000 + b"{}]}"
    assert json_values_exceed(flood, 50_000)
    with pytest.raises(BadRequest) as info:
        decode_json(spec, flood, max_messages=50_000)
    assert info.value.reason == "too_many_messages"
    assert "JSON values" in str(info.value)
    decoded = decode_json(spec, flood, max_messages=300_000)
    assert len(decoded.resource_spans) == 100_001  # type: ignore[attr-defined]


def test_an_unknown_group_does_not_end_the_count() -> None:
    """upb keeps an unknown group (wire type 3) and parses on; the count skips the group
    and goes on too, so a group in front of a span flood does not hide the flood."""
    group = b"\x13" + field(1, b"") + b"\x1b\x1c\x14"  # field 2 { field 1 {} field 3 {} }
    body = group + field(1, field(2, b"\x12\x00" * 50_000))
    spec = SPECS[Signal.TRACES]
    assert count_messages(body, spec.request_type.DESCRIPTOR, 10**9) == 50_003
    with pytest.raises(BadRequest) as info:
        decode_protobuf(spec, body, max_messages=10_000)
    assert info.value.reason == "too_many_messages"
    decoded = decode_protobuf(spec, body, max_messages=60_000)
    assert spec.count(decoded) == 50_000


def test_a_malformed_group_ends_the_count_for_the_parser_to_refuse() -> None:
    spec = SPECS[Signal.TRACES]
    unclosed = field(1, b"") + b"\x13" + field(1, b"")
    assert count_messages(unclosed, spec.request_type.DESCRIPTOR, 10) == 2
    mismatched = b"\x13\x1c" + field(1, b"")
    assert count_messages(mismatched, spec.request_type.DESCRIPTOR, 10) == 1
    with pytest.raises(BadRequest) as info:
        decode_protobuf(spec, mismatched)
    assert info.value.reason == "bad_request"
