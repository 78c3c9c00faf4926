"""What the native scanner's tests share: the import (skip or fail), the reference
answer, the comparison of an index with a parsed request, and a wire-level tree to mutate
requests with.

The reference is the receiver's own protobuf decoding, ``wire.protobuf.decode.decode_protobuf``
(``limits.count_messages`` for bodies over 2 x the limit, then upb's ``ParseFromString``,
then ``limits.message_depth_exceeds`` when the configured depth is below 100), which the
pure-Python scanner runs too: the two scanners agree on every input.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from gym_sidecar.core.signals import SPECS
from gym_sidecar.core.stage import Signal
from gym_sidecar.core.traces import ResourceBlock, ScopeBlock, TraceRequest
from gym_sidecar.wire.protobuf.decode import BadRequest, decode_protobuf
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

REQUEST = ExportTraceServiceRequest.DESCRIPTOR
SPEC = SPECS[Signal.TRACES]
DERIVE_SCOPES = frozenset(
    {
        "gym_telemetry.rollout",
        "gym_telemetry.verify",
        "nemo.lens.helpers",
        "gym_telemetry.http_client",
    }
)
ATTR_KEYS = ("nemo.gym.rollout.nested", "gym.verify.succeeded", "error.type")
SPARSE_SCOPES = frozenset({"gym_telemetry.http_client"})
"""Derive scopes read sparsely (``ScanSpec.sparse_scopes``): the spans with a value for
one of :data:`SPARSE_KEYS` only."""
SPARSE_KEYS = ("error.type",)
EVENT_KEYS = (("exception", "exception.type"),)
SPLIT_SCOPES = frozenset({"nemo.lens.helpers"})
PARSER_LEVELS = 101
"""What upb really allows: the request and 100 levels under it."""


def import_native() -> ModuleType:
    """``gym_sidecar_native``; skips the calling test module where it is not installed,
    unless ``GYM_TEST_NATIVE=required`` (scripts/test.sh sets it: make test builds it)."""
    try:
        import gym_sidecar_native
    except ImportError as exc:
        if os.environ.get("GYM_TEST_NATIVE") == "required":
            raise RuntimeError(
                "GYM_TEST_NATIVE=required but gym_sidecar_native does not import"
            ) from exc
        pytest.skip(
            "the native scanner gym_sidecar_native is not installed (it is optional; "
            "`uv sync --frozen --group native` builds it, as make test does)",
            allow_module_level=True,
        )
    return gym_sidecar_native


# --- the reference ----------------------------------------------------------------------


@dataclass
class Refused:
    kind: str
    """``DecodeError``, ``TooDeep`` or ``TooManyMessages``."""


def reference(
    data: bytes, max_depth: int = 100, max_messages: int = 10**9
) -> ExportTraceServiceRequest | Refused:
    """What the scan must answer for ``data``: the parsed request or the refusal."""
    try:
        msg = decode_protobuf(SPEC, data, max_depth, max_messages)
    except BadRequest as exc:
        return Refused(_KINDS.get(exc.reason, "DecodeError"))
    assert isinstance(msg, ExportTraceServiceRequest)
    return msg


_KINDS = {"too_deep": "TooDeep", "too_many_messages": "TooManyMessages"}


def scan(
    native: ModuleType,
    data: bytes,
    max_depth: int = 100,
    max_messages: int = 10**9,
    derive_scopes: frozenset[str] = DERIVE_SCOPES,
    attr_keys: tuple[str, ...] = ATTR_KEYS,
    event_keys: tuple[tuple[str, str], ...] = EVENT_KEYS,
    split_scopes: frozenset[str] = SPLIT_SCOPES,
    sparse_scopes: frozenset[str] = SPARSE_SCOPES,
    sparse_keys: tuple[str, ...] = SPARSE_KEYS,
) -> tuple[list[ResourceBlock], list[tuple[int, int]]] | Refused:
    """The native answer in the reference's terms (the sparse keys and scopes cut to the
    contract's subsets of ``attr_keys`` and ``derive_scopes``)."""
    sparse_keys = tuple(k for k in sparse_keys if k in attr_keys)
    sparse_scopes = sparse_scopes & derive_scopes
    try:
        result: tuple[list[ResourceBlock], list[tuple[int, int]]] = native.scan_traces(
            data,
            max_depth,
            max_messages,
            derive_scopes,
            attr_keys,
            ResourceBlock,
            ScopeBlock,
            event_keys,
            split_scopes,
            sparse_scopes,
            sparse_keys,
        )
    except (native.DecodeError, native.TooDeep, native.TooManyMessages) as exc:
        assert isinstance(exc, ValueError)
        return Refused(type(exc).__name__)
    return result


