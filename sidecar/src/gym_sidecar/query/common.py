"""What both API lines share: the store connection, trace ids, operations, and how an
answer says that a read bound cut it."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Final

from starlette.responses import Response

from gym_sidecar.query import model
from gym_sidecar.store import queries

OPERATION_TRACES: Final = 1000
"""Operations are read from this many of the service's most recently stored traces."""
LIMIT_HEADER: Final = "X-Gym-Limit-Hit"
"""Set on an answer that a read bound cut short: ``name=value`` of the bound (e.g.
``search_traces=5000``), so a client can tell an answer that is all there is from one
that is all the bound let through."""
_HEX: Final = frozenset("0123456789abcdef")

Connect = Callable[[], sqlite3.Connection]
"""Opens a read-only connection to the store (one per request, closed after)."""


def normalize_trace_id(text: str) -> str | None:
    """A trace id as 32 lower-case hex digits (Jaeger drops leading zeros), or None."""
    text = text.strip().lower()
    if not 1 <= len(text) <= 32 or not set(text) <= _HEX:
        return None
    return text.rjust(32, "0")


def operations(conn: sqlite3.Connection, service: str) -> list[tuple[str, str]]:
    """(span name, span kind) pairs of ``service``, sorted; the kind as Jaeger names it
    (``server``, ``client``...; ``""`` for an unspecified kind)."""
    found: set[tuple[str, str]] = set()
    for trace_id in queries.recent_traces(conn, service=service, limit=OPERATION_TRACES):
        for span in queries.trace_spans(conn, trace_id):
            if span.service == service:
                found.add((span.name, model.KIND_NAMES.get(span.kind, "")))
    return sorted(found)


def mark_limited(response: Response, bound: str, value: int) -> Response:
    """``response`` with :data:`LIMIT_HEADER` saying that bound ``bound`` = ``value``
    cut it."""
    response.headers[LIMIT_HEADER] = f"{bound}={value}"
    return response
