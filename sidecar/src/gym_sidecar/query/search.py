"""The ``GET /api/traces`` search: its parameters and which stored traces match.

Parameters (Jaeger's query service names them so): ``service`` (required, exact name),
``operation``, ``tags`` (a JSON object of key -> value; the older ``tag=key:value``
form, repeated, is read too), ``start`` / ``end`` (microseconds since the epoch),
``minDuration`` / ``maxDuration`` (Go durations: ``1.5s``, ``200ms``, ``10us``),
``limit`` (traces; default 20, at most :data:`MAX_LIMIT`). ``lookback`` is the UI's
label for start/end and is ignored.

A trace matches when one of its spans satisfies every condition at once: that span's
service, its name, each tag (compared as text: ``true``, ``200``, ``0.5``) found among
its tags, its process' tags or its events' fields, its start within [start, end], its
duration within [minDuration, maxDuration]. ``error=true`` matches spans whose status
is ERROR and ``error=false`` the others: what Jaeger answers once its 2.13 bug is fixed
(docs/local-store.md). Results are whole traces, most recently stored first.
Candidates come from the store's per-trace index (service, rollout id, stored time);
at most :data:`SCAN_TRACES` of them are read per search.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_sidecar.query.model import span_tags
from gym_sidecar.store import queries
from gym_sidecar.store.queries import STATUS_ERROR, SpanRecord

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 1500
SCAN_TRACES: Final = 5000
"""Most candidate traces one search decodes (newest first)."""

_GO_DURATION: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
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


class SearchError(ValueError):
    """A search parameter is malformed; the message says which and why."""


def parse_go_duration(text: str) -> int:
    """A Go duration (``1h2m``, ``1.5s``, ``300ms``, ``10us``) in nanoseconds."""
    text = text.strip()
    pos = 0
    total = 0.0
    for match in _GO_DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_NS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise SearchError(f"not a duration: {text!r} (e.g. 1.5s, 200ms, 10us)")
    return int(total)


@dataclass(frozen=True)
class TraceQuery:
    """A parsed search."""

    service: str
    operation: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    min_duration_ns: int | None = None
    max_duration_ns: int | None = None
    limit: int = DEFAULT_LIMIT


def _int(params: Mapping[str, str], key: str) -> int | None:
    value = params.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise SearchError(f"{key} must be an integer, got {value!r}") from None


def parse_query(params: Mapping[str, str], tag_params: Sequence[str] = ()) -> TraceQuery:
    """A :class:`TraceQuery` from the query string; raises :class:`SearchError`."""
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
        tags.update({str(k): _text(v) for k, v in decoded.items()})
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


def _text(value: Any) -> str:
    """A tag value as the search compares it (Jaeger's string form)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def span_matches(span: SpanRecord, q: TraceQuery) -> bool:
    """Whether ``span`` satisfies every condition of ``q`` (see the module docstring)."""
    if span.service != q.service:
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
    if not q.tags:
        return True
    tags = span_tags(span)
    for key, wanted in q.tags.items():
        if key == "error":
            # the tag exists only on ERROR spans; false asks for the others
            if (wanted.lower() == "true") != (span.status_code == STATUS_ERROR):
                return False
            continue
        values = [tags.get(key), span.resource.get(key)]
        values.extend(e.attributes.get(key) for e in span.events)
        values.extend(e.name for e in span.events if key == "event")
        if not any(v is not None and _text(v) == wanted for v in values):
            return False
    return True


def find(conn: sqlite3.Connection, q: TraceQuery) -> list[tuple[str, list[SpanRecord]]]:
    """The matching traces (id, spans), at most ``q.limit``, most recently stored first."""
    if q.limit == 0:
        return []
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
                break
    return out
