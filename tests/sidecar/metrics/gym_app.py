"""A small Gym-like FastAPI server instrumented with the agent's wrappers (run as a process).

    python -m tests.sidecar.metrics.gym_app --port P --sidecar 127.0.0.1:4317

- ``POST /run`` ({"sleep_ms"}): wrapped by ``traced_rollout_endpoint``.
- ``POST /verify`` ({"sleep_ms", "outcome"}): wrapped by ``traced_verify_endpoint``;
  outcome ``pass`` (reward 1), ``wrong`` (reward 0: the verifier judged the answer
  wrong, the call succeeded), ``raise_value`` / ``raise_key`` (the verifier raised).
- ``POST /flush``: force-flushes the SDK, so every ended span has reached the sidecar.
- ``GET /spans``: every span this process ended, as recorded by a second, in-memory
  span processor (ground truth for the tests: ids, start/end nanos).

Telemetry: ``init_telemetry`` pointed at the sidecar, span groups ``all``, polling off.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from gym_telemetry.endpoints import traced_rollout_endpoint, traced_verify_endpoint
from gym_telemetry.provider import fastapi_telemetry_off, init_telemetry
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from pydantic import BaseModel


class Recorder(SpanExporter):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[dict[str, Any]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock:
            for s in spans:
                ctx = s.get_span_context()
                assert ctx is not None
                self.spans.append(
                    {
                        "name": s.name,
                        "trace_id": f"{ctx.trace_id:032x}",
                        "span_id": f"{ctx.span_id:016x}",
                        "start": s.start_time,
                        "end": s.end_time,
                        "attributes": dict(s.attributes or {}),
                    }
                )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class RunBody(BaseModel):
    sleep_ms: float


class VerifyBody(BaseModel):
    sleep_ms: float
    outcome: str = "pass"


async def run(body: RunBody) -> dict[str, Any]:
    await asyncio.sleep(body.sleep_ms / 1000)
    return {"reward": 1.0}


async def verify(body: VerifyBody) -> dict[str, Any]:
    await asyncio.sleep(body.sleep_ms / 1000)
    if body.outcome == "raise_value":
        raise ValueError("judge model returned garbage")
    if body.outcome == "raise_key":
        raise KeyError("expected_answer")
    return {"reward": 0.0 if body.outcome == "wrong" else 1.0}


def build_app(recorder: Recorder) -> FastAPI:
    app = FastAPI(**fastapi_telemetry_off())
    app.post("/run")(traced_rollout_endpoint(run))
    app.post("/verify")(traced_verify_endpoint(verify))

    # The wrapper has seen the exception by the time these run; answering 500 here
    # keeps the connection alive instead of letting uvicorn drop it.
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": type(exc).__name__}, status_code=500)

    app.add_exception_handler(ValueError, failed)
    app.add_exception_handler(KeyError, failed)

    @app.post("/flush")
    def flush() -> dict[str, bool]:
        provider = trace.get_tracer_provider()
        assert isinstance(provider, TracerProvider)
        return {"flushed": provider.force_flush(10_000)}

    @app.get("/spans")
    def spans() -> list[dict[str, Any]]:
        with recorder.lock:
            return list(recorder.spans)

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sidecar", required=True, help="the sidecar's OTLP/gRPC host:port")
    parser.add_argument("--service", default="math_with_judge")
    args = parser.parse_args()
    ok = init_telemetry(
        args.service,
        server_name=args.service,
        server_type="resources",
        endpoint=args.sidecar,
        span_groups="all",
    )
    assert ok, "init_telemetry failed"
    recorder = Recorder()
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(recorder))
    uvicorn.run(build_app(recorder), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
