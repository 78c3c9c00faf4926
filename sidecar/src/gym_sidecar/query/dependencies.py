"""Who calls whom: the service graph of stored traces, for the web view's service map
and the Jaeger API's ``GET /api/dependencies``.

A call is a span whose parent span belongs to another service (the caller); its error
share is the share of those spans with status ERROR. Spans whose parent is in the same
service, or not stored, are no call. (Jaeger's own in-memory store also counts a parent
and child of one service, as a self-link; the map and this API do not.)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from gym_sidecar.store import queries

DEPENDENCY_TRACES: Final = 500
"""Most traces the graph is read from (the most recently stored first)."""


@dataclass
class ServiceGraph:
    """Spans and errors per service, calls and errors per (caller, callee)."""

    nodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    calls: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    traces: int = 0
    """How many traces were read."""


def service_graph(conn: sqlite3.Connection, trace_ids: Sequence[str]) -> ServiceGraph:
    """The graph of the traces ``trace_ids`` (decodes each)."""
    graph = ServiceGraph(traces=len(trace_ids))
    for trace_id in trace_ids:
        spans = queries.trace_spans(conn, trace_id)
        by_id = {s.span_id: s for s in spans}
        for s in spans:
            n, errors = graph.nodes.get(s.service, (0, 0))
            is_error = s.status_code == queries.STATUS_ERROR
            graph.nodes[s.service] = (n + 1, errors + is_error)
            parent = by_id.get(s.parent_span_id or "")
            if parent is not None and parent.service != s.service:
                key = (parent.service, s.service)
                count, call_errors = graph.calls.get(key, (0, 0))
                graph.calls[key] = (count + 1, call_errors + is_error)
    return graph


def recent_graph(
    conn: sqlite3.Connection,
    *,
    stored_after_ns: int | None = None,
    stored_before_ns: int | None = None,
    limit: int | None = None,
) -> ServiceGraph:
    """The graph of the at most ``limit`` (:data:`DEPENDENCY_TRACES`) most recently
    stored traces with requests stored in the window."""
    trace_ids = queries.recent_traces(
        conn,
        stored_after_ns=stored_after_ns,
        stored_before_ns=stored_before_ns,
        limit=DEPENDENCY_TRACES if limit is None else limit,
    )
    return service_graph(conn, trace_ids)
