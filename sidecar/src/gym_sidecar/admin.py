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
~6 MiB of resident memory for five raw Request/Response routes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    readiness: Readiness, metrics: SelfMetrics, routers: Sequence[Router] = ()
) -> Starlette:
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
    return Starlette(routes=routes)
