"""Trace search, shared by both API lines: the query, which stored traces match, and
the classic ``GET /api/traces`` parameters (API v3's are parsed in :mod:`.v3_params`).

Classic parameters (Jaeger's query service names them so): ``service`` (required,
exact name), ``operation``, ``tags`` (a JSON object of key -> value; the older
``tag=key:value`` form, repeated, is read too), ``start`` / ``end`` (microseconds
since the epoch), ``minDuration`` / ``maxDuration`` (Go durations: ``1.5s``, ``200ms``,
``10us``), ``limit`` (traces; default 20, at most :data:`MAX_LIMIT`). ``lookback`` is
the UI's label for start/end and is ignored. (``traceID``, the search by ids, is
answered in :mod:`.api`.)

A trace matches when one of its spans satisfies every condition at once: its service
(any service when the query names none), its name, its start within [start, end], its
duration within [min, max], and each attribute, as Jaeger v2's own store matches them
(:func:`attribute_matches`). Results are whole traces, most recently stored first.
Candidates come from the store's per-trace index (service, rollout id, stored time); at
most :data:`SCAN_TRACES` of them are read per search, and the result says when that
bound stopped it.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_sidecar.query.model import KIND_NAMES, STATUS_NAMES, span_tags
from gym_sidecar.store import queries
from gym_sidecar.store.queries import STATUS_ERROR, SpanRecord

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 1500
"""Most traces one search returns (the Jaeger UI's own ``search.maxLimit``)."""
SCAN_TRACES: Final = 5000
"""Most candidate traces one search decodes (newest first)."""

_GO_DURATION: Final = re.compile(r"([+-]?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_GO_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_KINDS_BY_NAME: Final = {name.upper(): kind for kind, name in KIND_NAMES.items()}
_STATUS_BY_NAME: Final = {name: code for code, name in STATUS_NAMES.items()}


class SearchError(ValueError):
    """A search parameter is malformed; the message says which and why."""


def parse_go_duration(text: str) -> int:
    """A Go duration (``1h2m``, ``1.5s``, ``300ms``, ``10us``, ``0``) in nanoseconds,
    as Go's ``time.ParseDuration`` reads it."""
    text = text.strip()
    if text in ("0", "+0", "-0"):
        return 0
    match = _GO_DURATION.fullmatch(text)
    if match is None:
        raise SearchError(f"not a duration: {text!r} (e.g. 1.5s, 200ms, 10us)")
    total = sum(Decimal(n) * _UNIT_NS[unit] for n, unit in _GO_PART.findall(text))
    return int(-total if match.group(1) == "-" else total)


def parse_bool(text: str) -> bool | None:
    """Go's ``strconv.ParseBool``: True/False, None when ``text`` is neither."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    return None


@dataclass(frozen=True)
class TraceQuery:
    """A parsed search (times and durations in nanoseconds)."""

    service: str | None
    operation: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    min_duration_ns: int | None = None
    max_duration_ns: int | None = None
    limit: int = DEFAULT_LIMIT


@dataclass(frozen=True)
class Found:
    """A search's answer: the matching traces (id, spans), most recently stored first,
    and whether :data:`SCAN_TRACES` stopped the search before it ran out of candidates."""

    traces: list[tuple[str, list[SpanRecord]]]
    scan_limited: bool = False


def _int(params: Mapping[str, str], key: str) -> int | None:
    value = params.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise SearchError(f"{key} must be an integer, got {value!r}") from None


def parse_query(params: Mapping[str, str], tag_params: Sequence[str] = ()) -> TraceQuery:
    """A :class:`TraceQuery` from the classic query string; raises :class:`SearchError`."""
    service = params.get("service", "")
    if not service:
        raise SearchError("parameter 'service' is required")
    tags: dict[str, str] = {}
    raw_tags = params.get("tags")
    if raw_tags:
        try:
            decoded = json.loads(raw_tags)
        except ValueError as exc:
            raise SearchError(f"malformed 'tags' parameter: {exc}") from None
        if not isinstance(decoded, dict):
            raise SearchError("'tags' must be a JSON object of key -> value")
        tags.update({str(k): text_of(v) for k, v in decoded.items()})
    for item in tag_params:
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise SearchError(f"malformed 'tag' parameter {item!r} (expected key:value)")
        tags[key] = value
    limit = _int(params, "limit") or DEFAULT_LIMIT
    if limit < 0:
        raise SearchError("limit must not be negative")
    start_us, end_us = _int(params, "start"), _int(params, "end")
    min_d, max_d = params.get("minDuration"), params.get("maxDuration")
    return TraceQuery(
        service=service,
        operation=params.get("operation") or None,
        tags=tags,
        start_ns=None if start_us is None else start_us * 1000,
        end_ns=None if end_us is None else end_us * 1000,
        min_duration_ns=parse_go_duration(min_d) if min_d else None,
        max_duration_ns=parse_go_duration(max_d) if max_d else None,
        limit=min(limit, MAX_LIMIT),
    )


def text_of(value: Any) -> str:
    """A value as the search compares it (Go's ``AsString``: ``true``, ``200``, ``0.5``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}[repr(value)]
        return format(Decimal(repr(value)).normalize(), "f")
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def attribute_matches(span: SpanRecord, key: str, wanted: str) -> bool:
    """Whether ``span`` has attribute ``key`` = ``wanted``, as Jaeger v2's memory store
    decides it: ``error`` (a bool: ``true`` the spans whose status is ERROR, ``false``
    the others; any other value matches nothing), ``span.status`` (OK, ERROR, else
    UNSET), ``span.kind`` (server, client...), ``scope.name``, ``scope.version``,
    ``resource.K`` (resource attribute K only); any other key is looked up among the
    span's attributes, its resource's and its events'. The tags Jaeger's classic JSON
    adds (``otel.status_code``, ``otel.scope.name``...) and an ``event`` name match too."""
    if key == "error":
        wanted_error = parse_bool(wanted)
        return wanted_error is not None and wanted_error == (span.status_code == STATUS_ERROR)
    if key == "span.status":
        return _STATUS_BY_NAME.get(wanted.upper(), 0) == span.status_code
    if key == "span.kind":
        return _KINDS_BY_NAME.get(wanted.upper(), 0) == span.kind
    if key == "scope.name":
        return span.scope == wanted
    if key == "scope.version":
        return span.scope_version == wanted
    if key.startswith("resource."):
        value = span.resource.get(key.removeprefix("resource."))
        return value is not None and text_of(value) == wanted
    values = [span.attributes.get(key), span.resource.get(key)]
    values.extend(e.attributes.get(key) for e in span.events)
    if any(v is not None and text_of(v) == wanted for v in values):
        return True
    if key == "event":
        return any(e.name == wanted for e in span.events)
    derived = span_tags(span).get(key)
    return derived is not None and text_of(derived) == wanted


def span_matches(span: SpanRecord, q: TraceQuery) -> bool:
    """Whether ``span`` satisfies every condition of ``q`` (see the module docstring)."""
    if q.service is not None and span.service != q.service:
        return False
    if q.operation is not None and span.name != q.operation:
        return False
    if q.start_ns is not None and span.start_ns < q.start_ns:
        return False
    if q.end_ns is not None and span.start_ns > q.end_ns:
        return False
    duration = max(0, span.end_ns - span.start_ns)
    if q.min_duration_ns is not None and duration < q.min_duration_ns:
        return False
    if q.max_duration_ns is not None and duration > q.max_duration_ns:
        return False
    return all(attribute_matches(span, k, v) for k, v in q.tags.items())


def find(conn: sqlite3.Connection, q: TraceQuery) -> Found:
    """The traces matching ``q``, at most ``q.limit``, most recently stored first."""
    if q.limit == 0:
        return Found([])
    rollout = q.tags.get(semconv.ROLLOUT_ID)
    candidates = queries.recent_traces(
        conn,
        service=q.service,
        rollout_id=rollout,
        # a span is stored after it started: nothing stored earlier can match
        stored_after_ns=q.start_ns,
        limit=SCAN_TRACES,
    )
    if rollout is not None and not candidates:
        # the rollout id's index covers the rollout/verify scopes only (a gated group is
        # not indexed): look at the service's traces instead
        candidates = queries.recent_traces(
            conn, service=q.service, stored_after_ns=q.start_ns, limit=SCAN_TRACES
        )
    out: list[tuple[str, list[SpanRecord]]] = []
    for trace_id in candidates:
        spans = queries.trace_spans(conn, trace_id)
        if any(span_matches(s, q) for s in spans):
            out.append((trace_id, spans))
            if len(out) >= q.limit:
                return Found(out)
    return Found(out, scan_limited=len(candidates) >= SCAN_TRACES)
