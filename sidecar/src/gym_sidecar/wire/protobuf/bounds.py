"""Bounds on what one OTLP request decodes to: nesting (``limits.max_message_depth``)
and number of messages (``limits.max_request_messages``).

Messages: decoding amplifies small inputs. Every protobuf message costs upb 50-180
bytes of memory (an empty Span 176) however few bytes it takes on the wire (2), so a
16 MiB request of empty spans decodes to ~1.4 GiB. :func:`count_messages` counts a
request's messages on the wire before it is decoded, and only for requests large
enough to hold more than the limit; :func:`json_values_exceed` bounds OTLP/JSON's values
the same way before ``json.loads``.

Depth is counted in protobuf message levels, the request being level 1: the unit the
protobuf parser (upb) and ``json_format`` count in, both of which refuse more than 100
levels on their own. An attribute's ``kvlistValue`` AnyValue adds 3 levels
(AnyValue, KeyValueList, KeyValue), an ``arrayValue`` 2, so 100 levels allow about 31
nested kvlists in a span attribute.

- OTLP/JSON: :func:`rewrite_json_ids` walks the decoded document iteratively (no
  recursion, so no RecursionError however deep) and refuses it as soon as objects nest
  deeper than the limit -- every OTLP/JSON object is a message, so object depth is
  message depth -- or any containers (arrays included) nest deeper than twice the
  limit, before anything is converted to protobuf. ``json.loads`` itself stops at about
  1000 levels with a RecursionError, which the decoder turns into the same refusal.
- Protobuf: upb stops at 100 levels; a lower configured limit is checked by
  :func:`message_depth_exceeds`, a walk over the decoded request that costs about as
  much as a second decode per message level visited (so it runs only when configured
  below 100).
"""

from __future__ import annotations

import base64
from typing import Any, Final

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

PARSER_MAX_DEPTH: Final = 100
"""upb's and json_format's own bound on message nesting (not configurable there)."""
DEPTH_LIMIT: Final = "max_message_depth"
"""The ``limit_hits`` label of nesting refusals."""
TOO_DEEP: Final = "too_deep"
"""The ``bad_requests`` reason of nesting refusals."""

# OTLP/JSON spells these bytes fields as hex, not as proto3-JSON base64 (OTLP spec,
# "JSON Protobuf Encoding"). They occur only as keys of span, link, log record and
# exemplar objects; attribute keys live under "key" values, never as object keys.
_HEX_ID_FIELDS: Final = frozenset(
    {"traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"}
)


class TooDeep(ValueError):
    """The input nests deeper than allowed; the message says how deep is allowed."""


class BadHexId(ValueError):
    """An id field of an OTLP/JSON object is not a hex string."""


def too_deep_message(max_depth: int) -> str:
    return (
        f"request nests deeper than {max_depth} message levels "
        f"(limits.{DEPTH_LIMIT}; each kvlist AnyValue level is 3)"
    )


def rewrite_json_ids(doc: dict[str, Any], max_depth: int) -> None:
    """Turn OTLP/JSON hex ids into proto3-JSON base64 in place, bounding the nesting.

    Raises :class:`TooDeep` when objects nest deeper than ``max_depth`` or containers
    deeper than ``2 * max_depth`` (valid OTLP/JSON has at most one array between two
    objects), and :class:`BadHexId` for an id that is not hex. Iterative: the cost is
    one step per object or array, whatever the depth.
    """
    max_containers = 2 * max_depth
    # (container, object depth, container depth); the root object is level 1.
    stack: list[tuple[Any, int, int]] = [(doc, 1, 1)]
    while stack:
        node, objects, containers = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, dict):
                if objects >= max_depth or containers >= max_containers:
                    raise TooDeep(too_deep_message(max_depth))
                stack.append((value, objects + 1, containers + 1))
            elif isinstance(value, list):
                if containers >= max_containers:
                    raise TooDeep(too_deep_message(max_depth))
                stack.append((value, objects, containers + 1))
            elif key in _HEX_ID_FIELDS and isinstance(value, str) and isinstance(node, dict):
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raise BadHexId(f"{key} must be a hex string, got {value[:64]!r}") from None
                # Replacing an existing key's value does not resize the dict mid-iteration.
                node[key] = base64.b64encode(raw).decode("ascii")


