"""The admin listener's app: health, readiness and the sidecar's own metrics.

Routes:
- ``GET /healthz``: 200 while the process serves (liveness).
- ``GET /readyz``: 200 once the receivers are up; 503 before that and from the moment
  shutdown begins (so Kubernetes stops routing to a draining sidecar).
- ``GET /metrics``: :meth:`SelfMetrics.render` in Prometheus text format, or OpenMetrics
  (with exemplars) when ``Accept`` asks for ``application/openmetrics-text``.

Adding routes (e.g. the span-group API): build a ``starlette.routing.Router`` and append
it to ``routers`` in :func:`gym_sidecar.assemble.build_pipeline`; the server passes
that list to :func:`build_admin_app`, which serves each router's routes after its own.
Routers must not reuse the three paths above.

The app is plain Starlette (FastAPI's routing, validation and OpenAPI models would cost
~6 MiB of resident memory for five raw Request/Response routes), wrapped in
:class:`BodyDeadline`: a request body (``PUT /v1/span-groups``) that has not arrived in
full within ``limits.admin_body_timeout_s`` is answered 408 and counted in
``limit_hits{limit="admin_body_timeout_s"}``; routes then read the body from memory.
Header size, header and idle timeouts and the connection cap are the listener's
(:mod:`gym_sidecar.wire.http1`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import gym_telemetry_semconv as semconv
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics import exposition as openmetrics
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, Router

from gym_sidecar.selfmetrics import SelfMetrics


@dataclass
class Readiness:
    """Shared flags the server flips; read by ``/readyz``. Loop-confined, no locking."""

    receivers_up: bool = False
    shutting_down: bool = False

    @property
    def ready(self) -> bool:
        return self.receivers_up and not self.shutting_down


def build_admin_app(
    readiness: Readiness,
    metrics: SelfMetrics,
    routers: Sequence[Router] = (),
    *,
    body_timeout_s: float = 10.0,
) -> BodyDeadline:
    """The admin ASGI app; the routes of ``routers`` are served after the built-in ones."""

    async def healthz(request: Request) -> Response:
        return Response("ok\n", media_type="text/plain")

    async def readyz(request: Request) -> Response:
        if readiness.ready:
            return Response("ready\n", media_type="text/plain")
        state = "shutting down" if readiness.shutting_down else "starting"
        return Response(f"not ready: {state}\n", status_code=503, media_type="text/plain")

    async def prometheus_metrics(request: Request) -> Response:
        # OpenMetrics when the scraper asks for it: only that format carries exemplars
        # (the derived histograms' trace_id/span_id links).
        if "application/openmetrics-text" in request.headers.get("accept", ""):
            body: bytes = openmetrics.generate_latest(metrics.registry)  # type: ignore[no-untyped-call]
            return Response(body, media_type=openmetrics.CONTENT_TYPE_LATEST)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    routes: list[BaseRoute] = [
        Route(semconv.HEALTHZ_PATH, healthz, methods=["GET"]),
        Route(semconv.READYZ_PATH, readyz, methods=["GET"]),
        Route(semconv.METRICS_PATH, prometheus_metrics, methods=["GET"]),
    ]
    for router in routers:
        routes.extend(router.routes)
    return BodyDeadline(Starlette(routes=routes), body_timeout_s, metrics)


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

BODY_TIMEOUT_LIMIT = "admin_body_timeout_s"
MAX_BUFFERED_BODY_BYTES = 1024 * 1024
"""BodyDeadline stops reading past this; the routes refuse far smaller bodies (the
span-group PUT takes 256 KiB) and see only what was read."""


class BodyDeadline:
    """ASGI wrapper: read each HTTP request's whole body within ``timeout_s`` (408 and
    counted otherwise), then run ``app`` with the body replayed from memory. At most
    :data:`MAX_BUFFERED_BODY_BYTES` (+ one read) are buffered; a longer body reaches the
    app cut short, with ``more_body`` false, which its own size limit then refuses."""

    def __init__(self, app: Any, timeout_s: float, metrics: SelfMetrics) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body, disconnected = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except TimeoutError:
            self.metrics.limit_hits.labels(BODY_TIMEOUT_LIMIT).inc()
            self.metrics.bad_requests.labels("admin", "timeout").inc()
            message = {"error": f"body not received within {self.timeout_s}s"}
            content = json.dumps(message).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 408,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(content)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": content})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed and not disconnected:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _read(receive: Receive) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"".join(chunks), True
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False) or size > MAX_BUFFERED_BODY_BYTES:
                return b"".join(chunks), False