def canonical(msg: Any) -> bytes:
    """A message's bytes for comparing parsed messages (NaN-safe, unlike ``==``)."""
    data: bytes = msg.SerializeToString(deterministic=True)
    return data


def _scalar(value: Any) -> Any:
    case = value.WhichOneof("value")
    scalar = case not in (None, "array_value", "kvlist_value")
    return getattr(value, case) if scalar and case else None


def expected_values(
    span: Span, attr_keys: tuple[str, ...], event_keys: tuple[tuple[str, str], ...] = ()
) -> tuple[Any, ...]:
    """The derive values the Python way, read from upb: each key's last attribute, then
    for each event key the value in the last event of that name that has the key (ERROR
    spans only)."""
    out: list[Any] = []
    for key in attr_keys:
        value: Any = None
        for kv in span.attributes:
            if kv.key == key:
                value = _scalar(kv.value)
        out.append(value)
    for name, key in event_keys:
        found: Any = None
        for event in span.events if span.status.code == 2 else ():
            if event.name == name:
                for kv in event.attributes:
                    if kv.key == key:
                        found = _scalar(kv.value)
        out.append(found)
    return tuple(out)


def expected_derived(
    span: Span, attr_keys: tuple[str, ...], event_keys: tuple[tuple[str, str], ...] = ()
) -> tuple[Any, ...]:
    return (
        span.name,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        span.trace_id,
        span.span_id,
        span.status.code,
        expected_values(span, attr_keys, event_keys),
    )


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types (True is not 1), NaNs and float signs included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def check_index(
    data: bytes,
    msg: ExportTraceServiceRequest,
    blocks: list[ResourceBlock],
    other: list[tuple[int, int]],
    derive_scopes: frozenset[str] = DERIVE_SCOPES,
    attr_keys: tuple[str, ...] = ATTR_KEYS,
    event_keys: tuple[tuple[str, str], ...] = EVENT_KEYS,
    split_scopes: frozenset[str] = SPLIT_SCOPES,
    sparse_scopes: frozenset[str] = SPARSE_SCOPES,
    sparse_keys: tuple[str, ...] = SPARSE_KEYS,
) -> None:
    """Asserts that the index of ``data`` says what upb's parse ``msg`` says."""
    # The blocks and the other ranges tile the request, in wire order.
    pieces = sorted([(b.start, b.end) for b in blocks] + other)
    ends = [0] + [end for _, end in pieces]
    assert [start for start, _ in pieces] == ends[:-1], pieces
    assert ends[-1] == len(data), pieces
    assert len(blocks) == len(msg.resource_spans)
    for block, rs in zip(blocks, msg.resource_spans, strict=True):
        alone = ExportTraceServiceRequest.FromString(data[block.start : block.end])
        assert canonical(alone.resource_spans[0]) == canonical(rs)
        if block.resource is None:
            assert not rs.HasField("resource")
        else:
            assert rs.HasField("resource")
            assert canonical(Resource.FromString(block.resource)) == canonical(rs.resource)
        assert len(block.scopes) == len(rs.scope_spans)
        for scope, ss in zip(block.scopes, rs.scope_spans, strict=True):
            holder = ResourceSpans.FromString(data[scope.start : scope.end])
            assert canonical(holder.scope_spans[0]) == canonical(ss)
            assert type(scope.name) is str
            assert scope.name == ss.scope.name
            assert scope.spans == len(ss.spans)
            if scope.name in split_scopes:
                assert scope.split is not None
                assert [type(n) for n, _, _ in scope.split] == [str] * len(ss.spans)
                assert [n for n, _, _ in scope.split] == [span.name for span in ss.spans]
                for (_, start, end), span in zip(scope.split, ss.spans, strict=True):
                    alone = ScopeSpans.FromString(data[start:end])
                    assert [canonical(s) for s in alone.spans] == [canonical(span)]
            else:
                assert scope.split is None
            if scope.name not in derive_scopes:
                assert scope.derived is None
                continue
            assert scope.derived is not None
            want = [expected_derived(span, attr_keys, event_keys) for span in ss.spans]
            if scope.name in sparse_scopes:  # the spans with a sparse key's value only
                marks = [attr_keys.index(k) for k in sparse_keys if k in attr_keys]
                want = [d for d in want if any(d[6][i] is not None for i in marks)]
            assert same(scope.derived, want), (scope.derived, want)
        for start, end in block.other:
            assert block.start < start < end <= block.end
    # Splicing the index back together gives the same request (core/traces.py).
    request = TraceRequest(data, blocks, other)
    assert request.SerializeToString() is data
    request.changed = True
    for block in blocks:  # every block written from its index, not copied as received
        block.edited = True
    spliced = ExportTraceServiceRequest.FromString(request.SerializeToString())
    assert canonical(spliced) == canonical(msg)


