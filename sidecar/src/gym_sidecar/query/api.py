"""The Jaeger-compatible query routes (read-only; JSON as Jaeger's query service answers).

- ``GET /api/services``: every service with a stored span;
- ``GET /api/services/{service}/operations``: span names of that service (Grafana's
  call); ``GET /api/operations?service=S[&spanKind=K]``: the same as
  ``[{"name", "spanKind"}]`` (the newer UI's call);
- ``GET /api/traces?service=...``: the search of :mod:`gym_sidecar.query.search`;
- ``GET /api/traces/{traceID}``: one trace (404 with Jaeger's error body when unknown).

Operations are read from the service's :data:`OPERATION_TRACES` most recently stored
traces (the store indexes services per trace, not span names). Bad parameters answer
400 with ``errors: [{"code": 400, "msg": ...}]``. Handlers are synchronous (Starlette
runs them on its thread pool) and open their own read-only connection per request.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, Router

from gym_sidecar.query import model, search
from gym_sidecar.store import queries
from gym_sidecar.store.queries import SpanRecord

OPERATION_TRACES: Final = 1000
_HEX: Final = frozenset("0123456789abcdef")

Connect = Callable[[], sqlite3.Connection]
"""Opens a read-only connection to the store (one per request, closed after)."""


def _json(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def _error(status: int, message: str) -> JSONResponse:
    return _json(model.envelope(None, total=0, errors=[{"code": status, "msg": message}]), status)


def normalize_trace_id(text: str) -> str | None:
    """A trace id as 32 lower-case hex digits (Jaeger drops leading zeros), or None."""
    text = text.strip().lower()
    if not 1 <= len(text) <= 32 or not set(text) <= _HEX:
        return None
    return text.rjust(32, "0")


def operations(conn: sqlite3.Connection, service: str) -> list[tuple[str, str]]:
    """(span name, span kind) pairs of ``service``, sorted."""
    found: set[tuple[str, str]] = set()
    for trace_id in queries.recent_traces(conn, service=service, limit=OPERATION_TRACES):
        for span in queries.trace_spans(conn, trace_id):
            if span.service == service:
                found.add((span.name, model.KIND_NAMES.get(span.kind, "")))
    return sorted(found)


def build_router(connect: Connect) -> Router:
    """The API's routes over the store that ``connect`` opens."""

    def services(request: Request) -> JSONResponse:
        with closing(connect()) as conn:
            return _json(model.envelope(queries.service_names(conn)))

    def service_operations(request: Request) -> JSONResponse:
        service = request.path_params["service"]
        with closing(connect()) as conn:
            names = sorted({name for name, _ in operations(conn, service)})
        return _json(model.envelope(names))

    def operations_list(request: Request) -> JSONResponse:
        service = request.query_params.get("service", "")
        if not service:
            return _error(400, "parameter 'service' is required")
        kind = request.query_params.get("spanKind", "")
        with closing(connect()) as conn:
            pairs = operations(conn, service)
        data = [{"name": n, "spanKind": k} for n, k in pairs if not kind or k == kind]
        return _json(model.envelope(data))

    def traces(request: Request) -> JSONResponse:
        try:
            q = search.parse_query(request.query_params, request.query_params.getlist("tag"))
        except search.SearchError as exc:
            return _error(400, str(exc))
        with closing(connect()) as conn:
            conn.execute("BEGIN")  # one snapshot for the whole search
            found = search.find(conn, q)
            conn.execute("COMMIT")
        return _json(model.envelope([model.trace_json(t, spans) for t, spans in found]))

    def trace(request: Request) -> JSONResponse:
        trace_id = normalize_trace_id(request.path_params["trace_id"])
        if trace_id is None:
            return _error(400, "trace id must be 1 to 32 hex digits")
        with closing(connect()) as conn:
            spans: list[SpanRecord] = queries.trace_spans(conn, trace_id)
        if not spans:
            return _error(404, "trace not found")
        return _json(model.envelope([model.trace_json(trace_id, spans)]))

    return Router(
        routes=[
            Route("/api/services", services, methods=["GET"]),
            Route("/api/services/{service:path}/operations", service_operations, methods=["GET"]),
            Route("/api/operations", operations_list, methods=["GET"]),
            Route("/api/traces", traces, methods=["GET"]),
            Route("/api/traces/{trace_id}", trace, methods=["GET"]),
        ]
    )
