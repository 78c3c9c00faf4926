"""A Gym-like server process for the cross-process trace test.

    python -m tests.agent.serve_child ROLE SINK_ENDPOINT [B_URL]

ROLE ``b`` serves a traced ``/verify`` (resources-server-like); ROLE ``a`` serves a traced
``/run`` (agent-like) that calls B's ``/verify`` over HTTP with W3C propagation, inside
the rollout id of the request. Each process calls ``init_telemetry`` with its own
server name and exports to SINK_ENDPOINT. It prints ``PORT <n>`` once listening and
runs until SIGTERM, then calls ``shutdown_telemetry`` and exits.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from gym_telemetry import fastapi_telemetry_off, init_telemetry, shutdown_telemetry
from gym_telemetry.asgi import TraceContextMiddleware
from gym_telemetry.endpoints import traced_rollout_endpoint, traced_verify_endpoint
from gym_telemetry.rollout_correlation import rollout_context
from opentelemetry import propagate
from pydantic import BaseModel

from tests.support.ports import free_port


class RunRequest(BaseModel):
    task: str


class VerifyRequest(BaseModel):
    answer: str


def app_b() -> FastAPI:
    async def verify(body: VerifyRequest) -> dict[str, float]:
        await asyncio.sleep(0)
        return {"reward": 0.0}

    app = FastAPI(**fastapi_telemetry_off())
    app.post("/verify")(traced_verify_endpoint(verify, {"nemo.gym.server.name": "b"}))
    app.add_middleware(TraceContextMiddleware)
    return app


def app_a(b_url: str) -> FastAPI:
    async def run(body: RunRequest) -> dict[str, Any]:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        async with httpx.AsyncClient() as client:
            r = await client.post(b_url + "/verify", json={"answer": "x"}, headers=headers)
        return {"verdict": r.json()}

    traced = traced_rollout_endpoint(run, {"nemo.gym.server.name": "a"})

    async def run_with_rollout_context(body: RunRequest) -> dict[str, Any]:
        with rollout_context(body.task):
            return await traced(body=body)

    app = FastAPI(**fastapi_telemetry_off())
    app.post("/run")(run_with_rollout_context)
    return app


def main() -> None:
    role, sink = sys.argv[1], sys.argv[2]
    kind = "agent" if role == "a" else "resources"
    init_telemetry(
        f"server-{role}", server_name=role, server_type=kind, endpoint=sink, span_groups="all"
    )
    app = app_a(sys.argv[3]) if role == "a" else app_b()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        stop.wait(0.01)
    print(f"PORT {port}", flush=True)
    stop.wait()
    server.should_exit = True
    thread.join(5)
    shutdown_telemetry(5.0)


if __name__ == "__main__":
    main()
