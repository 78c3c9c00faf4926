"""The trace scanner: an ExportTraceServiceRequest's bytes in, its wire view out.

:func:`scan_traces` validates a request exactly as the upb parser does (refusing what
it refuses, with :func:`~gym_sidecar.wire.protobuf.decode.decode_protobuf`'s reasons, limits
and messages) and builds the :class:`~gym_sidecar.core.traces.TraceRequest` the trace
pipeline works on: where each ResourceSpans and ScopeSpans block lies, its resource
bytes, scope name and span count, the derive fields of the spans of the scopes
``derive_scopes`` names (:data:`~gym_sidecar.core.traces.DerivedSpan`: their attribute
values for ``attr_keys``, then their event attribute values for ``event_keys``; of the
``sparse_scopes`` among them, only the spans with a value for one of ``sparse_keys``), and
the name and byte range of each span of the scopes ``split_scopes`` names
(:data:`~gym_sidecar.core.traces.SplitSpan`, for the gate's span-level removal).

Two implementations, one contract:

- native: ``gym_sidecar_native.scan_traces`` (Rust, PyO3), used when the module imports
  and ``GYM_SIDECAR_NATIVE`` is not ``0``. It raises ``gym_sidecar_native.DecodeError``,
  ``.TooDeep`` or ``.TooManyMessages`` (message: the detail), mapped here to the same
  :class:`BadRequest` s as the pure path's.
- pure Python (:func:`scan_python`): the receiver's checks as before (messages counted
  on the wire when the request is large, upb ``ParseFromString``, the depth walk when
  ``max_depth`` is below 100), then a walk of the two top wire levels only (request ->
  ResourceSpans -> ScopeSpans field ranges). upb keeps a repeated field's elements in
  wire order, so the i-th ScopeSpans field of a block is ``scope_spans[i]`` of the
  parsed ResourceSpans: counts, scope names and the derive fields are read from the
  parsed objects, and nothing below a ScopeSpans is walked in Python, except the fields
  of a split scope's block (their ranges; the i-th ``spans`` field is ``spans[i]``).

Which one runs is decided on first use and logged once at INFO (``trace scanner:
native`` / ``python``); :func:`active_scanner` says which, and :func:`pure_python`
forces the pure path (tests, benchmarks). Event-loop thread only for the switch; the
scans themselves are pure functions of their arguments.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any, Final

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans

from gym_sidecar.core.signals import SPECS
from gym_sidecar.core.stage import Signal
from gym_sidecar.core.traces import (
    NATIVE_ENV,
    AttrValue,
    ByteRange,
    DerivedSpan,
    ResourceBlock,
    ScanSpec,
    ScopeBlock,
    SplitSpan,
    TraceRequest,
)
from gym_sidecar.wire.protobuf.bounds import PARSER_MAX_DEPTH
from gym_sidecar.wire.protobuf.decode import BadRequest, decode_protobuf, too_deep, too_many

logger = logging.getLogger(__name__)

_SPEC: Final = SPECS[Signal.TRACES]
_INVALID: Final = f"body is not a valid {_SPEC.request_type.__name__}: "

# Tags (varint values) of the fields the index is made of; any other tag, including
# these field numbers with another wire type (upb keeps those as unknown fields), is an
# "other" field copied verbatim.
_TAG_RESOURCE_SPANS: Final = (1 << 3) | 2  # ExportTraceServiceRequest.resource_spans
_TAG_RESOURCE: Final = (1 << 3) | 2  # ResourceSpans.resource
_TAG_SCOPE_SPANS: Final = (2 << 3) | 2  # ResourceSpans.scope_spans
_TAG_SPANS: Final = (2 << 3) | 2  # ScopeSpans.spans

_STATUS_ERROR: Final = 2
"""``Status.code`` ERROR: the spans whose event values are read."""

_SCALARS: Final = frozenset(
    {"string_value", "bool_value", "int_value", "double_value", "bytes_value"}
)


# -- which scanner ----------------------------------------------------------------------


class _Selection:
    """Which scanner runs: resolved on first use; :func:`pure_python` overrides."""

    __slots__ = ("forced_python", "native", "resolved")

    def __init__(self) -> None:
        self.native: Any = None
        self.resolved = False
        self.forced_python = 0

    def scanner(self) -> Any:
        """The native module, or None for the pure path (resolved and logged once)."""
        if not self.resolved:
            self.native = _import_native()
            self.resolved = True
            if self.native is not None:
                logger.info("trace scanner: native (gym_sidecar_native)")
            elif os.environ.get(NATIVE_ENV, "").strip() == "0":
                logger.info("trace scanner: python (%s=0)", NATIVE_ENV)
            else:
                logger.info("trace scanner: python (gym_sidecar_native is not installed)")
        return None if self.forced_python else self.native


_SELECTION: Final = _Selection()


def _import_native() -> Any:
    if os.environ.get(NATIVE_ENV, "").strip() == "0":
        return None
    try:
        import gym_sidecar_native
    except ImportError:
        return None
    return gym_sidecar_native


def active_scanner() -> str:
    """``"native"`` or ``"python"``: the scanner :func:`scan_traces` uses now."""
    return "python" if _SELECTION.scanner() is None else "native"


def native_available() -> bool:
    """Whether the native scanner imported (and ``GYM_SIDECAR_NATIVE`` is not ``0``)."""
    _SELECTION.scanner()
    return _SELECTION.native is not None


@contextlib.contextmanager
def pure_python() -> Iterator[None]:
    """Within the block, :func:`scan_traces` uses the pure-Python scanner (nestable)."""
    _SELECTION.forced_python += 1
    try:
        yield
    finally:
        _SELECTION.forced_python -= 1


# -- the entry point -----------------------------------------------------------------


def scan_traces(
    data: bytes,
    *,
    max_depth: int,
    max_messages: int,
    derive_scopes: frozenset[str],
    attr_keys: tuple[str, ...],
    event_keys: tuple[tuple[str, str], ...] = (),
    split_scopes: frozenset[str] = frozenset(),
    sparse_scopes: frozenset[str] = frozenset(),
    sparse_keys: tuple[str, ...] = (),
) -> TraceRequest:
    """The wire view of the ExportTraceServiceRequest ``data``; :class:`BadRequest` (reasons
    ``bad_request``, ``too_deep``, ``too_many_messages``) for anything the upb parser
    refuses, for nesting beyond ``max_depth`` message levels and for more than
    ``max_messages`` messages. Blocks whose scope name is in ``derive_scopes`` carry
    their spans' derive fields, with the values of ``attr_keys`` then of ``event_keys``
    (those of spans whose status is ERROR only), of a block whose scope name is in
    ``sparse_scopes`` only the spans with a value for one of ``sparse_keys``; blocks
    whose scope name is in ``split_scopes`` their spans' names and byte ranges
    (``ScopeBlock.split``)."""
    native = _SELECTION.scanner()
    if native is None:
        return scan_python(
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
    try:
        blocks, other = native.scan_traces(
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
    except native.TooDeep:
        raise too_deep(min(max_depth, PARSER_MAX_DEPTH)) from None
    except native.TooManyMessages:
        raise too_many(max_messages) from None
    except native.DecodeError as exc:
        raise BadRequest(_INVALID + str(exc)) from None
    return TraceRequest(data, blocks, other)


def scan_request(data: bytes, *, max_depth: int, max_messages: int, scan: ScanSpec) -> TraceRequest:
    """:func:`scan_traces` reading what ``scan`` asks for (the receivers' call)."""
    return scan_traces(
        data,
        max_depth=max_depth,
        max_messages=max_messages,
        derive_scopes=scan.derive_scopes,
        attr_keys=scan.attr_keys,
        event_keys=scan.event_keys,
        split_scopes=scan.split_scopes,
        sparse_scopes=scan.sparse_scopes,
        sparse_keys=scan.sparse_keys,
    )


def scan_python(
    data: bytes,
    *,
    max_depth: int,
    max_messages: int,
    derive_scopes: frozenset[str],
    attr_keys: tuple[str, ...],
    event_keys: tuple[tuple[str, str], ...] = (),
    split_scopes: frozenset[str] = frozenset(),
    sparse_scopes: frozenset[str] = frozenset(),
    sparse_keys: tuple[str, ...] = (),
) -> TraceRequest:
    """The pure-Python scanner (see the module doc); same contract as
    :func:`scan_traces`."""
    message: Any = decode_protobuf(_SPEC, data, max_depth, max_messages)
    reading = ScanSpec(
        derive_scopes, attr_keys, event_keys, split_scopes, sparse_scopes, sparse_keys
    )
    try:
        blocks, other = _index(data, message.resource_spans, reading)
    except (IndexError, ValueError) as exc:
        # upb accepted what this walk cannot follow: it cannot happen for bytes upb
        # parsed (both read the same wire format), but a refusal is the safe answer.
        raise BadRequest(f"{_INVALID}cannot index the request ({exc})") from None
    return TraceRequest(data, blocks, other)


# -- the walk ------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos``, and the position after it."""
    value = 0
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _field(data: bytes, pos: int) -> tuple[int, int, int]:
    """The field at ``pos``: ``(tag, start of its value, end of the field)``; for a
    length-delimited field the value starts after the length."""
    tag = data[pos]
    pos += 1
    if tag >= 0x80:
        tag, pos = _varint(data, pos - 1)
    wire_type = tag & 7
    if wire_type == 2:
        length = data[pos]
        pos += 1
        if length >= 0x80:
            length, pos = _varint(data, pos - 1)
        end = pos + length
        if end > len(data):
            raise IndexError("length past the end")
        return tag, pos, end
    return tag, pos, _skip(data, pos, tag)


def _skip(data: bytes, pos: int, tag: int) -> int:
    """The end of the value of a field with ``tag`` (not length-delimited) at ``pos``."""
    wire_type = tag & 7
    if wire_type == 0:
        return _varint(data, pos)[1]
    if wire_type == 1:
        end = pos + 8
    elif wire_type == 5:
        end = pos + 4
    elif wire_type == 3:  # a group (unknown fields only): up to its END_GROUP
        depth = 1
        while depth:
            inner, pos = _varint(data, pos)
            kind = inner & 7
            if kind == 3:
                depth += 1
            elif kind == 4:
                depth -= 1
            elif kind == 2:
                length, pos = _varint(data, pos)
                pos += length
            else:
                pos = _skip(data, pos, inner)
        end = pos
    else:
        raise ValueError(f"wire type {wire_type}")
    if end > len(data):
        raise IndexError("field past the end")
    return end


def _index(
    data: bytes, resource_spans: Sequence[Any], reading: ScanSpec
) -> tuple[list[ResourceBlock], list[ByteRange]]:
    """The request's ResourceSpans blocks and other fields; ``resource_spans`` is the
    parsed request's."""
    blocks: list[ResourceBlock] = []
    other: list[ByteRange] = []
    n = len(data)
    pos = 0
    while pos < n:
        tag, body, end = _field(data, pos)
        if tag == _TAG_RESOURCE_SPANS:
            block = ResourceBlock(pos, end, None, [], [])
            rs = resource_spans[len(blocks)]
            _fill_block(block, data, body, rs, reading)
            blocks.append(block)
        else:
            other.append((pos, end))
        pos = end
    if len(blocks) != len(resource_spans):
        raise ValueError("ResourceSpans count differs from the parser's")
    return blocks, other


def _fill_block(block: ResourceBlock, data: bytes, pos: int, rs: Any, reading: ScanSpec) -> None:
    """Index the ResourceSpans ``rs`` (parsed) whose body starts at ``pos``."""
    resources: list[bytes] = []
    scopes = block.scopes
    scope_spans = rs.scope_spans
    end = block.end
    while pos < end:
        tag, body, field_end = _field(data, pos)
        if tag == _TAG_SCOPE_SPANS:
            ss = scope_spans[len(scopes)]
            name = ss.scope.name
            derived = None
            if name in reading.derive_scopes:
                sparse = name in reading.sparse_scopes
                derived = _derived(ss, reading, data, pos, field_end, sparse=sparse)
            scope = ScopeBlock(pos, field_end, name, len(ss.spans), derived)
            if name in reading.split_scopes:
                scope.split = _split(ss, data, body, field_end)
            scopes.append(scope)
        elif tag == _TAG_RESOURCE:
            resources.append(data[body:field_end])
        else:
            block.other.append((pos, field_end))
        pos = field_end
    if pos != end or len(scopes) != len(scope_spans):
        raise ValueError("ScopeSpans count differs from the parser's")
    # Repeated occurrences of a message field merge, as their concatenated bodies do.
    if resources:
        block.resource = resources[0] if len(resources) == 1 else b"".join(resources)


def _split(ss: ScopeSpans, data: bytes, pos: int, end: int) -> list[SplitSpan]:
    """Each span's name (from the parsed ``ss``) and ``spans`` field range, in wire
    order, of the ScopeSpans whose body is ``data[pos:end]``."""
    spans = ss.spans
    out: list[SplitSpan] = []
    while pos < end:
        tag, _, field_end = _field(data, pos)
        if tag == _TAG_SPANS:
            out.append((spans[len(out)].name, pos, field_end))
        pos = field_end
    if len(out) != len(spans):
        raise ValueError("span count differs from the parser's")
    return out


def _value(value: AnyValue) -> AttrValue:
    kind = value.WhichOneof("value")
    if kind not in _SCALARS:
        return None  # empty, array or kvlist
    result: AttrValue = getattr(value, kind)
    return result


def _derived(
    ss: ScopeSpans, reading: ScanSpec, data: bytes, start: int, end: int, *, sparse: bool = False
) -> list[DerivedSpan]:
    """The derive fields of the block's spans. Attributes are read only when one of
    ``attr_keys`` occurs in the block's bytes at all (the keys are rare), events only
    when one of ``event_keys``' event names does, and then of ERROR spans only. A
    ``sparse`` block lists only its spans with a value for one of ``sparse_keys``, and
    is read only when one of them occurs in its bytes."""
    attr_keys, event_keys = reading.attr_keys, reading.event_keys
    n_attrs = len(attr_keys)
    nothing: tuple[AttrValue, ...] = (None,) * (n_attrs + len(event_keys))
    wanted = {key: i for i, key in enumerate(attr_keys)}
    find = data.find
    read_attrs = False
    for needle in _needles(reading.sparse_keys if sparse else attr_keys):
        if find(needle, start, end) >= 0:
            read_attrs = True
            break
    if sparse:
        if not read_attrs:
            return []
        marks = [wanted[key] for key in reading.sparse_keys]
        return [span for span in _derived(ss, reading, data, start, end) if _marked(span[6], marks)]
    read_events = False
    for needle in _needles(tuple(name for name, _ in event_keys)):
        if find(needle, start, end) >= 0:
            read_events = True
            break
    out: list[DerivedSpan] = []
    append = out.append
    scalars = _SCALARS
    for span in ss.spans:
        values = nothing
        found: list[AttrValue] | None = None
        if read_attrs:
            for kv in span.attributes:
                i = wanted.get(kv.key)
                if i is not None:
                    if found is None:
                        found = list(nothing)
                    # _value, inlined: this loop runs once per attribute of a derived span
                    any_value = kv.value
                    kind = any_value.WhichOneof("value")
                    found[i] = getattr(any_value, kind) if kind in scalars else None
        code = span.status.code
        # Event values are failure details: read from ERROR spans only (the contract).
        if read_events and code == _STATUS_ERROR and span.events:
            for j, (event_name, key) in enumerate(event_keys):
                value = _event_value(span.events, event_name, key)
                if value is not None:
                    if found is None:
                        found = list(nothing)
                    found[n_attrs + j] = value
        if found is not None:
            values = tuple(found)
        append(
            (
                span.name,
                span.start_time_unix_nano,
                span.end_time_unix_nano,
                span.trace_id,
                span.span_id,
                code,
                values,
            )
        )
    return out


def _marked(values: tuple[AttrValue, ...], marks: list[int]) -> bool:
    """Whether one of the ``marks`` (value indexes) holds a value."""
    return any(values[i] is not None for i in marks)


@functools.lru_cache(maxsize=64)
def _needles(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    """``keys`` as the UTF-8 bytes searched for in a block (encoded once per key set)."""
    return tuple(key.encode() for key in keys)


def _event_value(events: Sequence[Any], name: str, key: str) -> AttrValue:
    """The value of attribute ``key`` in the last of ``events`` named ``name`` that has
    it (its last occurrence there); None when none has."""
    for event in reversed(events):
        if event.name != name:
            continue
        value: AttrValue = None
        has = False
        for kv in event.attributes:
            if kv.key == key:
                value, has = _value(kv.value), True
        if has:
            return value
    return None
