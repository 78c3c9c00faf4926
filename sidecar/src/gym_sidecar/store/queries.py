"""What the inspection commands read from the store (read-only, any process).

A rollout is a ``gym.rollout`` span; its trace holds the rest (the model call, the
resources server's tool and verify routes). Its verify outcome comes from the trace's
``gym.verify`` span: ``ok`` when ``succeeded`` is true, ``failed`` when false or the
span's status is ERROR, ``-`` when there is none (the verify group was off).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gym_telemetry import semconv

STATUS_ERROR: Final = 2
_CHUNK: Final = 500


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

    @property
    def failed(self) -> bool:
        return self.error or self.verify == "failed"


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

    @property
    def duration_ms(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e6


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _verify_outcome(attrs: dict[str, Any], status_code: int) -> str:
    succeeded = attrs.get(semconv.VERIFY_SUCCEEDED)
    if succeeded is False or status_code == STATUS_ERROR:
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
) -> list[RolloutSummary]:
    """Rollouts started in the last ``since_s`` seconds (all when None).

    Newest first, or the ``slowest`` N longest first. ``service`` keeps rollouts whose
    trace has a span of that service (exact name, or a substring when no exact match).
    ``limit`` bounds the rows returned (the ``slowest`` N replace it when given).
    """
    now_ns = time.time_ns() if now_ns is None else now_ns
    where = ["name = ?"]
    args: list[Any] = [semconv.SPAN_ROLLOUT]
    if since_s is not None:
        where.append("start_ns >= ?")
        args.append(now_ns - int(since_s * 1e9))
    order = "end_ns - start_ns DESC" if slowest is not None else "start_ns DESC"
    tail = ""
    if not failed_only and service is None:
        # no filter on what the trace holds: the database can stop early
        tail = " LIMIT ?"
        args.append(slowest if slowest is not None else limit)
    rows = conn.execute(
        "SELECT rollout_id, trace_id, span_id, start_ns, end_ns, status_code FROM spans "
        f"WHERE {' AND '.join(where)} ORDER BY {order}{tail}",
        args,
    ).fetchall()
    trace_ids = sorted({r["trace_id"] for r in rows})
    counts: dict[str, tuple[int, tuple[str, ...]]] = {}
    verifies: dict[str, tuple[str, float]] = {}
    for chunk in _chunks(trace_ids):
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(
            "SELECT trace_id, count(*) AS n, group_concat(DISTINCT service) AS services "
            f"FROM spans WHERE trace_id IN ({marks}) GROUP BY trace_id",
            list(chunk),
        ):
            services = tuple(sorted(str(r["services"] or "").split(",")))
            counts[r["trace_id"]] = (int(r["n"]), services)
        for r in conn.execute(
            "SELECT trace_id, attributes, status_code, start_ns, end_ns FROM spans "
            f"WHERE name = ? AND trace_id IN ({marks}) ORDER BY start_ns",
            [semconv.SPAN_VERIFY, *chunk],
        ):
            outcome = _verify_outcome(json.loads(r["attributes"]), int(r["status_code"]))
            verifies[r["trace_id"]] = (outcome, max(0, r["end_ns"] - r["start_ns"]) / 1e6)
    out: list[RolloutSummary] = []
    for r in rows:
        n, services = counts.get(r["trace_id"], (0, ()))
        outcome, verify_ms = verifies.get(r["trace_id"], ("-", None))
        summary = RolloutSummary(
            rollout_id=r["rollout_id"] or f"(trace {r['trace_id'][:8]})",
            trace_id=r["trace_id"],
            start_ns=int(r["start_ns"]),
            duration_ms=max(0, r["end_ns"] - r["start_ns"]) / 1e6,
            error=int(r["status_code"]) == STATUS_ERROR,
            verify=outcome,
            verify_ms=verify_ms,
            span_count=n,
            services=services,
        )
        if failed_only and not summary.failed:
            continue
        if service is not None and not _service_matches(service, services):
            continue
        out.append(summary)
    if slowest is not None:
        out.sort(key=lambda s: s.duration_ms, reverse=True)
        return out[:slowest]
    return out[:limit]


def _service_matches(wanted: str, services: Sequence[str]) -> bool:
    return wanted in services or any(wanted in s for s in services)


def find_traces(conn: sqlite3.Connection, ident: str) -> list[str]:
    """Trace ids for a rollout id, a trace id, or a trace id prefix (8+ hex digits)."""
    found = [
        r[0]
        for r in conn.execute(
            "SELECT DISTINCT trace_id FROM spans WHERE rollout_id = ? ORDER BY trace_id",
            (ident,),
        )
    ]
    if found:
        return found
    text = ident.lower()
    if len(text) >= 8 and all(c in "0123456789abcdef" for c in text):
        return [
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT trace_id FROM spans WHERE trace_id >= ? AND trace_id < ? "
                "ORDER BY trace_id LIMIT 10",
                (text, text + "g"),
            )
        ]
    return []


def trace_spans(conn: sqlite3.Connection, trace_id: str) -> list[SpanRecord]:
    """Every stored span of ``trace_id``, by start time."""
    return [
        SpanRecord(
            trace_id=r["trace_id"],
            span_id=r["span_id"],
            parent_span_id=r["parent_span_id"],
            name=r["name"],
            kind=int(r["kind"]),
            start_ns=int(r["start_ns"]),
            end_ns=int(r["end_ns"]),
            status_code=int(r["status_code"]),
            status_message=r["status_message"],
            service=r["service"],
            scope=r["scope"],
            rollout_id=r["rollout_id"],
            attributes=json.loads(r["attributes"]),
        )
        for r in conn.execute(
            "SELECT * FROM spans WHERE trace_id = ? ORDER BY start_ns, span_id", (trace_id,)
        )
    ]


def store_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Row counts: spans, traces, rollouts, metric points."""
    return {
        "spans": int(conn.execute("SELECT count(*) FROM spans").fetchone()[0]),
        "rollouts": int(
            conn.execute(
                "SELECT count(*) FROM spans WHERE name = ?", (semconv.SPAN_ROLLOUT,)
            ).fetchone()[0]
        ),
        "metric_points": int(conn.execute("SELECT count(*) FROM metric_points").fetchone()[0]),
    }
