"""The sidecar's native trace scanner (Rust): validation as upb does it, plus the wire
index of ``gym_sidecar.core.traces``. Optional; docs/native.md."""

from collections.abc import Callable
from typing import TypeVar

_R = TypeVar("_R")
_S = TypeVar("_S")

_AttrValue = bool | str | int | float | bytes | None
_DerivedSpan = tuple[str, int, int, bytes, bytes, int, tuple[_AttrValue, ...]]

class DecodeError(ValueError):
    """Not a valid ExportTraceServiceRequest: upb would refuse it. The message is upb's
    own (``Error parsing message with type '...': Wire format was corrupt`` or ``...: String
    field had bad UTF-8``), so a refusal reads the same whichever scanner ran."""

    detail: str
    """What is wrong, in which message, at which byte."""
    offset: int
    """The byte of ``data`` where it is wrong (the faulty field's tag)."""

class TooDeep(ValueError):
    """Messages nest deeper than ``max_depth`` levels when it is below 100, else deeper
    than upb's own 101 (the request is level 1)."""

class TooManyMessages(ValueError):
    """More than ``max_messages`` messages (the request included)."""

def scan_traces(
    data: bytes,
    max_depth: int,
    max_messages: int,
    derive_scopes: frozenset[str],
    attr_keys: tuple[str, ...],
    resource_block: Callable[[int, int, bytes | None, list[_S], list[tuple[int, int]]], _R],
    scope_block: Callable[[int, int, str, int, list[_DerivedSpan] | None], _S],
    event_keys: tuple[tuple[str, str], ...] | None = None,
    split_scopes: frozenset[str] | None = None,
    sparse_scopes: frozenset[str] | None = None,
    sparse_keys: tuple[str, ...] | None = None,
) -> tuple[list[_R], list[tuple[int, int]]]:
    """Validate ``data`` as an OTLP ExportTraceServiceRequest and return its index.

    Accepts and refuses exactly as the receiver's ``decode_protobuf`` (upb's
    ``ParseFromString`` with the two limits on top), in its order:

    1. :class:`TooManyMessages` when ``data`` is longer than 2 x ``max_messages`` and
       ``gym_sidecar.wire.protobuf.bounds.count_messages`` counts more than ``max_messages``
       messages in it (the request included; on a corrupt request too, as the receiver
       counts before parsing);
    2. what upb refuses, at the first fault in wire order: :class:`DecodeError`, or
       :class:`TooDeep` for a message at level 102 (upb's own limit);
    3. below ``max_depth`` 100, :class:`TooDeep` when the parsed request holds a message
       deeper than ``max_depth`` levels, counted as ``limits.message_depth_exceeds``
       counts (an AnyValue member replaced by a later one does not count, as it is not
       in the parsed tree).

    Returns ``(blocks, other)``: ``resource_block(start, end, resource, scopes, other)``
    for each ``resource_spans`` field in wire order (``start``/``end``: the field's bytes,
    tag included; ``resource``: the bodies of all its ``resource`` fields concatenated,
    None without one; ``scopes``: ``scope_block(start, end, name, spans, derived)`` per
    ``scope_spans`` field; ``other``: its other fields' ranges), and the ranges of the
    request's other fields. A field of the schema with another wire type than its own is
    an unknown field, so "other". ``name`` is the merged ``InstrumentationScope.name``
    (``""`` without one); ``spans`` the number of ``spans`` fields; ``derived`` is None
    unless ``name in derive_scopes``, then one ``DerivedSpan`` (``core.traces``) per span:
    ``(name, start_time_unix_nano, end_time_unix_nano, trace_id, span_id, status_code,
    values)``, each the last occurrence of its field (``Status.code`` merged over every
    ``status`` field, 0 without one) and ``values[i]`` the value of the span's last
    attribute whose key is ``attr_keys[i]``: bool, str, int (``int_value``, also
    ``string_value_strindex``), float or bytes, None when it has none or its value is
    unset, an array or a kvlist; then, for each ``(event name, key)`` of ``event_keys``,
    the value (the same kinds) of that key's last occurrence in the span's last event of
    that name (an event's name merged: its last ``name`` field) that has the key, None
    when none has and for every span whose status code is not 2 (ERROR). A derive block
    whose ``name in sparse_scopes`` lists only its spans with a value (not None) for one
    of ``sparse_keys`` (each one of ``attr_keys``, else ValueError), in wire order. A block whose
    ``name in split_scopes`` gets the attribute ``split`` set on the object
    ``scope_block`` returned: one ``(name, start, end)`` per span in wire order, the
    span's name (its last ``name`` field, ``""`` without one) and its ``spans`` field's
    bytes, tag included (``core.traces.SplitSpan``).
    """

def count_messages(data: bytes, limit: int) -> int:
    """What ``gym_sidecar.wire.protobuf.bounds.count_messages`` returns for this trace request
    (its port, the one ``scan_traces`` uses on corrupt requests; exposed for tests)."""

def schema() -> list[tuple[str, int, str, str, str | None]]:
    """The schema compiled in: ``(message full name, field number, field name, kind,
    message type full name or None)``, kind one of ``varint``, ``fixed64``, ``fixed32``,
    ``bytes``, ``string``, ``message``."""
