"""The web view's Starlette app: the pages, ``/static/``, and the Jaeger-compatible API.

Routes (all GET; anything else is 405, the view is read-only):

- ``/`` -> ``/rollouts``; ``/rollouts`` (filters ``failed``, ``server``, ``slower_than``,
  ``faster_than``, ``since``, ``rollout``, ``env``; ``page``); ``/trace/{rollout or trace
  id}`` (``page``, ``errors``); ``/stats`` (``since``); ``/envs`` (``since``: the RL
  figures per environment, model and verifier); ``/map`` (``since``); ``/live`` (the
  rollouts in flight now, read from the sidecar's admin listener, :mod:`.live_page`);
- ``/static/ui.css``, ``/static/ui.js``; ``/api/...`` (:mod:`gym_sidecar.query.api`).

Each request opens its own read-only SQLite connection and reads in one transaction, so
a page is one consistent snapshot of a store being written. Handlers are synchronous:
Starlette runs them on its thread pool, off the event loop. Every response carries
:data:`~gym_sidecar.webui.html.SECURITY_HEADERS`; unknown pages get an HTML 404.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import gym_telemetry_semconv as semconv
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from gym_sidecar.live.client import LiveUnavailable, fetch_live
from gym_sidecar.query.api import build_router, normalize_trace_id
from gym_sidecar.query.dependencies import DEPENDENCY_TRACES, recent_graph
from gym_sidecar.store import db, queries, rl, stats
from gym_sidecar.webui import live_page, pages, rl_pages, svg, trace_page
from gym_sidecar.webui.html import SECURITY_HEADERS, url
from gym_sidecar.webui.jaeger_ui import BASE_PATH as JAEGER_BASE
from gym_sidecar.webui.jaeger_ui import JaegerUi
from gym_sidecar.webui.waterfall import completeness

PAGE_SIZE: Final = 50
MAP_TRACES: Final = DEPENDENCY_TRACES
"""The service map reads at most this many of the most recently stored traces."""
SUCCESS_BINS: Final = 24
LIVE_ROWS: Final = 500
"""Most in-flight (and lost) rollouts the ``/live`` page lists (the totals count all)."""
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_STATIC: Final = {"ui.css": "text/css; charset=utf-8", "ui.js": "text/javascript; charset=utf-8"}


def parse_duration_s(text: str, what: str) -> float | None:
    """``500ms``, ``2s``, ``15m``, ``2h``, ``1d`` (bare number: seconds) -> seconds;
    None for ''. Raises ValueError naming ``what``."""
    if not text.strip():
        return None
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{what}: not a duration: {text!r} (e.g. 500ms, 2s, 15m, 1h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass(frozen=True)
class ViewConfig:
    """What the app serves from."""

    store_path: Path
    jaeger_url: str | None = None
    """Base URL of a Jaeger UI holding the same traces (a link on each trace page)."""
    jaeger_ui: JaegerUi | None = None
    """A built Jaeger UI to serve under ``/jaeger/`` (:mod:`.jaeger_ui`)."""
    settle_s: float = 10.0
    """A trace is shown complete only when nothing of it arrived for this long, unless
    its structure already says so (see :mod:`.waterfall`)."""
    clock_ns: Callable[[], int] = time.time_ns
    admin_url: str = f"http://127.0.0.1:{semconv.DEFAULT_ADMIN_PORT}"
    """The sidecar's admin listener, whose ``/v1/rollouts/live`` the ``/live`` page shows."""


class StoreMissing(Exception):
    pass


def _is_api(path: str) -> bool:
    return path.startswith(("/api/", JAEGER_BASE + "/api/"))


def _window(request: Request) -> tuple[str, float | None, str]:
    """The ``since`` query parameter of a page that summarises a window: (as given,
    seconds or None for everything, the error to show when it does not parse)."""
    since = request.query_params.get("since", "").strip()
    try:
        return since, parse_duration_s(since, "since"), ""
    except ValueError as exc:
        return since, None, str(exc)


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status)


