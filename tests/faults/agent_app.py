"""A real agent process for the fault suite: ``init_telemetry`` + a wrapped FastAPI app.

    python -m tests.faults.agent_app --port N --endpoint HOST:PORT

Serves ``POST /run`` (wrapped with ``traced_rollout_endpoint``: one span per call) and
``GET /_stats``: the agent's export counters (``gym_telemetry.provider.export_stats``),
spans ended, and this process's VmRSS in KiB.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI
from gym_telemetry.endpoints import traced_rollout_endpoint
from gym_telemetry.provider import (
    export_stats,
    fastapi_telemetry_off,
    init_telemetry,
    shutdown_telemetry,
)
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider


class EndedSpans(SpanProcessor):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        with self.lock:
            self.ended += 1


def vm_rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def build_app(ended: EndedSpans) -> FastAPI:
    app = FastAPI(**fastapi_telemetry_off())

    async def run(body: dict[str, Any]) -> dict[str, Any]:
        return {"done": body.get("n"), "reward": 1.0}

    app.post("/run")(traced_rollout_endpoint(run, {"nemo.gym.server.name": "fault-agent"}))

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        with ended.lock:
            n = ended.ended
        return {**export_stats(), "ended": n, "rss_kib": vm_rss_kib()}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    args = parser.parse_args()
    assert init_telemetry(
        "fault-agent", server_name="fault-agent", server_type="agent", endpoint=args.endpoint
    )
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    ended = EndedSpans()
    provider.add_span_processor(ended)
    try:
        uvicorn.run(build_app(ended), host="127.0.0.1", port=args.port, log_level="warning")
    finally:
        shutdown_telemetry(2.0)


if __name__ == "__main__":
    main()
