"""Added cost of the agent's endpoint wrappers (a harness, not a test).

    uv run --frozen python -m bench.agent_overhead [--calls N] [--repeats R] [--quick]

Part 1, the wrapper around a handler call. Every variant wraps the same trivial async
handler and is driven the way FastAPI drives an endpoint (``await handler(**kwargs)``),
inside one coroutine stepped by hand, so no event loop or HTTP noise is measured:

- ``bare``: the handler itself.
- ``disabled``: ``traced_endpoint`` with its group disabled (the gate, then the handler).
- ``endpoint``: ``traced_endpoint`` enabled, 2 static attributes.
- ``verify``: ``traced_verify_endpoint`` enabled (+ ``succeeded``).
- ``rollout``: ``traced_rollout_endpoint`` enabled, with a rollout id in context.
- ``endpoint-sdk``: ``endpoint`` forced onto the SDK's recording path
  (``GYM_TELEMETRY_RECORDER=sdk``: ``Tracer.start_span`` + attach + ``end``).
- ``stock``: the reference, one stock SDK span: ``tracer.start_as_current_span`` plus
  3 ``set_attribute`` calls around the handler.

Part 2, whole requests: the same comparison on a real FastAPI app (pydantic body,
validation, JSON response), called in process through ASGI, no network: a bare
``/verify``, the disabled wrapper, ``traced_verify_endpoint`` enabled, and the stock
span. FastAPI's own telemetry is off in every app.

Variants are interleaved in shuffled order in every repeat. For each variant the
harness prints the median and the best (fastest) repeat; "added" is the variant's time
minus the bare handler's from the same run and statistic. On a shared, noisy machine
the best repeat is the better estimate of the intrinsic cost (as with ``timeit``); the
median shows what contention does.

All spans go through the production export path (``GymSpanProcessor`` in front of a real
``BatchSpanProcessor``, bounded queue, worker thread) into an exporter that discards,
so processor hooks and queueing are measured but serialisation and network are not.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from fastapi import FastAPI
from gym_telemetry import (
    endpoints,
    fastapi_telemetry_off,
    rollout_correlation,
    span_groups,
)
from gym_telemetry import (
    environment_variables as env_vars,
)
from gym_telemetry._export.processor import GymSpanProcessor
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from pydantic import BaseModel

Handler = Callable[..., Awaitable[Any]]


class DiscardExporter(SpanExporter):
    """Accepts every batch and drops it."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


# --- part 1: the wrapper around a handler call ------------------------------------------


async def handler(x: int) -> int:
    return x


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the benchmark coroutine suspended")


async def _loop(fn: Handler, n: int) -> float:
    t0 = time.perf_counter_ns()
    for i in range(n):
        await fn(x=i)
    return (time.perf_counter_ns() - t0) / n / 1000.0  # microseconds per call


def build_variants(tracer: trace.Tracer) -> dict[str, Handler]:
    async def stock(x: int) -> int:
        with tracer.start_as_current_span("gym.stock") as span:
            span.set_attribute("nemo.gym.server.name", "bench")
            span.set_attribute("http.route", "/run")
            span.set_attribute("nemo.gym.rollout.id", "r-1")
            return await handler(x)

    static = {"nemo.gym.server.name": "bench", "http.route": "/run"}
    disabled = endpoints.traced_endpoint("sandbox", "gym.sandbox", handler, static)
    endpoint = endpoints.traced_endpoint("server", "gym.endpoint", handler, static)
    verify = endpoints.traced_verify_endpoint(handler, static)
    # The rollout id is set once per batch (see run_batch), as Gym's /run sets it once.
    rollout = endpoints.traced_rollout_endpoint(handler, static)
    # The same wrapper forced onto the SDK's own recording path (Tracer.start_span).
    endpoint_sdk = endpoints.traced_endpoint("server", "gym.endpoint", handler, static)
    os.environ[env_vars.GYM_TELEMETRY_RECORDER] = "sdk"
    try:
        run_batch("endpoint-sdk", endpoint_sdk, 10)  # resolves its recorder now
    finally:
        del os.environ[env_vars.GYM_TELEMETRY_RECORDER]
    return {
        "bare": handler,
        "disabled": disabled,
        "endpoint": endpoint,
        "verify": verify,
        "rollout": rollout,
        "endpoint-sdk": endpoint_sdk,
        "stock": stock,
    }


def run_batch(name: str, fn: Handler, n: int) -> float:
    gc.collect()
    if name == "rollout":
        with rollout_correlation.rollout_context("r-1"):
            return float(_drive(_loop(fn, n)))
    return float(_drive(_loop(fn, n)))


def run_calls(tracer: trace.Tracer, calls: int, repeats: int) -> dict[str, list[float]]:
    variants = build_variants(tracer)
    names = list(variants)
    for name in names:  # warm up caches, tracers, the rollout-id resolution
        run_batch(name, variants[name], 200)
    samples: dict[str, list[float]] = {n: [] for n in names}
    cheap = {"bare", "disabled"}  # ~0.1 us: time them with 10x the calls
    rng = random.Random(7)
    for _ in range(repeats):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            n = calls * 10 if name in cheap else calls
            samples[name].append(run_batch(name, variants[name], n))
    return samples


# --- part 2: whole requests through FastAPI (ASGI, in process) ---------------------------