def check_same_answer(
    native: ModuleType,
    data: bytes,
    max_depth: int = 100,
    max_messages: int = 10**9,
    derive_scopes: frozenset[str] = DERIVE_SCOPES,
    attr_keys: tuple[str, ...] = ATTR_KEYS,
    event_keys: tuple[tuple[str, str], ...] = EVENT_KEYS,
    split_scopes: frozenset[str] = SPLIT_SCOPES,
    sparse_scopes: frozenset[str] = SPARSE_SCOPES,
    sparse_keys: tuple[str, ...] = SPARSE_KEYS,
) -> str:
    """Asserts that the scan answers as the reference does; returns the outcome's name."""
    want = reference(data, max_depth, max_messages)
    sparse_keys = tuple(k for k in sparse_keys if k in attr_keys)  # the contract's subset
    sparse_scopes = sparse_scopes & derive_scopes
    got = scan(
        native,
        data,
        max_depth,
        max_messages,
        derive_scopes,
        attr_keys,
        event_keys,
        split_scopes,
        sparse_scopes,
        sparse_keys,
    )
    if isinstance(want, Refused):
        assert isinstance(got, Refused) and got.kind == want.kind, (want, got, data.hex())
        return want.kind
    assert not isinstance(got, Refused), (got, data.hex())
    check_index(
        data,
        want,
        *got,
        derive_scopes=derive_scopes,
        attr_keys=attr_keys,
        event_keys=event_keys,
        split_scopes=split_scopes,
        sparse_scopes=sparse_scopes,
        sparse_keys=sparse_keys,
    )
    return "accepted"


# --- a request as wire fields, to mutate ------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def padded_varint(n: int, pad: int) -> bytes:
    """``n`` as a varint ``pad`` bytes longer than needed (non-minimal, still valid)."""
    raw = bytearray(varint(n))
    if pad:
        raw[-1] |= 0x80
        raw += b"\x80" * (pad - 1) + b"\x00"
    return bytes(raw)


@dataclass
class Field:
    """One field on the wire. ``value``: an int (wire types 0, 1, 5), bytes (2), or the
    fields of a known message (2) or of a group (3)."""

    number: int
    wire_type: int
    value: int | bytes | list[Field]
    descriptor: Descriptor | None = None
    """The message type, for a known message field."""
    tag_pad: int = 0
    len_pad: int = 0
    """Bytes added to the tag's varint and to the length's (wire type 2) or value's (0)."""

    def encode(self) -> bytes:
        tag = padded_varint(self.number << 3 | self.wire_type, self.tag_pad)
        value = self.value
        if self.wire_type == 0:
            assert isinstance(value, int)
            return tag + padded_varint(value, self.len_pad)
        if self.wire_type == 1:
            assert isinstance(value, int)
            return tag + value.to_bytes(8, "little")
        if self.wire_type == 5:
            assert isinstance(value, int)
            return tag + value.to_bytes(4, "little")
        if self.wire_type in (4, 6, 7):  # an end-group tag, or no wire type at all
            return tag
        if self.wire_type == 3:
            assert not isinstance(value, int)
            body = value if isinstance(value, bytes) else encode(value)
            return tag + body + varint(self.number << 3 | 4)
        assert not isinstance(value, int)
        body = value if isinstance(value, bytes) else encode(value)
        return tag + padded_varint(len(body), self.len_pad) + body


def encode(fields: list[Field]) -> bytes:
    return b"".join(f.encode() for f in fields)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def decode(data: bytes, descriptor: Descriptor = REQUEST) -> list[Field]:
    """The fields of a valid, group-free message, known message fields decoded too."""
    out: list[Field] = []
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        value: int | bytes | list[Field]
        child: Descriptor | None = None
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 1:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire_type == 5:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            body, pos = data[pos : pos + length], pos + length
            fd = descriptor.fields_by_number.get(number)
            if fd is not None and fd.type == FieldDescriptor.TYPE_MESSAGE:
                child = fd.message_type
                value = decode(body, child)
            else:
                value = body
        else:
            raise ValueError(f"wire type {wire_type} in a generated message")
        out.append(Field(number, wire_type, value, child))
    return out