def message_depth_exceeds(message: Message, max_depth: int) -> bool:
    """Whether ``message`` (level 1) holds a message nested deeper than ``max_depth``.

    Iterative over set fields only; cost grows with the number of messages in the
    request, so the receivers call it only when ``max_depth`` is below what the
    protobuf parser already enforces.
    """
    stack: list[tuple[Message, int]] = [(message, 1)]
    while stack:
        node, depth = stack.pop()
        for field, value in node.ListFields():
            if field.type != FieldDescriptor.TYPE_MESSAGE:
                continue
            children = (value,) if isinstance(value, Message) else value
            for child in children:
                if depth >= max_depth:
                    return True
                stack.append((child, depth + 1))
    return False


MESSAGES_LIMIT: Final = "max_request_messages"
"""The ``limit_hits`` label of refusals for too many messages in one request."""
TOO_MANY_MESSAGES: Final = "too_many_messages"
"""The ``bad_requests`` reason of those refusals."""

_CHILDREN: dict[str, dict[int, Descriptor]] = {}


def _message_fields(descriptor: Descriptor) -> dict[int, Descriptor]:
    """Field number -> message type, for the message-typed fields of ``descriptor``."""
    children = _CHILDREN.get(descriptor.full_name)
    if children is None:
        children = {f.number: f.message_type for f in descriptor.fields if f.message_type}
        _CHILDREN[descriptor.full_name] = children
    return children


def count_messages(data: bytes, descriptor: Descriptor, limit: int) -> int:
    """How many protobuf messages ``data`` (a serialized ``descriptor``) holds, the
    request itself included, counting no further than ``limit + 1``.

    Reads the wire format without building anything: one step per field, skipping
    strings and other bytes by their length, so it costs Python time per element but no
    memory. Malformed input ends the count early; the real parser then refuses it.
    Callers run it only when ``len(data) > 2 * limit``: every message occupies at least
    two bytes (tag and length), so a smaller request cannot hold more than ``limit``.
    """
    count = 1
    stack: list[tuple[int, int, Descriptor]] = [(0, len(data), descriptor)]
    try:
        while stack:
            pos, end, desc = stack.pop()
            children = _message_fields(desc)
            while pos < end:
                # One-byte varints (almost every tag and small length) inline: this loop
                # runs once per field of the request.
                tag = data[pos]
                pos += 1
                if tag >= 0x80:
                    tag, pos = _varint(data, pos - 1)
                wire_type = tag & 7
                if wire_type == 0:
                    _, pos = _varint(data, pos)
                elif wire_type == 1:
                    pos += 8
                elif wire_type == 5:
                    pos += 4
                elif wire_type == 2:
                    length = data[pos]
                    pos += 1
                    if length >= 0x80:
                        length, pos = _varint(data, pos - 1)
                    child = children.get(tag >> 3)
                    if child is not None:
                        count += 1
                        if count > limit:
                            return count
                        stack.append((pos, pos + length, child))
                    pos += length
                elif wire_type == 3:
                    # A group: no OTLP field is one, but the parser keeps an unknown group
                    # and reads on, so the count must go on past it too.
                    pos = _skip_group(data, pos, tag >> 3)
                else:  # an end-group tag outside its group, or garbage: the parser refuses it
                    return count
    except IndexError:
        pass
    return count


def _skip_group(data: bytes, pos: int, number: int) -> int:
    """The offset after the end-group tag that closes group ``number``, whose start tag
    ends at ``pos``: nested groups included, nothing in them counted (a group's contents
    are unknown fields). IndexError when it is malformed, which ends the count."""
    open_groups = [number]
    while open_groups:
        tag, pos = _varint(data, pos)
        wire_type = tag & 7
        if wire_type == 0:
            _, pos = _varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            pos += length
        elif wire_type == 3:
            open_groups.append(tag >> 3)
        elif wire_type == 4 and tag >> 3 == open_groups[-1]:
            open_groups.pop()
        else:
            raise IndexError("malformed group")
    return pos


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    byte = data[pos]
    if byte < 0x80:
        return byte, pos + 1
    value = byte & 0x7F
    shift = 7
    while True:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")  # malformed: stop counting


def too_many_messages_message(limit: int, what: str = "protobuf messages") -> str:
    return (
        f"request holds more than {limit} {what} (spans, attributes, values ...;"
        f" limits.{MESSAGES_LIMIT})"
    )


def json_values_exceed(data: bytes, limit: int) -> bool:
    """Whether an OTLP/JSON body may hold more than ``limit`` JSON values: an upper bound
    from counting ``{``, ``[`` and ``,`` bytes (C speed; ones inside strings count too),
    checked before ``json.loads`` builds a Python object for each (40-110 bytes apiece,
    measured). Bodies of at most ``2 * limit`` bytes are never refused."""
    if len(data) <= 2 * limit:
        return False
    return data.count(b"{") + data.count(b"[") + data.count(b",") > limit
