"""What travels between Gym servers: W3C ``traceparent`` and the rollout id as baggage.

Gym carries the rollout id between processes only when its config has
``observability_enabled: true`` (as a ``/ng-rollout/<id>/`` URL prefix). So every hop
also carries it as W3C baggage, key ``nemo.gym.rollout.id``, and the receiving server
restores it into the rollout-correlation ContextVar (Gym's own), where every span of
that request -- and Gym's own code -- finds it.

A hop made while a recorded ``gym.rollout`` span encloses the code
(``rollout_correlation.ENCLOSING_ROLLOUT``) also carries the baggage member
``nemo.gym.rollout.outer=1``: the receiving server's SERVER layer sets
``ENCLOSING_ROLLOUT`` for that request, so a ``/run`` relayed from inside a recorded
rollout marks its own span nested. Without a recorded outer span (rollout group off on
the caller, a plain client) the member is not written, and the inner ``/run`` stays the
outermost rollout.

Only those two baggage keys are written and read; other baggage members in an incoming
header are ignored, and an outgoing header that already has baggage keeps it. A rollout
id that does not look like one (``rollout_correlation.valid_rollout_id``) is ignored.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import MutableMapping
from typing import Final
from urllib.parse import unquote

import gym_telemetry_semconv as semconv
from opentelemetry.context import Context
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gym_telemetry import rollout_correlation
from gym_telemetry._lean.context import get_current as _get_current
from gym_telemetry._lean.context import span_context as _span_context
from gym_telemetry._lean.sdk_hooks import SPAN_KEY
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.rollout_correlation import ENCLOSING_ROLLOUT, valid_rollout_id

#: The baggage key carrying the rollout id (same name as the span attribute).
BAGGAGE_KEY: Final = semconv.ROLLOUT_ID
#: The baggage key marking a hop made inside a recorded ``gym.rollout`` span.
OUTER_BAGGAGE_KEY: Final = semconv.ROLLOUT_OUTER_BAGGAGE
#: The member written for it (the only value read as true).
OUTER_BAGGAGE_MEMBER: Final = OUTER_BAGGAGE_KEY + "=1"
_BAGGAGE_KEY_BYTES: Final = BAGGAGE_KEY.encode()
_OUTER_KEY_BYTES: Final = OUTER_BAGGAGE_KEY.encode()
_TRACE_CONTEXT: Final = TraceContextTextMapPropagator()
# The common ``traceparent`` form (version 00, no tracestate) is parsed here; anything
# else goes through the SDK propagator. Same acceptance rules for that form.
# One shared TraceFlags per value: a parsed parent keeps no flags object of its own
# (fewer GC-tracked objects held by every queued span). Keyed by the two lowercase hex
# digits of the header.
_FLAGS: Final = tuple(TraceFlags(value) for value in range(256))
_HEX_FLAGS: Final = {b"%02x" % value: flags for value, flags in enumerate(_FLAGS)}
_DASH: Final = ord("-")
_unhexlify: Final = binascii.unhexlify
_from_bytes: Final = int.from_bytes
_EMPTY_CONTEXT: Final = Context()
# The baggage header this module writes, exactly: the rollout id, and the outer-rollout
# member after it (``inject``). Read in one match; any other header member by member.
_OWN_BAGGAGE: Final = re.compile(
    re.escape(_BAGGAGE_KEY_BYTES)
    + rb"=([A-Za-z0-9][A-Za-z0-9._-]{0,%d})(," % (rollout_correlation.MAX_ROLLOUT_ID_CHARS - 1)
    + re.escape(OUTER_BAGGAGE_MEMBER.encode())
    + rb")?"
)


def rollout_id_from_baggage(header: bytes) -> str | None:
    """The ``nemo.gym.rollout.id`` member of a W3C ``baggage`` header value, or None."""
    if _BAGGAGE_KEY_BYTES not in header:
        return None
    try:
        text = header.decode("latin-1")
    except Exception:  # bad bytes from the wire: ignore the header
        return None
    for member in text.split(","):
        key, sep, rest = member.partition("=")
        if not sep or key.strip() != BAGGAGE_KEY:
            continue
        value = unquote(rest.split(";", 1)[0].strip())
        return value if valid_rollout_id(value) else None
    return None


def outer_rollout_in_baggage(header: bytes) -> bool:
    """Whether a W3C ``baggage`` header value carries ``nemo.gym.rollout.outer=1``.

    One substring test when the key is absent (the common case). Never raises.
    """
    if _OUTER_KEY_BYTES not in header:
        return False
    try:
        text = header.decode("latin-1")
    except Exception:  # bad bytes from the wire: ignore the header
        return False
    for member in text.split(","):
        key, sep, rest = member.partition("=")
        if sep and key.strip() == OUTER_BAGGAGE_KEY:
            return rest.split(";", 1)[0].strip() == "1"
    return False


def read_rollout_baggage(header: bytes) -> tuple[str | None, bool]:
    """``(rollout_id_from_baggage(header), outer_rollout_in_baggage(header))`` in one
    pass: one match for the header ``inject`` writes, member by member otherwise."""
    match = _OWN_BAGGAGE.fullmatch(header)
    if match is not None:
        rollout_id, outer = match.groups()
        return rollout_id.decode("ascii"), outer is not None
    return rollout_id_from_baggage(header), outer_rollout_in_baggage(header)


def parse_traceparent(traceparent: bytes, tracestate: bytes | None) -> SpanContext | None:
    """The remote parent's span context from a ``traceparent`` header (and
    ``tracestate``), or None when invalid: what the SDK's W3C propagator extracts."""
    if (
        not tracestate
        and len(traceparent) == 55
        and traceparent[:3] == b"00-"
        and traceparent[35] == _DASH
        and traceparent[52] == _DASH
        and traceparent.lower() == traceparent  # lowercase hex only, as the SDK's rule
    ):
        # ``00-<32 hex>-<16 hex>-<2 hex>``: the fields by position, decoded by binascii
        # (a regex match and int(..., 16) cost ~3x the instructions on every request)
        flags = _HEX_FLAGS.get(traceparent[53:])
        if flags is not None:
            try:
                trace_id = _from_bytes(_unhexlify(traceparent[3:35]), "big")
                span_id = _from_bytes(_unhexlify(traceparent[36:52]), "big")
            except ValueError:  # not hex (binascii.Error): the SDK's propagator decides
                pass
            else:
                if not trace_id or not span_id:
                    return None
                return _span_context(trace_id, span_id, True, flags, DEFAULT_TRACE_STATE)
    carrier = {"traceparent": traceparent.decode("latin-1")}
    if tracestate:
        carrier["tracestate"] = tracestate.decode("latin-1")
    span_context = get_current_span(_TRACE_CONTEXT.extract(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


def extract_parent(traceparent: bytes, tracestate: bytes | None) -> Context | None:
    """The remote parent context from a ``traceparent`` header, or None when invalid."""
    parent = parse_traceparent(traceparent, tracestate)
    if parent is None:
        return None
    return set_span_in_context(NonRecordingSpan(parent), _EMPTY_CONTEXT)


def _add_member(headers: MutableMapping[str, str], key: str, member: str) -> None:
    existing = headers.get("baggage")
    if existing and key not in existing:
        headers["baggage"] = f"{existing},{member}"
    elif not existing:
        headers["baggage"] = member


def inject(headers: MutableMapping[str, str]) -> None:
    """Write ``traceparent`` (+``tracestate``) of the current span and the rollout baggage:
    the rollout id, and ``nemo.gym.rollout.outer=1`` while a recorded rollout span
    encloses the caller (``ENCLOSING_ROLLOUT``).

    Writes no trace context when there is no valid current span. Never raises for a
    missing rollout id; the caller guards against other failures.
    """
    span = _get_current().get(SPAN_KEY)
    if type(span) is LeanSpan:  # the W3C propagator's headers, written directly
        traceparent, tracestate = span.w3c_trace_context()
        headers["traceparent"] = traceparent
        if tracestate is not None:
            headers["tracestate"] = tracestate
    else:
        _TRACE_CONTEXT.inject(headers)
    rollout_id = rollout_correlation.current_rollout_id()
    outer = bool(ENCLOSING_ROLLOUT.get())
    if "baggage" in headers or not (rollout_id is None or rollout_id.__class__ is str):
        # the caller's own baggage (the members join it), or an odd id: not remembered
        for key, member in _members(rollout_id, outer):
            _add_member(headers, key, member)
        return
    memo_key = (rollout_id, outer)
    baggage = _BAGGAGE.get(memo_key)
    if baggage is None:
        baggage = ",".join([member for _key, member in _members(rollout_id, outer)])
        if len(_BAGGAGE) >= MAX_CACHED_BAGGAGE:
            _BAGGAGE.clear()
        _BAGGAGE[memo_key] = baggage
    if baggage:
        headers["baggage"] = baggage


#: Bound of the memo of baggage headers (entries; cleared when full): one per rollout in
#: flight here, and each rollout's hops write the same header.
MAX_CACHED_BAGGAGE: Final = 1024
_BAGGAGE: dict[tuple[str | None, bool], str] = {}


def _members(rollout_id: str | None, outer: bool) -> list[tuple[str, str]]:
    """The baggage members ``inject`` writes, as ``(key, member)``: the rollout id when
    it is a valid one, and the outer-rollout marker."""
    members = []
    if rollout_id and valid_rollout_id(rollout_id):
        members.append((BAGGAGE_KEY, f"{BAGGAGE_KEY}={rollout_id}"))
    if outer:
        members.append((OUTER_BAGGAGE_KEY, OUTER_BAGGAGE_MEMBER))
    return members
