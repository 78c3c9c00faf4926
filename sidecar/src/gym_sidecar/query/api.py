"""The Jaeger-compatible query routes (read-only), both API lines.

Classic (``/api/...``, JSON as Jaeger's query service answers it, :mod:`.model`):

- ``GET /api/services``: every service with a stored span;
- ``GET /api/services/{service}/operations``: span names of that service (Grafana's
  call); ``GET /api/operations?service=S[&spanKind=K]``: the same as
  ``[{"name", "spanKind"}]``;
- ``GET /api/traces?service=...``: the search of :mod:`.search`;
  ``GET /api/traces?traceID=a&traceID=b`` (no service needed): those traces, and an
  ``errors`` entry ``{"msg": "trace not found", "traceID": ...}`` for each id not stored
  (the UI's trace-id search and Compare);
- ``GET /api/traces/{traceID}``: one trace (404 with Jaeger's error body when unknown);
- ``GET /api/dependencies?endTs=&lookback=[&service=]``: ``[{"parent", "child",
  "callCount"}]``, the service map's calls (:mod:`.dependencies`) in the traces stored
  in the ``lookback`` ms (default 24 h) before ``endTs`` (ms, default now);
- ``GET /api/metrics/{latencies,calls,errors,minstep}``: :mod:`.spm`.

API v3 (``/api/v3/...``): :mod:`.v3`.

Bad parameters answer 400 with ``errors: [{"code": 400, "msg": ...}]`` (v3: its own
shape). Handlers are synchronous (Starlette runs them on its thread pool) and open their
own read-only connection per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, Router

from gym_sidecar.query import dependencies as deps
from gym_sidecar.query import model, search, spm, v3
from gym_sidecar.query.common import (
    Connect,
    mark_limited,
    normalize_trace_id,
    operations,
)
from gym_sidecar.store import queries
from gym_sidecar.store.queries import SpanRecord

DEFAULT_DEPENDENCY_LOOKBACK_MS: Final = 24 * 3600 * 1000
MAX_TRACE_IDS: Final = search.MAX_LIMIT
"""Most ``traceID`` parameters one search takes."""

__all__ = ["Connect", "build_router", "normalize_trace_id", "operations"]


def _json(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status)


def _error(status: int, message: str) -> JSONResponse:
    return _json(model.envelope(None, total=0, errors=[{"code": status, "msg": message}]), status)


def _ms_param(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name, "")
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"unable to parse param '{name}': not an integer: {text!r}") from None


def build_router(
    connect: Connect, prefix: str = "/api", clock_ns: Callable[[], int] = time.time_ns
) -> Router:
    """The API's routes (both lines) over the store that ``connect`` opens, under
    ``prefix``; ``clock_ns`` is "now" for parameters that default to it."""

    def services(request: Request) -> JSONResponse:
        with closing(connect()) as conn:
            return _json(model.envelope(queries.service_names(conn)))

    def service_ops(request: Request) -> JSONResponse:
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

    def traces_by_id(texts: list[str]) -> JSONResponse:
        if len(texts) > MAX_TRACE_IDS:
            return _error(400, f"at most {MAX_TRACE_IDS} traceID parameters")
        ids = [normalize_trace_id(t) for t in texts]
        bad = [t for t, i in zip(texts, ids, strict=True) if i is None]
        if bad:
            return _error(400, f"cannot parse traceID param: {bad[0]!r} is not 1 to 32 hex digits")
        data, missing = [], []
        with closing(connect()) as conn:
            conn.execute("BEGIN")
            for trace_id in dict.fromkeys(i for i in ids if i is not None):
                spans = queries.trace_spans(conn, trace_id)
                if spans:
                    data.append(model.trace_json(trace_id, spans))
                else:
                    missing.append({"msg": "trace not found", "traceID": trace_id})
        return _json(model.envelope(data, errors=missing or None))

    def traces(request: Request) -> JSONResponse:
        trace_ids = request.query_params.getlist("traceID")
        if trace_ids:
            return traces_by_id(trace_ids)
        try:
            q = search.parse_query(request.query_params, request.query_params.getlist("tag"))
        except search.SearchError as exc:
            return _error(400, str(exc))
        with closing(connect()) as conn:
            conn.execute("BEGIN")  # one snapshot for the whole search
            found = search.find(conn, q)
        answer = _json(model.envelope([model.trace_json(t, spans) for t, spans in found.traces]))
        if found.scan_limited:
            mark_limited(answer, "search_traces", search.SCAN_TRACES)
        return answer

    def trace(request: Request) -> JSONResponse:
        trace_id = normalize_trace_id(request.path_params["trace_id"])
        if trace_id is None:
            return _error(400, "trace id must be 1 to 32 hex digits")
        with closing(connect()) as conn:
            spans: list[SpanRecord] = queries.trace_spans(conn, trace_id)
        if not spans:
            return _error(404, "trace not found")
        return _json(model.envelope([model.trace_json(trace_id, spans)]))

    def dependencies(request: Request) -> JSONResponse:
        try:
            end_ms = _ms_param(request, "endTs", clock_ns() // 1_000_000)
            lookback_ms = _ms_param(request, "lookback", DEFAULT_DEPENDENCY_LOOKBACK_MS)
        except ValueError as exc:
            return _error(400, str(exc))
        if lookback_ms <= 0:
            return _error(400, "unable to parse param 'lookback': must be positive")
        service = request.query_params.get("service", "")
        with closing(connect()) as conn:
            conn.execute("BEGIN")
            graph = deps.recent_graph(
                conn,
                stored_after_ns=(end_ms - lookback_ms) * 1_000_000,
                stored_before_ns=end_ms * 1_000_000,
            )
        data = [
            {"parent": parent, "child": child, "callCount": count}
            for (parent, child), (count, _) in sorted(graph.calls.items())
            if not service or service in (parent, child)
        ]
        answer = _json(model.envelope(data, total=0))
        if graph.traces >= deps.DEPENDENCY_TRACES:
            mark_limited(answer, "dependency_traces", deps.DEPENDENCY_TRACES)
        return answer

    def metrics(request: Request) -> JSONResponse:
        metric = request.path_params["metric"]
        if metric == "minstep":
            return _json(model.envelope(spm.MIN_STEP_MS, total=0))
        if metric not in ("latencies", "calls", "errors"):
            return _error(404, f"no metric {metric!r} (latencies, calls, errors, minstep)")
        params = request.query_params
        try:
            quantile = (
                spm.parse_quantile(params.get("quantile", "")) if metric == "latencies" else None
            )
            q = spm.parse_query(params, params.getlist, clock_ns())
        except spm.MetricsError as exc:
            return _error(400, str(exc))
        with closing(connect()) as conn:
            conn.execute("BEGIN")
            spans = spm.read_spans(conn, q)
        answer = _json(spm.family(metric, q, spans, quantile))
        if spans.limited:
            mark_limited(answer, "metrics_spans", spm.MAX_SPANS)
        return answer

    return Router(
        routes=[
            Route(f"{prefix}/services", services, methods=["GET"]),
            Route(
                f"{prefix}/services/{{service:path}}/operations",
                service_ops,
                methods=["GET"],
            ),
            Route(f"{prefix}/operations", operations_list, methods=["GET"]),
            Route(f"{prefix}/traces", traces, methods=["GET"]),
            Route(f"{prefix}/traces/{{trace_id}}", trace, methods=["GET"]),
            Route(f"{prefix}/dependencies", dependencies, methods=["GET"]),
            Route(f"{prefix}/metrics/{{metric}}", metrics, methods=["GET"]),
            *v3.routes(connect, f"{prefix}/v3"),
        ]
    )
