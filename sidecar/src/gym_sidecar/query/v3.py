"""Jaeger v2's HTTP API v3 query endpoints over the store (what the current Jaeger UI
calls to list services and search):

- ``GET /api/v3/services``: ``{"services": [...]}``;
- ``GET /api/v3/operations?service=S[&spanKind=K]``: ``{"operations": [{"name",
  "spanKind"}]}`` (an unspecified kind is given as ``internal``, as Jaeger does);
- ``GET /api/v3/traces?query...``: the matching traces as one OTLP ``TracesData``
  (``{"result": {"resourceSpans": [...]}}``, :mod:`.otlp_json`);
- ``GET /api/v3/traces/{trace_id}``: one trace, the same way;
- ``GET /api/v3/trace-summaries?query...``: ``{"summaries": [...]}``, one
  :func:`summary` per matching trace.

Parameters: :mod:`.v3_params`; matching: :mod:`.search`. Errors are Jaeger's
grpc-gateway shape, ``{"error": {"httpCode": N, "message": "..."}}``: 400 for a
malformed parameter, 404 ``No traces found`` when a trace or a ``/traces`` search finds
nothing (a summaries search answers an empty list). Lists are always written, also when
empty (Jaeger leaves an empty list out, as proto3 JSON allows; the UI's schema wants
``services`` and ``operations``); other fields at their default value are left out.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_sidecar.query import otlp_json, search, v3_params
from gym_sidecar.query.common import Connect, mark_limited, operations
from gym_sidecar.query.model import KIND_NAMES
from gym_sidecar.store import queries
from gym_sidecar.store.queries import STATUS_ERROR, SpanRecord

NO_TRACES = "No traces found"


def error(status: int, message: str) -> JSONResponse:
    """Jaeger's API v3 error answer."""
    return JSONResponse({"error": {"httpCode": status, "message": message}}, status_code=status)


def _nonzero(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v}


def summary(trace_id: str, spans: list[SpanRecord]) -> dict[str, Any]:
    """A trace summary as Jaeger v2 computes it: the root (the earliest span without a
    parent), first start and last end (ns, as decimal strings), spans, ERROR spans and
    orphans (spans whose parent is not in the trace), and the same counts per service
    (sorted by name)."""
    ids = {s.span_id for s in spans}
    per_service: dict[str, list[int]] = {}
    root: SpanRecord | None = None
    errors = orphans = 0
    for s in spans:
        counts = per_service.setdefault(s.service, [0, 0])
        counts[0] += 1
        if s.status_code == STATUS_ERROR:
            counts[1] += 1
            errors += 1
        if not s.parent_span_id:
            if root is None or s.start_ns < root.start_ns:
                root = s
        elif s.parent_span_id not in ids:
            orphans += 1
    return {
        "traceId": trace_id,
        **_nonzero(
            rootServiceName=root.service if root else "",
            rootOperationName=root.name if root else "",
            minStartTimeUnixNano=str(min(s.start_ns for s in spans)) if spans else "",
            maxEndTimeUnixNano=str(max(s.end_ns for s in spans)) if spans else "",
            spanCount=len(spans),
            errorSpanCount=errors,
            orphanSpanCount=orphans,
        ),
        "services": [
            {"name": name, **_nonzero(spanCount=n, errorSpanCount=e)}
            for name, (n, e) in sorted(per_service.items())
        ],
    }


def _traces_answer(conn: sqlite3.Connection, trace_ids: list[str], raw: bool) -> JSONResponse:
    data = TracesData()
    for trace_id in trace_ids:
        payloads = [p for p, _ in queries.trace_payloads(conn, trace_id)]
        cut = otlp_json.cut_trace(payloads, bytes.fromhex(trace_id), raw=raw)
        data.resource_spans.extend(cut.resource_spans)
    if not data.resource_spans:
        return error(404, NO_TRACES)
    return JSONResponse({"result": otlp_json.to_json(data)})


def routes(connect: Connect, prefix: str = "/api/v3") -> list[Route]:
    """The v3 routes over the store that ``connect`` opens, under ``prefix``."""

    def services(request: Request) -> JSONResponse:
        with closing(connect()) as conn:
            return JSONResponse({"services": queries.service_names(conn)})

    def span_names(request: Request) -> JSONResponse:
        service = request.query_params.get("service", "")
        kind, _ = v3_params.get(request.query_params, "spanKind", "span_kind")
        pairs: list[tuple[str, str]] = []
        if service:
            with closing(connect()) as conn:
                pairs = operations(conn, service)
        return JSONResponse(
            {
                "operations": [
                    {"name": name, "spanKind": k or KIND_NAMES[1]}
                    for name, k in pairs
                    if not kind or k == kind
                ]
            }
        )

    def find_traces(request: Request) -> JSONResponse:
        try:
            q = v3_params.parse_find(request.query_params)
        except v3_params.ParamError as exc:
            return error(400, str(exc))
        with closing(connect()) as conn:
            conn.execute("BEGIN")  # one snapshot for the whole search
            result = search.find(conn, q.query)
            answer = _traces_answer(conn, [t for t, _ in result.traces], q.raw)
        if result.scan_limited:
            mark_limited(answer, "search_traces", search.SCAN_TRACES)
        return answer

    def trace_summaries(request: Request) -> JSONResponse:
        try:
            q = v3_params.parse_find(request.query_params)
        except v3_params.ParamError as exc:
            return error(400, str(exc))
        with closing(connect()) as conn:
            conn.execute("BEGIN")
            result = search.find(conn, q.query)
        answer = JSONResponse({"summaries": [summary(t, spans) for t, spans in result.traces]})
        if result.scan_limited:
            mark_limited(answer, "search_traces", search.SCAN_TRACES)
        return answer

    def get_trace(request: Request) -> JSONResponse:
        try:
            trace_id = v3_params.parse_trace_id(request.path_params["trace_id"])
            raw = v3_params.check_trace_params(request.query_params)
        except v3_params.ParamError as exc:
            return error(400, str(exc))
        with closing(connect()) as conn:
            conn.execute("BEGIN")
            return _traces_answer(conn, [trace_id], raw)

    return [
        Route(f"{prefix}/services", services, methods=["GET"]),
        Route(f"{prefix}/operations", span_names, methods=["GET"]),
        Route(f"{prefix}/traces", find_traces, methods=["GET"]),
        # a base64 id may hold "/" (sent as %2F)
        Route(f"{prefix}/traces/{{trace_id:path}}", get_trace, methods=["GET"]),
        Route(f"{prefix}/trace-summaries", trace_summaries, methods=["GET"]),
    ]
