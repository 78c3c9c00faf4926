"""OTLP protobuf encoding of ended spans, written straight to wire-format bytes.

The OTLP exporters encode a batch with ``encode_spans`` from
``opentelemetry-exporter-otlp-proto-common``: one protobuf object per span, per
attribute and per value, built field by field from Python (about 14-40 us per span on
the project's 2-core machines, several times what recording the span costs), on the
batch worker thread, holding the GIL the request handlers need.

``encode_request(spans)`` produces the same ``ExportTraceServiceRequest`` as bytes
directly, about 3x faster (``bench/span_encoding.py``): each span is a handful of
byte-string joins; the resource and instrumentation-scope blocks and the attribute key
prefixes are encoded once and reused; spans of a class that does not override
``ReadableSpan``'s properties are read from its fields.

``encode_record(span)`` encodes one ended span into a *record*: plain ``bytes`` that
``encode_request`` accepts in the span's place and turns into the same message.
``processor.GymSpanProcessor`` queues records instead of spans when its exporter is the
lean one, so a span waiting for export keeps no GC-tracked object alive (see the
records section below for why that matters on a NeMo Gym server).

Contract:

- Same message as ``encode_spans`` (same grouping by resource then scope, in first-seen
  order; same fields), checked against the stock encoder on probe spans of every shape
  (``probes``) by ``grpc_exporter.self_check()`` before use and by
  ``tests/agent/_lean/test_span_encoding.py``.
- A value ``encode_spans`` would log and skip (an unknown type, an integer outside
  int64, a string that is not valid UTF-8) makes ``encode_request`` raise
  ``UnsupportedValue``; the caller encodes that batch with ``encode_spans`` instead.
- Pure function of its input apart from bounded caches (``otlp_wire.MAX_CACHED_KEYS``
  attribute keys, ``MAX_CACHED_BLOCKS`` resource/scope blocks; cleared when full) and
  the records' (resource, scope) registry (``MAX_RECORD_SOURCES`` pairs, never cleared
  because queued records refer to it; past the bound ``encode_record`` returns None and
  the span is queued as itself).
  Thread-safe (the caches are dicts written with single assignments).
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gym_telemetry._lean.otlp_wire import (
    KEY_PREFIXES,
    T_AV_DOUBLE,
    T_AV_INT,
    T_AV_STRING,
    T_KV_VALUE,
    VARINT_1,
    UnsupportedValue,
    attributes_field,
    key_value,
    len_prefixed,
    string_field,
    varint,
)

#: Bound of the resource/scope block cache (entries); a full cache is cleared.
MAX_CACHED_BLOCKS: Final = 64

_pack_fixed64 = struct.Struct("<Q").pack

# OTLP field tags (field number << 3 | wire type), as single bytes or short strings.
# ExportTraceServiceRequest / ResourceSpans / ScopeSpans
_T_RESOURCE_SPANS: Final = b"\x0a"  # 1, len
_T_RS_RESOURCE: Final = b"\x0a"  # 1, len
_T_RS_SCOPE_SPANS: Final = b"\x12"  # 2, len
_T_RS_SCHEMA_URL: Final = b"\x1a"  # 3, len
_T_SS_SCOPE: Final = b"\x0a"  # 1, len
_T_SS_SPANS: Final = b"\x12"  # 2, len
_T_SS_SCHEMA_URL: Final = b"\x1a"  # 3, len
# Span
_T_TRACE_ID: Final = b"\x0a\x10"  # 1, len 16
_T_SPAN_ID: Final = b"\x12\x08"  # 2, len 8
_T_TRACE_STATE: Final = b"\x1a"  # 3, len
_T_PARENT_SPAN_ID: Final = b"\x22\x08"  # 4, len 8
_T_NAME: Final = b"\x2a"  # 5, len
_T_KIND: Final = b"\x30"  # 6, varint
_T_START: Final = b"\x39"  # 7, fixed64
_T_END: Final = b"\x41"  # 8, fixed64
_T_ATTRIBUTE: Final = b"\x4a"  # 9, len
_T_DROPPED_ATTRIBUTES: Final = b"\x50"  # 10, varint
_T_EVENT: Final = b"\x5a"  # 11, len
_T_DROPPED_EVENTS: Final = b"\x60"  # 12, varint
_T_LINK: Final = b"\x6a"  # 13, len
_T_DROPPED_LINKS: Final = b"\x70"  # 14, varint
_T_STATUS: Final = b"\x7a"  # 15, len
_T_FLAGS: Final = b"\x85\x01"  # 16, fixed32
# Span.Event
_T_EV_TIME: Final = b"\x09"  # 1, fixed64
_T_EV_NAME: Final = b"\x12"  # 2, len
_T_EV_ATTRIBUTE: Final = b"\x1a"  # 3, len
_T_EV_DROPPED: Final = b"\x20"  # 4, varint
# Span.Link
_T_LK_TRACE_ID: Final = b"\x0a\x10"  # 1, len 16
_T_LK_SPAN_ID: Final = b"\x12\x08"  # 2, len 8
_T_LK_ATTRIBUTE: Final = b"\x22"  # 4, len
_T_LK_DROPPED: Final = b"\x28"  # 5, varint
_T_LK_FLAGS: Final = b"\x35"  # 6, fixed32
# Status
_T_ST_MESSAGE: Final = b"\x12"  # 2, len
_T_ST_CODE: Final = b"\x18"  # 3, varint

# Span.flags: the parent's is-remote bit is known (0x100); the parent is remote (0x200).
_FLAGS_LOCAL: Final = _T_FLAGS + (0x100).to_bytes(4, "little")
_FLAGS_REMOTE: Final = _T_FLAGS + (0x300).to_bytes(4, "little")
_LINK_FLAGS_LOCAL: Final = _T_LK_FLAGS + (0x100).to_bytes(4, "little")
_LINK_FLAGS_REMOTE: Final = _T_LK_FLAGS + (0x300).to_bytes(4, "little")
_KIND: Final[dict[SpanKind, bytes]] = {kind: _T_KIND + bytes([kind.value + 1]) for kind in SpanKind}
_EMPTY_STATUS: Final = _T_STATUS + b"\x00"
# An unset status and the flags: how most spans end.
_TAIL_LOCAL: Final = _EMPTY_STATUS + _FLAGS_LOCAL
_TAIL_REMOTE: Final = _EMPTY_STATUS + _FLAGS_REMOTE
_UNSET_CODE: Final = StatusCode.UNSET


#: Bounds of the memo of encoded attribute fields: values memoized per key (past it a
#: key's new values are not memoized: a high-cardinality key such as a rollout id cannot
#: push the others out, and the memo stops growing) and keys (a full memo is cleared).
MAX_MEMO_VALUES_PER_KEY: Final = 64
MAX_MEMO_KEYS: Final = 1024
#: Longest string value memoized (characters).
MAX_MEMO_TEXT: Final = 256
_MEMO_TYPES: Final = (str, int, bool, float)

# (key, value, value's class) -> the encoded field (the class keeps True, 1 and 1.0
# apart: equal dict keys, encoded differently); the memoized values per key; and per
# key the last value not memoized with its field (the next span of the same request
# or rollout carries it: a rollout id). The last-value slot replaces its tuple, so a
# new value leaves no object behind for the cyclic GC.
_fields: dict[tuple[str, Any, type], bytes] = {}
_memoized: dict[str, int] = {}
_last: dict[str, tuple[Any, type, bytes]] = {}


def _encode_attribute(key: str, value: Any, kind: type) -> bytes:
    """The ``Span.attributes`` field (tag, length, ``KeyValue``) of one attribute."""
    prefix = KEY_PREFIXES.get(key)
    if prefix is not None and len(prefix) < 100:
        # A scalar under a known key: one join, every length one varint byte.
        if kind is str:
            size = len(value)
            if size < 40 and value.isascii() and len(prefix) + size + 4 < 128:
                # a short ASCII string (a rollout id, a model name)
                return b"".join(
                    (
                        _T_ATTRIBUTE,
                        VARINT_1[len(prefix) + size + 4],
                        prefix,
                        T_KV_VALUE,
                        VARINT_1[size + 2],
                        T_AV_STRING,
                        VARINT_1[size],
                        value.encode(),
                    )
                )
        elif kind is int:
            # a token count, a status code: int64 as a varint (a negative one is ten bytes)
            data = varint(value) if 0 <= value <= _INT64_MAX else None
            if data is not None:
                size = len(data) + 1
                return b"".join(
                    (
                        _T_ATTRIBUTE,
                        VARINT_1[len(prefix) + size + 2],
                        prefix,
                        T_KV_VALUE,
                        VARINT_1[size],
                        T_AV_INT,
                        data,
                    )
                )
        elif kind is float:
            return b"".join(
                (
                    _T_ATTRIBUTE,
                    VARINT_1[len(prefix) + 11],
                    prefix,
                    _DOUBLE_HEAD,
                    _pack_double(value),
                )
            )
    return len_prefixed(_T_ATTRIBUTE, key_value(key, value))


_DOUBLE_HEAD: Final = T_KV_VALUE + VARINT_1[9] + T_AV_DOUBLE
_pack_double = struct.Struct("<d").pack
_INT64_MAX: Final = (1 << 63) - 1
#: Longest tuple of strings memoized (items), and longest item (characters).
MAX_MEMO_ITEMS: Final = 8


def _memoizable(value: Any, kind: type) -> bool:
    """Whether the field of ``value``, not a str, goes in the memo: an int, bool or float,
    or a tuple of up to ``MAX_MEMO_ITEMS`` strings of up to ``MAX_MEMO_TEXT`` characters
    (a model's finish reasons; only str items, since ``(1,)``, ``(1.0,)`` and ``(True,)``
    are equal keys encoded differently). A str is judged by ``_attribute_field`` itself
    (up to ``MAX_MEMO_TEXT`` characters), without this call."""
    if kind is tuple:
        return len(value) <= MAX_MEMO_ITEMS and all(
            item.__class__ is str and len(item) <= MAX_MEMO_TEXT for item in value
        )
    return kind in _MEMO_TYPES


def _attribute_field(key: str, value: Any) -> bytes:
    """The field of one attribute that missed the memo (``_fields``): memoized when it
    may be (a verifier's rewards repeat: 0.0, 1.0) while its key has fewer than
    ``MAX_MEMO_VALUES_PER_KEY`` memoized, else kept as the key's last value."""
    kind = value.__class__
    last = _last.get(key)
    if last is not None and last[1] is kind and last[0] == value:
        return last[2]
    field = _encode_attribute(key, value, kind)
    # a str (a new rollout id: once per request) is judged here, without a call
    if not (len(value) <= MAX_MEMO_TEXT if kind is str else _memoizable(value, kind)):
        return field
    count = _memoized.get(key, 0)
    if count >= MAX_MEMO_VALUES_PER_KEY:
        _last[key] = (value, kind, field)  # a high-cardinality key: its last value only
        return field
    if len(_memoized) >= MAX_MEMO_KEYS:
        _fields.clear()
        _memoized.clear()
        _last.clear()
        count = 0
    _fields[(key, value, kind)] = field
    _memoized[key] = count + 1
    return field


def _append_attributes(attributes: Mapping[str, Any], append: Any) -> None:
    """Append the ``Span.attributes`` fields of ``attributes`` with ``append`` (the hot
    loop: a memo hit is one dict lookup)."""
    fields = _fields
    for key, value in attributes.items():
        try:
            field = fields.get((key, value, value.__class__))
        except TypeError:  # an unhashable value (a map): never memoized
            field = None
        append(field if field is not None else _attribute_field(key, value))


def _span_attributes(attributes: Mapping[str, Any]) -> list[bytes]:
    """Span.attributes fields."""
    out: list[bytes] = []
    _append_attributes(attributes, out.append)
    return out


def _trace_state(state: Any) -> bytes:
    if not state:
        return b""
    return string_field(_T_TRACE_STATE, ",".join([f"{k}={v}" for k, v in state.items()]))


def _status(status: Status | None) -> bytes:
    if status is None:
        return b""
    code = status.status_code.value
    message = status.description
    if not code and not message:
        return _EMPTY_STATUS
    payload = (string_field(_T_ST_MESSAGE, message) if message else b"") + (
        _T_ST_CODE + varint(code) if code else b""
    )
    return len_prefixed(_T_STATUS, payload)


def _events(events: Sequence[Any]) -> bytes:
    out = []
    for event in events:
        payload = (
            _T_EV_TIME
            + _pack_fixed64(event.timestamp)
            + string_field(_T_EV_NAME, event.name)
            + attributes_field(_T_EV_ATTRIBUTE, event.attributes)
        )
        dropped = event.dropped_attributes
        if dropped:
            payload += _T_EV_DROPPED + varint(dropped)
        out.append(len_prefixed(_T_EVENT, payload))
    return b"".join(out)


def _links(links: Sequence[Any]) -> bytes:
    out = []
    for link in links:
        context = link.context
        payload = (
            _T_LK_TRACE_ID
            + context.trace_id.to_bytes(16, "big")
            + _T_LK_SPAN_ID
            + context.span_id.to_bytes(8, "big")
            + attributes_field(_T_LK_ATTRIBUTE, link.attributes)
        )
        dropped = link.dropped_attributes
        if dropped:
            payload += _T_LK_DROPPED + varint(dropped)
        payload += _LINK_FLAGS_REMOTE if context.is_remote else _LINK_FLAGS_LOCAL
        out.append(len_prefixed(_T_LINK, payload))
    return b"".join(out)


_SPAN_PROPERTIES: Final = (
    "name",
    "kind",
    "parent",
    "start_time",
    "end_time",
    "status",
    "attributes",
    "events",
    "links",
    "dropped_attributes",
    "dropped_events",
    "dropped_links",
    "resource",
    "instrumentation_scope",
)
_plain_types: dict[type, bool] = {}


def _is_plain(cls: type) -> bool:
    """Whether ``cls`` reads its span data from ``ReadableSpan``'s own fields (it
    overrides none of its properties, and either not ``get_span_context`` or with one
    its class marks ``span_context_is_field = True``), so the fields can be read
    directly."""
    plain = _plain_types.get(cls)
    if plain is None:
        plain = (
            issubclass(cls, ReadableSpan)
            and all(
                getattr(cls, name, None) is getattr(ReadableSpan, name) for name in _SPAN_PROPERTIES
            )
            and (
                getattr(cls, "get_span_context", None) is ReadableSpan.get_span_context
                # a class that says its own get_span_context returns the field
                # (``span.LeanSpan``; covered by the self-check's probes)
                or cls.__dict__.get("span_context_is_field") is True
            )
        )
        _plain_types[cls] = plain
    return plain


def encode_span(span: ReadableSpan) -> bytes:
    """The ``Span`` message of one ended span (payload, without its own tag/length)."""
    if _is_plain(span.__class__):
        # ReadableSpan's properties only return these fields (events and links as
        # tuples, attributes read-only); reading them directly saves a call each.
        context = span._context
        parent = span._parent
        name = span._name
        kind = span._kind
        start = span._start_time
        end = span._end_time
        status = span._status
        attributes = span._attributes
        events: Sequence[Any] = span._events
        links: Sequence[Any] = span._links
        dropped_attributes = getattr(attributes, "dropped", 0)
        dropped_events = getattr(events, "dropped", 0)
        dropped_links = getattr(links, "dropped", 0)
    else:
        context = span.get_span_context()
        parent = span.parent
        name = span.name
        kind = span.kind
        start = span.start_time
        end = span.end_time
        status = span.status
        attributes = span.attributes
        events = span.events
        links = span.links
        dropped_attributes = span.dropped_attributes
        dropped_events = span.dropped_events
        dropped_links = span.dropped_links
    if context is None:
        raise UnsupportedValue("span without a context")
    parts = [
        _T_TRACE_ID,
        context.trace_id.to_bytes(16, "big"),
        _T_SPAN_ID,
        context.span_id.to_bytes(8, "big"),
    ]
    if context.trace_state:
        parts.append(_trace_state(context.trace_state))
    if parent is not None:
        parts.append(_T_PARENT_SPAN_ID)
        parts.append(parent.span_id.to_bytes(8, "big"))
    parts.append(string_field(_T_NAME, name))
    parts.append(_KIND[kind])
    if start:
        parts.append(_T_START)
        parts.append(_pack_fixed64(start))
    if end:
        parts.append(_T_END)
        parts.append(_pack_fixed64(end))
    if attributes:
        parts += _span_attributes(attributes)
    if dropped_attributes:
        parts.append(_T_DROPPED_ATTRIBUTES + varint(dropped_attributes))
    if events:
        parts.append(_events(events))
    if dropped_events:
        parts.append(_T_DROPPED_EVENTS + varint(dropped_events))
    if links:
        parts.append(_links(links))
    if dropped_links:
        parts.append(_T_DROPPED_LINKS + varint(dropped_links))
    if status is not None:
        if status.status_code is _UNSET_CODE and not status.description:
            parts.append(_EMPTY_STATUS)
        else:
            parts.append(_status(status))
    parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
    return b"".join(parts)


_blocks: dict[int, tuple[object, bytes]] = {}


def _cached_block(obj: Any, encode: Any) -> bytes:
    """``encode(obj)``, cached by object identity (the provider's resource and the
    tracers' scopes live as long as the process)."""
    hit = _blocks.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    block: bytes = encode(obj)
    if len(_blocks) >= MAX_CACHED_BLOCKS:
        _blocks.clear()
    _blocks[id(obj)] = (obj, block)
    return block


def _resource_block(resource: Any) -> bytes:
    """Tag, length and payload of ``ResourceSpans.resource`` (plus the schema URL)."""
    block = len_prefixed(_T_RS_RESOURCE, attributes_field(b"\x0a", resource.attributes))
    return block


def _resource_schema(resource: Any) -> bytes:
    schema = resource.schema_url
    return string_field(_T_RS_SCHEMA_URL, schema) if schema else b""


def _scope_block(scope: Any) -> bytes:
    """Tag, length and payload of ``ScopeSpans.scope``; schema URL appended at the end."""
    if scope is None:
        return _T_SS_SCOPE + b"\x00"
    payload = b""
    if scope.name:
        payload += string_field(b"\x0a", scope.name)
    if scope.version:
        payload += string_field(b"\x12", scope.version)
    payload += attributes_field(b"\x1a", scope.attributes)
    return len_prefixed(_T_SS_SCOPE, payload)


def _scope_schema(scope: Any) -> bytes:
    schema = scope.schema_url if scope is not None else None
    return string_field(_T_SS_SCHEMA_URL, schema) if schema else b""


def _group(key: Any, ids: dict[int, int], keys: list[Any]) -> int:
    """Index of ``key`` among ``keys`` by equality (as a dict keyed by it would group),
    remembered per object identity in ``ids``."""
    index = ids.get(id(key))
    if index is None:
        for i, seen in enumerate(keys):
            if seen is key or seen == key:
                index = i
                break
        else:
            index = len(keys)
            keys.append(key)
        ids[id(key)] = index
    return index


# --- span records: an ended span as plain bytes until export ---------------------------------
#
# A span waiting in the batch queue keeps its objects alive until the next export (up to
# the schedule delay): on a server whose cyclic GC is its main cost (a NeMo Gym server),
# every GC-tracked object among them is promoted to the old generation and adds to what
# triggers, and is traversed by, the next full collection. A record is a plain ``bytes``,
# which the GC never tracks: the index of the span's (resource, scope) pair in a
# registry, then the span's ``Span`` message exactly as ``encode_request`` writes it
# (``encode_request`` adds the field's tag and length when it places it).

#: Bound of the (resource, scope) registry of records: past it, spans stay spans.
MAX_RECORD_SOURCES: Final = 4096

_sources: list[tuple[Any, Any]] = []
_source_index: dict[tuple[int, int], int] = {}
#: The registry's lock, in a list so a forked child can replace it (a thread holding
#: it at fork time does not exist in the child).
_sources_lock = [threading.Lock()]
os.register_at_fork(after_in_child=lambda: _sources_lock.__setitem__(0, threading.Lock()))


def _source(resource: Any, scope: Any) -> int | None:
    """The registry index of ``(resource, scope)`` (registered on first use; the registry
    holds them, so their ids stay theirs), or None when the registry is full."""
    index = _source_index.get((id(resource), id(scope)))
    if index is not None:
        return index
    with _sources_lock[0]:
        key = (id(resource), id(scope))
        index = _source_index.get(key)
        if index is None:
            if len(_sources) >= MAX_RECORD_SOURCES:
                return None
            index = len(_sources)
            _sources.append((resource, scope))
            _source_index[key] = index
        return index


def encode_record(span: ReadableSpan) -> bytes | None:
    """``span`` as a record (see above) that ``encode_request`` accepts in its place, or
    None when the (resource, scope) registry is full. Raises what ``encode_span`` raises
    (``UnsupportedValue`` for a span the stock encoder must handle)."""
    index = _source(span.resource, span.instrumentation_scope or None)
    if index is None:
        return None
    return _pack_index(index) + encode_span(span)


_NAME_FIELDS: dict[str, bytes] = {}
#: Bound of the memo of encoded span names (entries; cleared when full).
MAX_MEMO_NAMES: Final = 1024
_KIND_FIELDS: Final[dict[int, bytes]] = {id(kind): field for kind, field in _KIND.items()}
_SERVER: Final = SpanKind.SERVER
_KIND_SERVER: Final = _KIND[SpanKind.SERVER]
_INTERNAL: Final = SpanKind.INTERNAL
_KIND_INTERNAL: Final = _KIND[SpanKind.INTERNAL]
_TIMES: Final = struct.Struct("<BQBQ").pack
_T_START_BYTE: Final = _T_START[0]
_T_END_BYTE: Final = _T_END[0]


def encode_lean_record(span: Any) -> bytes | None:
    """The record of a ``span.LeanSpan`` its recorder ended: the same bytes as
    ``encode_record`` (``tests/agent/_lean/test_span_records.py`` checks both), written
    in one expression for the usual span (no trace state, events or links, status
    unset; anything else goes through ``encode_span``): ids from its ``SpanContext`` as
    a tuple (``context.TUPLE_LAYOUT``, which the recorder requires before it makes such
    spans), memoized name and attribute fields. None when the (resource, scope)
    registry is full. Raises ``UnsupportedValue`` as ``encode_span`` does."""
    recorder = span._recorder
    head: bytes | None = recorder.record_head
    if head is None:
        index = _source(span._resource, span._instrumentation_scope or None)
        if index is None:
            return None
        head = recorder.record_head = _pack_index(index)
    trace_id, span_id, _remote, _flags, state, _valid = span._context
    start = span._start_time
    end = span._end_time
    # _plain: no status, event or link was set (span.LeanSpan)
    if not span._plain or not start or not end or (state is not DEFAULT_TRACE_STATE and state):
        return head + encode_span(span)
    name = span._name
    get = _fields.get
    # a loop in this frame: a comprehension is a function call of its own in 3.11
    attributes: list[bytes] = []
    append = attributes.append
    try:
        for key, value in span._attributes.items():
            append(get((key, value, value.__class__)) or _attribute_field(key, value))
    except TypeError:  # an unhashable value (a map): the general encoder
        return head + encode_span(span)
    parent = span._parent
    kind = span._kind
    if parent is None:
        ids = _IDS(_T_IDS, trace_id >> 64, trace_id & _MASK_64, _T_SPAN_ID, span_id)
        tail = _TAIL_LOCAL
    else:
        ids = _IDS_PARENT(
            _T_IDS,
            trace_id >> 64,
            trace_id & _MASK_64,
            _T_SPAN_ID,
            span_id,
            _T_PARENT_SPAN_ID,
            parent[1],
        )
        tail = _TAIL_REMOTE if parent[2] else _TAIL_LOCAL
    return b"".join(
        [
            head,
            ids,
            _NAME_FIELDS.get(name) or _name_field(name),
            _KIND_SERVER
            if kind is _SERVER
            else (_KIND_INTERNAL if kind is _INTERNAL else _KIND_FIELDS[id(kind)]),
            _TIMES(_T_START_BYTE, start, _T_END_BYTE, end),
            *attributes,
            tail,
        ]
    )


def _name_field(name: str) -> bytes:
    """The ``Span.name`` field, remembered (``MAX_MEMO_NAMES``)."""
    field = string_field(_T_NAME, name)
    if len(_NAME_FIELDS) >= MAX_MEMO_NAMES:
        _NAME_FIELDS.clear()
    _NAME_FIELDS[name] = field
    return field


_MASK_64: Final = (1 << 64) - 1
# The trace id (tag, length, two big-endian halves) and the span id (tag, length, id);
# and with the parent span id after them: how every span message begins.
_T_IDS: Final = _T_TRACE_ID
_IDS: Final = struct.Struct(">2sQQ2sQ").pack
_IDS_PARENT: Final = struct.Struct(">2sQQ2sQ2sQ").pack


_pack_wide_index = struct.Struct("<BH").pack
_unpack_wide_index = struct.Struct("<H").unpack_from
#: Registry indexes below this one take one byte in a record; the others three (this
#: byte, then the index as two bytes, little-endian).
_WIDE: Final = 255


def _pack_index(index: int) -> bytes:
    """A record's head: the registry index in one byte, or ``_WIDE`` and two."""
    return _ONE_BYTE[index] if index < _WIDE else _pack_wide_index(_WIDE, index)


_ONE_BYTE: Final = [bytes((i,)) for i in range(_WIDE)]


def is_record(item: object) -> bool:
    """Whether a queued item is a record (``encode_record``) rather than a span."""
    return item.__class__ is bytes


#: ``ScopeSpans.spans`` tag and length of a span message of each size below this one.
_PREFIXED_SIZES: Final = 1024
_SPANS_FIELD_PREFIXES: Final = [_T_SS_SPANS + varint(n) for n in range(_PREFIXED_SIZES)]


def _slot(
    resource: Any,
    scope: Any,
    resource_ids: dict[int, int],
    resources: list[Any],
    groups: list[tuple[list[Any], dict[int, int], list[list[Any]]]],
) -> list[Any]:
    """The list of encoded spans of ``(resource, scope)`` in a request being built,
    grouped by equality as the stock encoder groups (first-seen order)."""
    r = _group(resource, resource_ids, resources)
    if r == len(groups):
        groups.append(([], {}, []))
    scopes, scope_ids, scope_spans = groups[r]
    s = _group(scope, scope_ids, scopes)
    if s == len(scope_spans):
        scope_spans.append([])
    return scope_spans[s]


def encode_request(spans: Sequence[ReadableSpan | bytes]) -> bytes:
    """A serialized ``ExportTraceServiceRequest`` of ``spans`` (module docstring), where
    any item may be a record of ``encode_record`` instead of the span itself: the
    message is the same either way.

    Raises ``UnsupportedValue`` for a batch the stock encoder must handle.
    """
    resources: list[Any] = []
    resource_ids: dict[int, int] = {}
    # per resource: (scopes in first-seen order, their identity map, encoded spans)
    groups: list[tuple[list[Any], dict[int, int], list[list[Any]]]] = []
    # per record registry index: the list its spans go to (grouped once per batch)
    slots: dict[int, list[Any]] = {}
    prefixes = _SPANS_FIELD_PREFIXES
    for span in spans:
        if span.__class__ is bytes:
            index = span[0]
            start = 1
            if index == _WIDE:
                index = _unpack_wide_index(span, 1)[0]
                start = 3
            slot = slots.get(index)
            if slot is None:
                resource, scope = _sources[index]
                slot = slots[index] = _slot(resource, scope, resource_ids, resources, groups)
            size = len(span) - start
            slot.append(prefixes[size] if size < _PREFIXED_SIZES else _T_SS_SPANS + varint(size))
            slot.append(span[start:])
            continue
        resource = span.resource  # type: ignore[union-attr]
        scope = span.instrumentation_scope or None  # type: ignore[union-attr]
        _slot(resource, scope, resource_ids, resources, groups).append(
            len_prefixed(_T_SS_SPANS, encode_span(span))  # type: ignore[arg-type]
        )
    # One flat list of pieces and one join: each block's length is the sum of its
    # pieces' lengths, so no block is built (copied) on its own before the request is.
    out: list[bytes] = []
    for resource, (scopes, _ids, scope_spans) in zip(resources, groups, strict=True):
        body: list[bytes] = [_cached_block(resource, _resource_block)]
        for scope, encoded_spans in zip(scopes, scope_spans, strict=True):
            scope_block = (
                _cached_block(scope, _scope_block) if scope is not None else _scope_block(None)
            )
            scope_schema = _scope_schema(scope)
            size = len(scope_block) + sum(map(len, encoded_spans)) + len(scope_schema)
            body.append(_T_RS_SCOPE_SPANS + varint(size))
            body.append(scope_block)
            body += encoded_spans
            body.append(scope_schema)
        body.append(_resource_schema(resource))
        out.append(_T_RESOURCE_SPANS + varint(sum(map(len, body))))
        out += body
    return b"".join(out)
