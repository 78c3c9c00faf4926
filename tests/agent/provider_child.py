"""Child process for the provider tests (the global TracerProvider is set-once per process).

    python -m tests.agent.provider_child SCENARIO [ENDPOINT]

Runs ``init_telemetry``, serves a FastAPI app with wrapped routes on a real uvicorn
server, sends requests, calls ``shutdown_telemetry`` and prints one JSON line with what
happened and how long each step took.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import gym_telemetry
import httpx
import uvicorn
from fastapi import FastAPI
from gym_telemetry import endpoints, provider, rollout_correlation, span_groups
from pydantic import BaseModel

from testkit.sink import RecordingSink
from tests.support.ports import free_port


class Body(BaseModel):
    answer: str


async def verify(body: Body) -> dict[str, float]:
    if body.answer == "boom":
        raise ValueError("verifier crashed")
    return {"reward": 0.0}


async def run(body: Body) -> dict[str, str]:
    return {"done": body.answer}


def _serve(app: FastAPI) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{port}"


def main() -> None:
    scenario = sys.argv[1]
    endpoint = sys.argv[2] if len(sys.argv) > 2 else None
    out: dict[str, Any] = {"scenario": scenario}

    t0 = time.monotonic()
    if scenario == "env":  # everything from OTEL_* / GYM_TELEMETRY_* variables
        out["init"] = gym_telemetry.init_telemetry()
    else:
        out["init"] = gym_telemetry.init_telemetry(
            server_name="weather",
            server_type="resources",
            endpoint=endpoint,
            span_groups="default,verify",
            resource_attributes={"deployment.environment": "test"},
        )
    out["init_s"] = time.monotonic() - t0
    out["init_again"] = gym_telemetry.init_telemetry(server_name="other")
    out["groups"] = sorted(span_groups.enabled_groups())

    app = FastAPI(**gym_telemetry.fastapi_telemetry_off())
    app.post("/verify")(endpoints.traced_verify_endpoint(verify, {"nemo.gym.server.name": "w"}))

    @app.post("/run")
    async def run_route(body: Body) -> dict[str, str]:
        with rollout_correlation.rollout_context("r-" + body.answer):
            return await traced_run(body=body)

    traced_run = endpoints.traced_rollout_endpoint(run)
    server, thread, url = _serve(app)

    n = int(os.environ.get("CHILD_REQUESTS", "20"))
    statuses: list[int] = []
    latencies: list[float] = []
    with httpx.Client(timeout=10) as client:
        for i in range(n):
            t = time.monotonic()
            statuses.append(client.post(url + "/verify", json={"answer": str(i)}).status_code)
            statuses.append(client.post(url + "/run", json={"answer": str(i)}).status_code)
            latencies.append(time.monotonic() - t)
    crashed = httpx.post(url + "/verify", json={"answer": "boom"}, timeout=10).status_code
    out["statuses"] = sorted(set(statuses))
    out["crashed_status"] = crashed
    out["max_latency_s"] = max(latencies)

    late_sink = None
    if scenario == "late_sidecar":  # the sidecar comes up while the agent is retrying
        time.sleep(float(os.environ.get("CHILD_SINK_DELAY_S", "0.6")))
        out["failed_before_sink"] = provider.export_stats()["failed"]
        late_sink = RecordingSink(port=int(str(endpoint).rsplit(":", 1)[1])).start()
        with httpx.Client(timeout=10) as client:
            for i in range(n):
                client.post(url + "/verify", json={"answer": f"late-{i}"})

    burst = int(os.environ.get("CHILD_BURST", "0"))
    if burst:
        tracer = span_groups.tracer_for("verify")
        for _ in range(burst):
            tracer.start_span("burst").end()
    out["stats_before_shutdown"] = provider.export_stats()

    t0 = time.monotonic()
    out["shutdown"] = gym_telemetry.shutdown_telemetry(
        float(os.environ.get("CHILD_DEADLINE_S", "5"))
    )
    out["shutdown_s"] = time.monotonic() - t0
    out["shutdown_again"] = gym_telemetry.shutdown_telemetry()
    out["stats"] = provider.export_stats()
    if late_sink is not None:
        out["sink_spans"] = late_sink.span_count
        late_sink.stop()
    server.should_exit = True
    thread.join(5)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