class VerifyBody(BaseModel):
    response: str
    expected: str


async def verify_handler(body: VerifyBody) -> dict[str, float]:
    return {"reward": float(body.response == body.expected)}


def build_apps(tracer: trace.Tracer) -> dict[str, Any]:
    async def stock(body: VerifyBody) -> dict[str, float]:
        with tracer.start_as_current_span("gym.stock") as span:
            span.set_attribute("nemo.gym.server.name", "bench")
            span.set_attribute("http.route", "/verify")
            span.set_attribute("nemo.gym.rollout.id", "r-1")
            return await verify_handler(body)

    static = {"nemo.gym.server.name": "bench"}
    handlers: dict[str, Any] = {
        "bare": verify_handler,
        "disabled": endpoints.traced_endpoint("sandbox", "gym.sandbox", verify_handler, static),
        "verify": endpoints.traced_verify_endpoint(verify_handler, static),
        "stock": stock,
    }
    apps = {}
    for name, handler_fn in handlers.items():
        app = FastAPI(**fastapi_telemetry_off())
        app.post("/verify")(handler_fn)
        apps[name] = app
    return apps


_BODY = b'{"response": "42", "expected": "41"}'
_SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/verify",
    "raw_path": b"/verify",
    "query_string": b"",
    "root_path": "",
    "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(_BODY)).encode()),
    ],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8000),
}


async def _requests(app: Any, n: int) -> float:
    statuses: set[int] = set()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    t0 = time.perf_counter_ns()
    for _ in range(n):
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": _BODY, "more_body": False}
            return {"type": "http.disconnect"}

        await app(dict(_SCOPE), receive, send)
    elapsed = (time.perf_counter_ns() - t0) / n / 1000.0
    if statuses != {200}:
        raise RuntimeError(f"unexpected statuses {statuses}")
    return elapsed


def run_requests(tracer: trace.Tracer, requests: int, repeats: int) -> dict[str, list[float]]:
    apps = build_apps(tracer)
    names = list(apps)
    samples: dict[str, list[float]] = {n: [] for n in names}
    rng = random.Random(11)

    async def run_all() -> None:
        for name in names:  # warm up
            await _requests(apps[name], 200)
        for _ in range(repeats):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                gc.collect()
                samples[name].append(await _requests(apps[name], requests))

    asyncio.run(run_all())
    return samples


# --- reporting -------------------------------------------------------------------------


def report(samples: dict[str, list[float]], reference: str, unit: str) -> None:
    """Median and best per variant, the added cost over ``bare``, and the ratio of that
    to ``reference``'s added cost (to ``bare`` itself when the reference is ``bare``)."""
    med = {n: statistics.median(v) for n, v in samples.items()}
    best = {n: min(v) for n, v in samples.items()}
    what = "added / bare" if reference == "bare" else f"added / {reference}'s added"
    print(f"{unit}, microseconds; added = variant - bare; ratio = {what}")
    head = f"{'added':>9}{'ratio':>8}"
    print(f"{'variant':<13}{'median':>9}{head}   |{'best':>8}{head}")
    for name in samples:
        cols = []
        for table in (med, best):
            added = table[name] - table["bare"]
            base = table["bare"] if reference == "bare" else table[reference] - table["bare"]
            ratio = "" if name == "bare" else f"{added / base:.2f}x"
            cols.append(f"{table[name]:>9.3f}{added:>9.3f}{ratio:>8}")
        print(f"{name:<13}{cols[0]}   |{cols[1][1:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="calls per batch (part 1)")
    parser.add_argument("--repeats", type=int, default=25, help="interleaved repeats (part 1)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per batch (part 2)")
    parser.add_argument("--quick", action="store_true", help="a few seconds, rough figures")
    args = parser.parse_args(argv)
    calls, repeats = (1000, 7) if args.quick else (args.calls, args.repeats)
    requests, request_repeats = (300, 5) if args.quick else (args.requests, 15)

    exporter = DiscardExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    processor = GymSpanProcessor()
    # A queue deep enough that the worker keeps up between its wake-ups: the drop path
    # is not what is measured (drops are printed at the end).
    processor.plug(BatchSpanProcessor(exporter, max_queue_size=16384))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    span_groups.reset_tracers()
    span_groups.set_enabled({"server", "verify", "rollout"})
    tracer = trace.get_tracer("bench.stock")

    t0 = time.monotonic()
    calls_samples = run_calls(tracer, calls, repeats)
    calls_s = time.monotonic() - t0
    t0 = time.monotonic()
    request_samples = run_requests(tracer, requests, request_repeats)
    requests_s = time.monotonic() - t0

    print(f"python {sys.version.split()[0]}")
    print(
        f"\n== 1. the wrapper around a handler call: {repeats} interleaved repeats x "
        f"{calls} calls (x10 for bare/disabled), {calls_s:.1f}s"
    )
    report(calls_samples, "stock", "per call")
    print(
        f"\n== 2. whole requests through FastAPI (ASGI in process, no network): "
        f"{request_repeats} interleaved repeats x {requests} requests, {requests_s:.1f}s"
    )
    report(request_samples, "bare", "per request")
    print("\nmedian: the middle repeat (what a busy machine gives); best: the fastest repeat")
    print(f"spans exported (discarded): {exporter.spans}, dropped: {processor.dropped}")
    processor.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
