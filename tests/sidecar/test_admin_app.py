"""The admin app's readiness states and router extension, over ASGI (no sockets)."""

from __future__ import annotations

import asyncio

import httpx
from gym_sidecar.admin import Readiness, build_admin_app
from gym_sidecar.selfmetrics import SelfMetrics
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, Router


def test_readyz_follows_lifecycle_and_extra_routers_are_served() -> None:
    readiness = Readiness()

    async def extra_route(request: Request) -> JSONResponse:
        return JSONResponse({"from": "router"})

    extra = Router(routes=[Route("/v1/extra", extra_route, methods=["GET"])])

    app = build_admin_app(readiness, SelfMetrics(), [extra])

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
            starting = await client.get("/readyz")
            assert (starting.status_code, starting.text) == (503, "not ready: starting\n")
            assert (await client.get("/healthz")).status_code == 200
            readiness.receivers_up = True
            assert (await client.get("/readyz")).status_code == 200
            readiness.shutting_down = True
            draining = await client.get("/readyz")
            assert (draining.status_code, draining.text) == (503, "not ready: shutting down\n")
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/v1/extra")).json() == {"from": "router"}

    asyncio.run(scenario())
