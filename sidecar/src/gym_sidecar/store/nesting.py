"""The outermost rule in the store: which stored ``gym.rollout`` spans are nested.

A rollout is one outermost ``gym.rollout`` span: a ``/run`` that an environment server
relays from inside its own rollout (``legacy_agent``) is part of that rollout, not a
second one. The agent marks such an inner span itself (``nemo.gym.rollout.nested``);
Gym's own telemetry marks nothing. The store holds whole traces, so here the rule is
applied as it is defined, whoever produced the spans: a ``gym.rollout`` span is nested
when one of its ancestors -- following parent span ids through every span of its trace
(SERVER, CLIENT, any producer) -- is a ``gym.rollout`` span.

When: after each write (:func:`mark_nested`, on the writer's thread), for every trace the
write touched that now holds two or more ``gym.rollout`` rows marked neither by the agent
nor by this module, the trace's stored requests are decoded and each such span's parents
walked; a nested one gets :data:`NESTED_KEY` ``= true`` in its row's ``attributes``
JSON (the index only; the stored span bytes never change). Every other trace costs one
indexed query per write: a fleet whose rollouts each have one unmarked span (Gym's own
telemetry, which wraps only an agent's ``/run``; the agent, which marks the inner one)
never decodes anything here. A trace whose chain is not complete yet (a span in between
not stored yet) is looked at again when a later write touches it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

NESTED_KEY: Final = "_gym_sidecar.nested"
"""Key the store sets in a nested rollout's ``gym_spans.attributes`` (not a span
attribute: the store's own finding)."""

_MARKS: Final = (semconv.ROLLOUT_NESTED, NESTED_KEY)

OUTERMOST_ROLLOUT: Final = " AND ".join(
    f"json_extract(attributes, '$.\"{key}\"') IS NOT 1" for key in _MARKS
)
"""SQL predicate on ``gym_spans``: the span is not a nested rollout span (marked by the
agent, or found by :func:`mark_nested`)."""

_CHUNK: Final = 500
_MAX_DEPTH: Final = 10_000
"""Most parents followed up one chain (a cycle of forged ids cannot loop forever)."""


def _chunks(items: Sequence[bytes]) -> Iterable[Sequence[bytes]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _candidates(conn: sqlite3.Connection, trace_ids: Sequence[bytes]) -> list[bytes]:
    """The traces among ``trace_ids`` holding two or more unmarked ``gym.rollout`` rows."""
    out: list[bytes] = []
    for chunk in _chunks(trace_ids):
        marks = ",".join("?" * len(chunk))
        out += [
            bytes(row[0])
            for row in conn.execute(
                f"SELECT trace_id FROM gym_spans WHERE trace_id IN ({marks}) AND name = ? "
                f"AND {OUTERMOST_ROLLOUT} GROUP BY trace_id HAVING count(*) > 1",
                [*chunk, semconv.SPAN_ROLLOUT],
            )
        ]
    return out


def _parents(conn: sqlite3.Connection, trace_id: bytes) -> dict[bytes, bytes]:
    """Span id -> parent span id (``b""``: a root) of every stored span of the trace."""
    parents: dict[bytes, bytes] = {}
    for (payload,) in conn.execute(
        "SELECT b.payload FROM traces t JOIN batches b ON b.id = t.batch_id WHERE t.trace_id = ?",
        (trace_id,),
    ):
        request = ExportTraceServiceRequest.FromString(payload)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.trace_id == trace_id:
                        parents[span.span_id] = span.parent_span_id
    return parents


def nested_spans(parents: dict[bytes, bytes], rollouts: Iterable[bytes]) -> set[bytes]:
    """Those of ``rollouts`` (span ids) with another of them among their ancestors in
    ``parents``. Pure."""
    rollout_ids = set(rollouts)
    nested: set[bytes] = set()
    for span_id in rollout_ids:
        current = parents.get(span_id, b"")
        for _ in range(_MAX_DEPTH):
            if not current or current == span_id:  # a root, or a cycle of forged ids
                break
            if current in rollout_ids:
                nested.add(span_id)
                break
            current = parents.get(current, b"")
    return nested


def mark_nested(conn: sqlite3.Connection, trace_ids: Sequence[bytes]) -> int:
    """Apply the rule (module doc) to the traces ``trace_ids`` a write touched; return
    how many rollout rows it marked nested. Call on the writer's connection, outside a
    transaction (it opens its own when it has something to mark)."""
    marked = 0
    for trace_id in _candidates(conn, trace_ids):
        rows = conn.execute(
            "SELECT id, span_id FROM gym_spans WHERE trace_id = ? AND name = ?",
            (trace_id, semconv.SPAN_ROLLOUT),
        ).fetchall()
        nested = nested_spans(_parents(conn, trace_id), (bytes(r[1]) for r in rows))
        ids = [r[0] for r in rows if bytes(r[1]) in nested]
        if not ids:
            continue
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "UPDATE gym_spans SET attributes = "
                f"json_set(attributes, '$.\"{NESTED_KEY}\"', json('true')) WHERE id = ?",
                [(i,) for i in ids],
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        marked += len(ids)
    return marked