class SecurityHeaders:
    """ASGI wrapper adding :data:`SECURITY_HEADERS` to every HTTP response."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._headers = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def wrapped(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in self._headers if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, wrapped)


def build_app(cfg: ViewConfig) -> SecurityHeaders:
    """The whole web view over the store at ``cfg.store_path``."""

    def connect() -> sqlite3.Connection:
        try:
            return db.connect(cfg.store_path, readonly=True)
        except FileNotFoundError:
            raise StoreMissing(str(cfg.store_path)) from None

    @contextmanager
    def snapshot() -> Iterator[sqlite3.Connection]:
        conn = connect()
        try:
            conn.execute("BEGIN")  # every read of this page sees the same commits
            yield conn
        finally:
            conn.close()

    def home(request: Request) -> Response:
        return RedirectResponse("/rollouts", status_code=302)

    def rollouts(request: Request) -> Response:
        q = request.query_params
        filters = pages.RolloutFilters(
            failed=q.get("failed", "") not in ("", "0"),
            server=q.get("server", "").strip(),
            slower_than=q.get("slower_than", "").strip(),
            faster_than=q.get("faster_than", "").strip(),
            since=q.get("since", "").strip(),
            rollout=q.get("rollout", "").strip(),
            env=q.get("env", "").strip(),
        )
        error = ""
        try:
            since_s = parse_duration_s(filters.since, "since")
            slower = parse_duration_s(filters.slower_than, "slower than")
            faster = parse_duration_s(filters.faster_than, "faster than")
            page_no = max(0, int(q.get("page", "0") or 0))
        except ValueError as exc:
            error, since_s, slower, faster, page_no = str(exc), None, None, None, 0
        with snapshot() as conn:
            found = queries.rollouts(
                conn,
                since_s=since_s,
                service=filters.server or None,
                failed_only=filters.failed,
                min_duration_s=slower,
                max_duration_s=faster,
                rollout_id=filters.rollout or None,
                env=filters.env or None,
                limit=PAGE_SIZE + 1,
                offset=page_no * PAGE_SIZE,
                now_ns=cfg.clock_ns(),
            )
            services = queries.service_names(conn)
        if not found and filters.rollout and not error:
            # a trace id (or its first 8+ hex digits) typed into the rollout box
            with snapshot() as conn:
                traces = queries.find_traces(conn, filters.rollout)
            if len(traces) == 1:
                return RedirectResponse(f"/trace/{traces[0]}", status_code=302)
        body = pages.rollouts_page(
            found[:PAGE_SIZE],
            filters,
            page_no=page_no,
            has_more=len(found) > PAGE_SIZE,
            services=services,
            error=error,
        )
        return _html(body, 400 if error else 200)

    def trace(request: Request) -> Response:
        ident = request.path_params["ident"]
        q = request.query_params
        try:
            page_no = max(0, int(q.get("page", "0") or 0))
        except ValueError:
            page_no = 0
        with snapshot() as conn:
            trace_ids = queries.find_traces(conn, ident)
            if not trace_ids:
                full = normalize_trace_id(ident)
                if full is not None and queries.trace_spans(conn, full):
                    trace_ids = [full]
            if len(trace_ids) > 1:
                return _html(trace_page.trace_choice_page(ident, trace_ids))
            spans = queries.trace_spans(conn, trace_ids[0]) if trace_ids else []
        if not spans:
            return _html(
                pages.not_found_page(f"No rollout or trace {ident!r} in the local store."), 404
            )
        state = completeness(spans, cfg.clock_ns(), cfg.settle_s)
        body = trace_page.trace_page(
            trace_ids[0],
            spans,
            state,
            page_no=page_no,
            errors_only=q.get("errors", "") not in ("", "0"),
            jaeger_url=cfg.jaeger_url,
        )
        return _html(body)

    def stats_view(request: Request) -> Response:
        since, window_s, error = _window(request)
        now = cfg.clock_ns()
        with snapshot() as conn:
            result = stats.compute(conn, window_s, now)
            rollout_samples = stats.span_samples(conn, semconv.SPAN_ROLLOUT, window_s, now)
            verify_samples = stats.span_samples(conn, semconv.SPAN_VERIFY, window_s, now)

        def buckets(samples: list[stats.SpanSample], link: bool) -> list[svg.Bucket]:
            values = [s.duration_ms for s in samples]
            out = []
            for lo, hi, n in svg.bucketize(values, svg.nice_bounds(values)):
                href = None
                if link:
                    href = url(
                        "/rollouts",
                        {"slower_than": f"{lo:g}ms", "faster_than": f"{hi:g}ms", "since": since},
                    )
                out.append(svg.Bucket(lo, hi, n, href))
            # the last bucket includes its upper bound: its link must too
            if link and out and out[-1].href is not None:
                last = out[-1]
                out[-1] = svg.Bucket(
                    last.lower_ms,
                    last.upper_ms,
                    last.count,
                    url(
                        "/rollouts",
                        {"slower_than": f"{last.lower_ms:g}ms", "since": since},
                    ),
                )
            return out

        success = success_bins(verify_samples)
        body = pages.stats_page(
            result,
            buckets(rollout_samples, True),
            buckets(verify_samples, False),
            success,
            since,
            error,
            rl_pages.series_section(rl_pages.rollout_series(rollout_samples)),
        )
        return _html(body, 400 if error else 200)

    def envs(request: Request) -> Response:
        since, window_s, error = _window(request)
        now = cfg.clock_ns()
        with snapshot() as conn:
            found = rl.environments(conn, window_s, now)
            models = rl.models(conn, window_s, now)
            verifiers = rl.verifier_rewards(conn, window_s, now)
        body = rl_pages.envs_page(found, models, verifiers, since, error)
        return _html(body, 400 if error else 200)

    def service_map(request: Request) -> Response:
        since = request.query_params.get("since", "").strip()
        try:
            window_s = parse_duration_s(since, "since")
        except ValueError as exc:
            return _html(pages.message_page("Service map", str(exc), active="/map"), 400)
        after = None if window_s is None else cfg.clock_ns() - int(window_s * 1e9)
        with snapshot() as conn:
            graph = recent_graph(conn, stored_after_ns=after, limit=MAP_TRACES)
        edges = [svg.Edge(a, b, c, er) for (a, b), (c, er) in sorted(graph.calls.items())]
        return _html(pages.map_page(graph.nodes, edges, graph.traces, MAP_TRACES, since))

    def live(request: Request) -> Response:
        try:
            view, error = fetch_live(cfg.admin_url, LIVE_ROWS), ""
        except LiveUnavailable as exc:
            view, error = None, f"The sidecar's live view cannot be read: {exc}"
        body = live_page.live_page(view, error, cfg.admin_url)
        return _html(body, 503 if error else 200)

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            raise HTTPException(404)
        data = resources.files("gym_sidecar.webui").joinpath("static", name).read_bytes()
        return Response(data, media_type=_STATIC[name])

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        if _is_api(request.url.path):
            return JSONResponse(
                {
                    "data": None,
                    "total": 0,
                    "limit": 0,
                    "offset": 0,
                    "errors": [{"code": status, "msg": "not found" if status == 404 else "error"}],
                },
                status_code=status,
            )
        if status == 405:
            return _html(pages.message_page("Read-only", "This view is read-only: GET only."), 405)
        return _html(pages.not_found_page(f"Nothing at {request.url.path!r}."), status)

    async def store_missing(request: Request, exc: Exception) -> Response:
        message = f"No local store at {exc} yet: is a sidecar writing it (--store-dir)?"
        if _is_api(request.url.path):
            return JSONResponse(
                {
                    "data": None,
                    "total": 0,
                    "limit": 0,
                    "offset": 0,
                    "errors": [{"code": 503, "msg": message}],
                },
                status_code=503,
            )
        return _html(pages.message_page("No store", message), 503)

    api = build_router(connect, clock_ns=cfg.clock_ns)
    routes: list[BaseRoute] = [
        Route("/", home, methods=["GET"]),
        Route("/rollouts", rollouts, methods=["GET"]),
        Route("/trace/{ident:path}", trace, methods=["GET"]),
        Route("/stats", stats_view, methods=["GET"]),
        Route("/envs", envs, methods=["GET"]),
        Route("/map", service_map, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
        Route("/static/{name}", static, methods=["GET"]),
        *api.routes,
    ]
    if cfg.jaeger_ui is not None:
        jaeger_api = build_router(connect, prefix=JAEGER_BASE + "/api", clock_ns=cfg.clock_ns)
        routes.extend(cfg.jaeger_ui.routes(jaeger_api.routes))
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: not_found, StoreMissing: store_missing},
    )
    return SecurityHeaders(app)


def success_bins(samples: list[stats.SpanSample]) -> list[tuple[str, float, int]]:
    """The verify samples in at most :data:`SUCCESS_BINS` equal time bins:
    (bin start as HH:MM:SS UTC, completed fraction, n)."""
    if not samples:
        return []
    t0, t1 = samples[0].start_ns, samples[-1].start_ns
    width = max(1, (t1 - t0) // SUCCESS_BINS + 1)
    bins: dict[int, list[bool]] = {}
    for s in samples:
        bins.setdefault((s.start_ns - t0) // width, []).append(s.completed)
    return [
        (pages.when(t0 + i * width)[11:19], sum(v) / len(v), len(v))
        for i, v in sorted(bins.items())
    ]
