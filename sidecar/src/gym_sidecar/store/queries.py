"""What the inspection commands read from the store (read-only, any process).

A rollout is an outermost ``gym.rollout`` span, from either producer
(``core.producers``): one not marked nested, by the agent (``nemo.gym.rollout.nested``)
or by the store, which finds a ``gym.rollout`` ancestor in the trace for producers that
mark nothing (``store/nesting.py``). A ``/run`` relayed by an environment server such as
``legacy_agent`` is part of the relay's rollout, not a second one. Its trace holds the
rest (the model call, the resources server's tool and verify routes). It is ``error``
when its span's status is ERROR or a nested rollout span of the same trace and rollout
id (or of no rollout id) is. Its verify outcome comes from the trace's ``gym.verify``
span: ``ok`` when ``succeeded`` is true, ``failed`` when false or the span's status is
ERROR (how Gym's own telemetry records a verifier that raised), ``-`` when there is
none (the verify group was off). Span counts and services come from the per-trace
index; a trace's spans themselves are decoded from the stored requests only by
:func:`trace_spans`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gym_sidecar.store.figures import RlFigures
from gym_sidecar.store.nesting import OUTERMOST_ROLLOUT
from gym_sidecar.store.rows import Truncation, attributes, service_of

STATUS_ERROR: Final = 2
_CHUNK: Final = 500
_NO_LIMIT: Final = Truncation(1 << 30)


@dataclass(frozen=True)
class RolloutSummary:
    """One row of ``gym-sidecar rollouts``."""

    rollout_id: str
    trace_id: str
    start_ns: int
    duration_ms: float
    error: bool
    """The ``gym.rollout`` span's status is ERROR."""
    verify: str
    """``ok``, ``failed`` or ``-``."""
    verify_ms: float | None
    span_count: int
    services: tuple[str, ...]
    service: str = ""
    """The service of the rollout span: the agent server that ran it (its environment,
    :mod:`gym_sidecar.store.rl`)."""
    reward: float | None = None
    """``nemo.gym.reward`` of the rollout span (the ``/run`` answer's reward)."""
    turns: int | None = None
    """``nemo.gym.rollout.turns``: the model calls it made."""
    input_tokens: int | None = None
    output_tokens: int | None = None
    """``nemo.gym.rollout.input_tokens`` / ``output_tokens``: the usage Gym summed."""

    @property
    def failed(self) -> bool:
        return self.error or self.verify == "failed"

    @property
    def tokens(self) -> int | None:
        """Input plus output tokens (None when the rollout span has neither)."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)


@dataclass(frozen=True)
class SpanEvent:
    """One event of a stored span."""

    time_ns: int
    name: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRecord:
    """One stored span, as the trace view reads it."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    status_message: str
    service: str
    scope: str
    rollout_id: str | None
    attributes: dict[str, Any] = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    """(trace id, span id) hex of each link."""
    resource: dict[str, Any] = field(default_factory=dict)
    scope_version: str = ""
    stored_ns: int = 0
    """When the request that brought the span was stored."""

    @property
    def duration_ms(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e6


def _chunks(items: Sequence[bytes]) -> Iterable[Sequence[bytes]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def verify_outcome(attrs: dict[str, Any], status_code: int) -> str:
    """``failed`` when ``succeeded`` is false or the status is ERROR, else ``ok``."""
    if attrs.get(semconv.VERIFY_SUCCEEDED) is False or status_code == STATUS_ERROR:
        return "failed"
    return "ok"


def rollouts(
    conn: sqlite3.Connection,
    *,
    since_s: float | None = None,
    service: str | None = None,
    failed_only: bool = False,
    slowest: int | None = None,
    limit: int = 20,
    now_ns: int | None = None,
    min_duration_s: float | None = None,
    max_duration_s: float | None = None,
    rollout_id: str | None = None,
    offset: int = 0,
    env: str | None = None,
) -> list[RolloutSummary]:
    """Rollouts started in the last ``since_s`` seconds (all when None).

    Newest first, or the ``slowest`` N longest first. ``service`` keeps rollouts whose
    trace has a span of that service (exact name or a substring). ``min_duration_s`` /
    ``max_duration_s`` keep rollouts at least / less than that long, ``rollout_id`` the
    rollout of that id, ``env`` the rollouts of that environment (the exact service of
    their rollout span: the agent server). ``limit`` bounds the rows returned
    (``slowest`` replaces it when given), after skipping the first ``offset`` matching
    rows. Each row carries its RL figures (:class:`RlFigures`; turns and tokens from a
    nested rollout span of its trace when its own span has none).
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    where = ["name = ?", OUTERMOST_ROLLOUT]
    args: list[Any] = [semconv.SPAN_ROLLOUT]
    if since_s is not None:
        where.append("start_ns >= ?")
        args.append(now_ns - int(since_s * 1e9))
    if min_duration_s is not None:
        where.append("end_ns - start_ns >= ?")
        args.append(int(min_duration_s * 1e9))
    if max_duration_s is not None:
        where.append("end_ns - start_ns < ?")
        args.append(int(max_duration_s * 1e9))
    if rollout_id is not None:
        where.append("rollout_id = ?")
        args.append(rollout_id)
    if env is not None:
        where.append("service = ?")
        args.append(env)
    order = "end_ns - start_ns DESC" if slowest is not None else "start_ns DESC"
    tail = ""
    if not failed_only and service is None:
        # no filter on what the trace holds: the database can stop early
        tail = " LIMIT ?"
        args.append(slowest if slowest is not None else limit + offset)
    rows = conn.execute(
        "SELECT rollout_id, trace_id, start_ns, end_ns, status_code, service, attributes "
        "FROM gym_spans "
        f"WHERE {' AND '.join(where)} ORDER BY {order}{tail}",
        args,
    ).fetchall()
    trace_ids = sorted({bytes(r["trace_id"]) for r in rows})
    counts: dict[bytes, int] = {}
    services: dict[bytes, set[str]] = {}
    verifies: dict[bytes, tuple[str, float]] = {}
    nested_errors: set[tuple[bytes, str | None]] = set()
    nested_figures: dict[tuple[bytes, str | None], RlFigures] = {}
    for chunk in _chunks(trace_ids):
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(
            f"SELECT trace_id, spans, services FROM traces WHERE trace_id IN ({marks})",
            list(chunk),
        ):
            tid = bytes(r["trace_id"])
            counts[tid] = counts.get(tid, 0) + int(r["spans"])
            services.setdefault(tid, set()).update(str(r["services"]).split(","))
        for r in conn.execute(
            "SELECT trace_id, attributes, status_code, start_ns, end_ns FROM gym_spans "
            f"WHERE name = ? AND trace_id IN ({marks}) ORDER BY start_ns",
            [semconv.SPAN_VERIFY, *chunk],
        ):
            outcome = verify_outcome(json.loads(r["attributes"]), int(r["status_code"]))
            duration_ms = max(0, r["end_ns"] - r["start_ns"]) / 1e6
            verifies[bytes(r["trace_id"])] = (outcome, duration_ms)
        for r in conn.execute(
            "SELECT trace_id, rollout_id, status_code, attributes FROM gym_spans "
            f"WHERE name = ? AND NOT ({OUTERMOST_ROLLOUT}) AND trace_id IN ({marks})",
            [semconv.SPAN_ROLLOUT, *chunk],
        ):
            key = (bytes(r["trace_id"]), r["rollout_id"])
            if int(r["status_code"]) == STATUS_ERROR:
                nested_errors.add(key)
            figures = RlFigures.of(json.loads(r["attributes"]))
            if figures.turns is not None or figures.input_tokens is not None:
                nested_figures[key] = figures
    out: list[RolloutSummary] = []
    for r in rows:
        tid = bytes(r["trace_id"])
        outcome, verify_ms = verifies.get(tid, ("-", None))
        figures = RlFigures.of(json.loads(r["attributes"])).or_counts_of(
            nested_figures.get((tid, r["rollout_id"])) or nested_figures.get((tid, None))
        )
        summary = RolloutSummary(
            rollout_id=r["rollout_id"] or f"(trace {tid.hex()[:8]})",
            trace_id=tid.hex(),
            start_ns=int(r["start_ns"]),
            duration_ms=max(0, r["end_ns"] - r["start_ns"]) / 1e6,
            # a nested span of its rollout id, or of none (Gym's own telemetry writes none
            # without observability_enabled; the store found it nested in this trace)
            error=int(r["status_code"]) == STATUS_ERROR
            or (tid, r["rollout_id"]) in nested_errors
            or (tid, None) in nested_errors,
            verify=outcome,
            verify_ms=verify_ms,
            span_count=counts.get(tid, 0),
            services=tuple(sorted(services.get(tid, ()))),
            service=str(r["service"]),
            reward=figures.reward,
            turns=figures.turns,
            input_tokens=figures.input_tokens,
            output_tokens=figures.output_tokens,
        )
        if failed_only and not summary.failed:
            continue
        if service is not None and not any(service in s for s in summary.services):
            continue
        out.append(summary)
    if slowest is not None:
        out.sort(key=lambda s: s.duration_ms, reverse=True)
        return out[:slowest]
    return out[offset : offset + limit]


def find_traces(conn: sqlite3.Connection, ident: str) -> list[str]:
    """Trace ids (hex) for a rollout id, a trace id, or a trace id prefix (8+ hex digits;
    at most 10 traces)."""
    found = [
        bytes(r[0]).hex()
        for r in conn.execute(
            "SELECT DISTINCT trace_id FROM gym_spans WHERE rollout_id = ? ORDER BY trace_id",
            (ident,),
        )
    ]
    if found:
        return found
    text = ident.lower()
    if not (8 <= len(text) <= 32 and all(c in "0123456789abcdef" for c in text)):
        return []
    low = bytes.fromhex(text.ljust(32, "0"))
    high = bytes.fromhex(text.ljust(32, "f"))
    return [
        bytes(r[0]).hex()
        for r in conn.execute(
            "SELECT DISTINCT trace_id FROM traces WHERE trace_id BETWEEN ? AND ? "
            "ORDER BY trace_id LIMIT 10",
            (low, high),
        )
    ]


_SERVICE_LIKE: Final = "(',' || t.services || ',') LIKE ? ESCAPE '\\'"
"""SQL predicate on ``traces t``: one of its services is the pattern's name."""


def _service_pattern(service: str) -> str:
    escaped = service.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return "%," + escaped + ",%"


def trace_payloads(conn: sqlite3.Connection, trace_id: str) -> list[tuple[bytes, int]]:
    """(stored request, when it was stored) of each request holding a span of
    ``trace_id`` (hex), in the order they were stored. The requests hold other traces'
    spans too."""
    return [
        (bytes(payload), int(stored_ns))
        for payload, stored_ns in conn.execute(
            "SELECT b.payload, b.stored_ns FROM traces t JOIN batches b ON b.id = t.batch_id "
            "WHERE t.trace_id = ? ORDER BY b.id",
            (bytes.fromhex(trace_id),),
        )
    ]


def window_payloads(
    conn: sqlite3.Connection, services: Sequence[str], stored_after_ns: int, stored_before_ns: int
) -> Iterator[bytes]:
    """Stored requests with a span of one of ``services`` (exact names), stored in
    [``stored_after_ns``, ``stored_before_ns``], most recently stored first; lazily, so a
    caller with a bound stops reading where it stops iterating."""
    likes = []
    args: list[Any] = [stored_after_ns, stored_before_ns]
    for service in services:
        likes.append(_SERVICE_LIKE)
        args.append(_service_pattern(service))
    if not likes:
        return
    for (payload,) in conn.execute(
        "SELECT b.payload FROM batches b WHERE b.stored_ns BETWEEN ? AND ? AND EXISTS "
        f"(SELECT 1 FROM traces t WHERE t.batch_id = b.id AND ({' OR '.join(likes)})) "
        "ORDER BY b.id DESC",
        args,
    ):
        yield bytes(payload)


def trace_spans(conn: sqlite3.Connection, trace_id: str) -> list[SpanRecord]:
    """Every stored span of ``trace_id`` (hex), by start time (decodes its batches)."""
    tid = bytes.fromhex(trace_id)
    out: list[SpanRecord] = []
    seen: set[bytes] = set()
    for payload, stored_ns in trace_payloads(conn, trace_id):
        request = ExportTraceServiceRequest.FromString(payload)
        for rs in request.resource_spans:
            service = service_of(rs.resource)
            resource = attributes(rs.resource.attributes, _NO_LIMIT)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.trace_id != tid or span.span_id in seen:
                        continue
                    seen.add(span.span_id)  # a span exported twice is shown once
                    attrs = attributes(span.attributes, _NO_LIMIT)
                    rollout = attrs.get(semconv.ROLLOUT_ID)
                    out.append(
                        SpanRecord(
                            trace_id=trace_id,
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex() or None,
                            name=span.name,
                            kind=int(span.kind),
                            start_ns=int(span.start_time_unix_nano),
                            end_ns=int(span.end_time_unix_nano),
                            status_code=int(span.status.code),
                            status_message=span.status.message,
                            service=service,
                            scope=ss.scope.name,
                            rollout_id=None if rollout is None else str(rollout),
                            attributes=attrs,
                            events=tuple(
                                SpanEvent(
                                    int(e.time_unix_nano),
                                    e.name,
                                    attributes(e.attributes, _NO_LIMIT),
                                )
                                for e in span.events
                            ),
                            links=tuple(
                                (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                            ),
                            resource=resource,
                            scope_version=ss.scope.version,
                            stored_ns=int(stored_ns),
                        )
                    )
    out.sort(key=lambda s: (s.start_ns, s.span_id))
    return out


def store_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Spans, stored requests, rollouts and metric points in the store."""
    return {
        "spans": int(conn.execute("SELECT coalesce(sum(spans), 0) FROM batches").fetchone()[0]),
        "batches": int(conn.execute("SELECT count(*) FROM batches").fetchone()[0]),
        "rollouts": int(
            conn.execute(
                f"SELECT count(*) FROM gym_spans WHERE name = ? AND {OUTERMOST_ROLLOUT}",
                (semconv.SPAN_ROLLOUT,),
            ).fetchone()[0]
        ),
        "metric_points": int(conn.execute("SELECT count(*) FROM metric_points").fetchone()[0]),
    }


def service_names(conn: sqlite3.Connection) -> list[str]:
    """Every service with a stored span, sorted."""
    names: set[str] = set()
    for (services,) in conn.execute("SELECT DISTINCT services FROM traces"):
        names.update(s for s in str(services).split(",") if s)
    return sorted(names)


def recent_traces(
    conn: sqlite3.Connection,
    *,
    service: str | None = None,
    rollout_id: str | None = None,
    stored_after_ns: int | None = None,
    stored_before_ns: int | None = None,
    limit: int = 1000,
) -> list[str]:
    """Trace ids (hex) with a span of ``service`` (exact name) / of rollout ``rollout_id``
    whose requests were stored in the window, most recently stored first; at most
    ``limit``. A candidate list for searches that then read each trace."""
    where: list[str] = []
    args: list[Any] = []
    if service is not None:
        where.append(_SERVICE_LIKE)
        args.append(_service_pattern(service))
    if rollout_id is not None:
        where.append("t.trace_id IN (SELECT trace_id FROM gym_spans WHERE rollout_id = ?)")
        args.append(rollout_id)
    if stored_after_ns is not None:
        where.append("b.stored_ns >= ?")
        args.append(stored_after_ns)
    if stored_before_ns is not None:
        where.append("b.stored_ns <= ?")
        args.append(stored_before_ns)
    sql = (
        "SELECT t.trace_id, max(t.batch_id) AS last FROM traces t "
        "JOIN batches b ON b.id = t.batch_id"
    )
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " GROUP BY t.trace_id ORDER BY last DESC LIMIT ?"
    args.append(limit)
    return [bytes(r[0]).hex() for r in conn.execute(sql, args)]
