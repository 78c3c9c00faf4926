"""API v3's query parameters, read as Jaeger v2's HTTP gateway reads them.

Each parameter has its canonical lowerCamelCase name (proto3 JSON's) and the older
snake_case one; the canonical one wins when both are given (Jaeger's rule):

- search (``/api/v3/traces``, ``/api/v3/trace-summaries``): ``query.serviceName``
  (``query.service_name``; none: any service), ``query.operationName``
  (``query.operation_name``), ``query.attributes`` (a JSON object of string -> string),
  ``query.startTimeMin`` / ``query.startTimeMax`` (``query.start_time_min`` /
  ``..._max``; RFC 3339 times, min before max), ``query.durationMin`` /
  ``query.durationMax`` (``query.duration_min`` / ``..._max``; Go durations),
  ``query.searchDepth`` (``query.search_depth``, or the older ``query.num_traces``;
  traces, default 100, 1 to :data:`~.search.MAX_LIMIT`), ``query.rawTraces``
  (``query.raw_traces``); ``query.filter`` (Jaeger's expression filter) is refused
  with a 400, as Jaeger refuses a query its storage cannot serve;
- one trace (``/api/v3/traces/{trace_id}``): the id as hex (up to 32 digits) or as
  base64 of its 16 (or 8) bytes; ``startTime`` / ``endTime`` (``start_time`` /
  ``end_time``, RFC 3339; checked, then ignored, as Jaeger's memory store ignores
  them: a trace is found by id alone); ``rawTraces`` (``raw_traces``).

Every malformed value raises :class:`ParamError` with Jaeger's wording (``malformed
parameter NAME: why``). One difference: Jaeger answers 400 when either search time is
missing; here a missing one is no bound, because the 2.x UI sends neither for a search
link without a lookback (``/search?service=S``, as a hand-made link or a bookmark
carries) and would show an error where Jaeger's own store has every trace to show.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gym_sidecar.query.search import (
    MAX_LIMIT,
    SearchError,
    TraceQuery,
    parse_bool,
    parse_go_duration,
)

DEFAULT_SEARCH_DEPTH: Final = 100
_RFC3339: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)
_HEX: Final = frozenset("0123456789abcdefABCDEF")


class ParamError(ValueError):
    """A parameter is missing or malformed; the message says which and why."""


def get(params: Mapping[str, str], canonical: str, deprecated: str) -> tuple[str, str]:
    """(value, the name it was given under): the canonical name's when not empty."""
    value = params.get(canonical, "")
    if value:
        return value, canonical
    return params.get(deprecated, ""), deprecated


def parse_rfc3339_ns(text: str, name: str) -> int:
    """An RFC 3339 time (``2026-01-02T03:04:05.123456789Z``, an offset instead of Z) in
    nanoseconds since the epoch."""
    m = _RFC3339.fullmatch(text)
    if m is None:
        raise ParamError(f"malformed parameter {name}: not an RFC 3339 time: {text!r}")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if not (
        year >= 1
        and 1 <= month <= 12
        and 1 <= day <= calendar.monthrange(year, month)[1]
        and hour < 24
        and minute < 60
        and second < 60
    ):
        raise ParamError(f"malformed parameter {name}: time out of range: {text!r}")
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if m.group(9):
        offset_s = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        seconds -= offset_s if m.group(9) == "+" else -offset_s
    fraction = (m.group(7) or "").ljust(9, "0")
    return seconds * 1_000_000_000 + int(fraction)


def _bool(text: str, name: str) -> bool:
    value = parse_bool(text)
    if value is None:
        raise ParamError(f"malformed parameter {name}: not a bool: {text!r}")
    return value


def _duration(params: Mapping[str, str], canonical: str, deprecated: str) -> int | None:
    text, name = get(params, canonical, deprecated)
    if not text:
        return None
    try:
        ns = parse_go_duration(text)
    except SearchError as exc:
        raise ParamError(f"malformed parameter {name}: {exc}") from None
    return ns or None  # 0 is "no bound", as in Jaeger


def _attributes(text: str) -> dict[str, str]:
    name = "query.attributes"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ParamError(f"malformed parameter {name}: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise ParamError(f"malformed parameter {name}: must be a JSON object of string values")
    return doc


@dataclass(frozen=True)
class FindQuery:
    """A parsed v3 search."""

    query: TraceQuery
    raw: bool = False


def parse_find(params: Mapping[str, str]) -> FindQuery:
    """The search of ``/api/v3/traces`` and ``/api/v3/trace-summaries``."""
    service, _ = get(params, "query.serviceName", "query.service_name")
    operation, _ = get(params, "query.operationName", "query.operation_name")
    attributes = _attributes(params["query.attributes"]) if params.get("query.attributes") else {}
    if params.get("query.filter"):
        raise ParamError("query.filter: expression filters are not supported by the local store")
    min_text, min_name = get(params, "query.startTimeMin", "query.start_time_min")
    max_text, max_name = get(params, "query.startTimeMax", "query.start_time_max")
    # Jaeger requires both; a missing one is no bound here (see the module docstring)
    start_ns = parse_rfc3339_ns(min_text, min_name) if min_text else None
    end_ns = parse_rfc3339_ns(max_text, max_name) if max_text else None
    if start_ns is not None and end_ns is not None and start_ns >= end_ns:
        raise ParamError("query.startTimeMin must be before query.startTimeMax")
    depth_text, depth_name = get(params, "query.searchDepth", "query.search_depth")
    if not depth_text:
        depth_text, depth_name = params.get("query.num_traces", ""), "query.num_traces"
    depth = DEFAULT_SEARCH_DEPTH
    if depth_text:
        try:
            depth = int(depth_text)
        except ValueError:
            raise ParamError(f"malformed parameter {depth_name}: not an integer") from None
        if not 1 <= depth <= MAX_LIMIT:
            raise ParamError(f"{depth_name} must be 1 to {MAX_LIMIT}, got {depth}")
    raw_text, raw_name = get(params, "query.rawTraces", "query.raw_traces")
    return FindQuery(
        TraceQuery(
            service=service or None,
            operation=operation or None,
            tags=attributes,
            start_ns=start_ns,
            end_ns=end_ns,
            min_duration_ns=_duration(params, "query.durationMin", "query.duration_min"),
            max_duration_ns=_duration(params, "query.durationMax", "query.duration_max"),
            limit=depth,
        ),
        raw=_bool(raw_text, raw_name) if raw_text else False,
    )


def parse_trace_id(text: str) -> str:
    """A trace id given as hex (leading zeros may be dropped) or base64, as 32 hex
    digits."""
    if 1 <= len(text) <= 32 and set(text) <= _HEX:
        return text.lower().rjust(32, "0")
    if 0 < len(text) <= 24:
        padded = text + "=" * (-len(text) % 4)
        for altchars in (b"+/", b"-_"):  # standard and URL-safe base64
            try:
                raw = base64.b64decode(padded, altchars=altchars, validate=True)
            except (binascii.Error, ValueError):
                continue
            if len(raw) in (8, 16):
                return raw.hex().rjust(32, "0")
    raise ParamError(f"malformed parameter trace_id: not a trace id (32 hex digits): {text!r}")


def check_trace_params(params: Mapping[str, str]) -> bool:
    """Checks ``startTime`` / ``endTime``; returns ``rawTraces``."""
    for canonical, deprecated in (("startTime", "start_time"), ("endTime", "end_time")):
        text, name = get(params, canonical, deprecated)
        if text:
            parse_rfc3339_ns(text, name)
    raw_text, raw_name = get(params, "rawTraces", "raw_traces")
    return _bool(raw_text, raw_name) if raw_text else False
