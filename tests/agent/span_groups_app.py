"""A real agent process for the span-group tests: a wrapped FastAPI app on uvicorn.

    python -m tests.agent.span_groups_app --port N --service NAME

The agent is activated the way a Gym server is (``init_telemetry`` from the
environment: ``OTEL_EXPORTER_OTLP_ENDPOINT`` -> the sidecar, ``GYM_TELEMETRY_*``). The
app serves:

- ``POST /verify``: a handler wrapped with ``traced_verify_endpoint``;
- with ``--fastapi-telemetry``, FastAPI's own built-in spans (scope ``fastapi``);
- ``GET /_stats``: how many spans each gym_telemetry group's tracer has *created* in
  this process (counted by a span processor's ``on_start``), the enabled groups, and
  the poller's counters. Tests count spans created, not time.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import gym_telemetry_semconv as semconv
import uvicorn
from fastapi import FastAPI
from gym_telemetry import remote_config, span_groups
from gym_telemetry.endpoints import traced_verify_endpoint
from gym_telemetry.provider import fastapi_telemetry_off, init_telemetry, shutdown_telemetry
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider


class CreatedSpans(SpanProcessor):
    """Counts spans started per gym_telemetry group."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: dict[str, int] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        scope = span.instrumentation_scope
        group = semconv.group_of_scope(scope.name) if scope is not None else None
        if group is not None:
            with self.lock:
                self.created[group] = self.created.get(group, 0) + 1

    def on_end(self, span: ReadableSpan) -> None:
        pass


def build_app(counter: CreatedSpans, fastapi_telemetry: bool = False) -> FastAPI:
    # FastAPI's built-in telemetry (scope "fastapi") stays on only when asked for.
    app = FastAPI() if fastapi_telemetry else FastAPI(**fastapi_telemetry_off())

    async def verify(body: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0, "echo": body.get("n")}

    app.post("/verify")(traced_verify_endpoint(verify))

    @app.get("/_stats")
    async def stats() -> dict[str, Any]:
        poller = remote_config.current_poller()
        with counter.lock:
            created = dict(counter.created)
        return {
            "created": created,
            "enabled": sorted(span_groups.enabled_groups()),
            "polls": poller.polls if poller else 0,
            "updates": poller.updates if poller else 0,
            "not_modified": poller.not_modified if poller else 0,
            "failures": poller.failures if poller else 0,
        }

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service", required=True)
    parser.add_argument("--fastapi-telemetry", action="store_true")
    args = parser.parse_args()
    assert init_telemetry(args.service, server_name=args.service, server_type="resources")
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    counter = CreatedSpans()
    provider.add_span_processor(counter)
    try:
        uvicorn.run(
            build_app(counter, args.fastapi_telemetry),
            host="127.0.0.1",
            port=args.port,
            log_level="warning",
        )
    finally:
        shutdown_telemetry(2.0)


if __name__ == "__main__":
    main()
