"""Decoding one OTLP request body into a protobuf message (upb), or refusing it.

Decoding never raises anything but :class:`BadRequest`, whose message is safe to send
back to the client. The bounds on what a request may decode to (nesting, number of
messages) are :mod:`gym_sidecar.wire.protobuf.bounds`'. Metrics and logs travel the pipeline
as the messages decoded here; traces as a wire view (:mod:`gym_sidecar.wire.protobuf.scan`,
which validates with :func:`decode_protobuf`).
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from google.protobuf.message import DecodeError

from gym_sidecar.core.signals import SignalSpec
from gym_sidecar.core.stage import ProtoRequest
from gym_sidecar.wire.protobuf.bounds import (
    DEPTH_LIMIT,
    MESSAGES_LIMIT,
    PARSER_MAX_DEPTH,
    TOO_DEEP,
    TOO_MANY_MESSAGES,
    BadHexId,
    TooDeep,
    count_messages,
    json_values_exceed,
    message_depth_exceeds,
    rewrite_json_ids,
    too_deep_message,
    too_many_messages_message,
)


class BadRequest(Exception):
    """The client sent something that is not a valid OTLP request (permanent error)."""

    def __init__(self, message: str, reason: str = "bad_request", limit: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.limit = limit
        """The ``limits.`` key that refused the request, counted in ``limit_hits``."""


def too_deep(max_depth: int) -> BadRequest:
    """The refusal of a request nested deeper than ``max_depth`` message levels."""
    return BadRequest(too_deep_message(max_depth), TOO_DEEP, DEPTH_LIMIT)


DEFAULT_MAX_MESSAGES = 1_000_000


def too_many(max_messages: int, what: str = "protobuf messages") -> BadRequest:
    """The refusal of a request holding more than ``max_messages`` messages."""
    message = too_many_messages_message(max_messages, what)
    return BadRequest(message, TOO_MANY_MESSAGES, MESSAGES_LIMIT)


def decode_protobuf(
    spec: SignalSpec,
    data: bytes,
    max_depth: int = PARSER_MAX_DEPTH,
    max_messages: int = DEFAULT_MAX_MESSAGES,
) -> ProtoRequest:
    """Parse binary protobuf with the upb backend; BadRequest when it is not one.

    Nesting beyond ``max_depth`` message levels is refused (see wire/protobuf/bounds.py):
    upb itself stops at 100; a lower limit costs an extra walk of the decoded request.
    So is a request of more than ``max_messages`` messages, counted on the wire before
    decoding when it is large enough to hold that many.
    """
    descriptor: Any = spec.request_type.DESCRIPTOR
    if (
        len(data) > 2 * max_messages
        and count_messages(data, descriptor, max_messages) > max_messages
    ):
        raise too_many(max_messages)
    msg = spec.request_type()
    try:
        msg.ParseFromString(data)
    except DecodeError as exc:
        if "MaxDepth" in str(exc):  # upb: "Exceeded upb_DecodeOptions_MaxDepth"
            raise too_deep(min(max_depth, PARSER_MAX_DEPTH)) from None
        raise BadRequest(f"body is not a valid {spec.request_type.__name__}: {exc}") from None
    if max_depth < PARSER_MAX_DEPTH and message_depth_exceeds(msg, max_depth):
        raise too_deep(max_depth)
    return msg  # type: ignore[return-value]


def decode_json(
    spec: SignalSpec,
    data: bytes,
    max_depth: int = PARSER_MAX_DEPTH,
    max_messages: int = DEFAULT_MAX_MESSAGES,
) -> ProtoRequest:
    """Parse OTLP/JSON: hex ids, camelCase or snake_case names, enums as ints or names.

    Unknown fields are ignored, as the OTLP spec asks of receivers. Nesting beyond
    ``max_depth`` message levels is refused before any conversion, and a body that may
    hold more than ``max_messages`` JSON values (objects, arrays, members, elements)
    before it is parsed
    (wire/protobuf/bounds.py).
    """
    if json_values_exceed(data, max_messages):
        raise too_many(max_messages, "JSON values")
    try:
        doc = json.loads(data)
    except RecursionError:
        # json's C scanner guards its own recursion (~1000 levels): far past any limit.
        raise too_deep(max_depth) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    try:
        rewrite_json_ids(doc, max_depth)
    except TooDeep:
        raise too_deep(max_depth) from None
    except BadHexId as exc:
        raise BadRequest(str(exc)) from None
    # Imported at the first JSON body: json_format (~0.3-0.8 MiB resident) is used by
    # OTLP/JSON alone, and most clients send protobuf.
    from google.protobuf import json_format

    msg = spec.request_type()
    try:
        json_format.ParseDict(
            doc, msg, ignore_unknown_fields=True, max_recursion_depth=PARSER_MAX_DEPTH
        )
    # json_format lets OverflowError out of an enum given as an infinite number
    # (``"kind": Infinity``, ``1e400``): int(float("inf")) in its enum conversion
    except (json_format.ParseError, binascii.Error, ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(
            f"body is not a valid OTLP/JSON {spec.signal.value} request: {exc}"
        ) from None
    return msg  # type: ignore[return-value]
