"""Nesting bounds for decoded OTLP requests (``limits.max_message_depth``).

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

from google.protobuf.descriptor import FieldDescriptor
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
