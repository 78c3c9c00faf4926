"""Added cost per call of the agent's endpoint wrappers (a harness, not a test).

    uv run --frozen python -m bench.agent_overhead [--calls N] [--repeats R] [--quick]

Every variant wraps the same trivial async handler and is driven the way FastAPI drives
an endpoint (``await handler(**kwargs)``), inside one coroutine stepped by hand, so no
event loop or HTTP noise is measured. Variants are interleaved in shuffled order in
every repeat; per-call times are medians over repeats; "added" is the variant's median
minus the bare handler's median from the same run.

Variants:
- ``bare``: the handler itself.
- ``disabled``: ``traced_endpoint`` with its group disabled (the gate, then the handler).
- ``endpoint``: ``traced_endpoint`` enabled, 2 static attributes.
- ``verify``: ``traced_verify_endpoint`` enabled (+ ``succeeded``).
- ``rollout``: ``traced_rollout_endpoint`` enabled, with a rollout id in context.
- ``endpoint-sdk``: ``endpoint`` forced onto the SDK's recording path
  (``GYM_TELEMETRY_RECORDER=sdk``: ``Tracer.start_span`` + attach + ``end``).
- ``stock``: the reference, one stock SDK span: ``tracer.start_as_current_span`` plus
  3 ``set_attribute`` calls around the handler.

All spans go through the production export path (``GymSpanProcessor`` in front of a real
``BatchSpanProcessor``, bounded queue, worker thread) into an exporter that discards,
so processor hooks and queueing are measured but serialisation and network are not.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from gym_telemetry import endpoints, recording, rollout_correlation, span_groups
from gym_telemetry.export import GymSpanProcessor
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

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
    os.environ[recording.ENV_RECORDER] = "sdk"
    try:
        run_batch("endpoint-sdk", endpoint_sdk, 10)  # resolves its recorder now
    finally:
        del os.environ[recording.ENV_RECORDER]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="calls per batch")
    parser.add_argument("--repeats", type=int, default=25, help="interleaved repeats")
    parser.add_argument("--quick", action="store_true", help="a few seconds, rough figures")
    args = parser.parse_args(argv)
    calls, repeats = (1000, 7) if args.quick else (args.calls, args.repeats)

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

    variants = build_variants(tracer)
    names = list(variants)
    for name in names:  # warm up caches, tracers, the rollout-id resolution
        run_batch(name, variants[name], 200)

    samples: dict[str, list[float]] = {n: [] for n in names}
    # The disabled gate is ~0.1 us: time it (and bare) with 10x the calls to see it.
    cheap = {"bare", "disabled"}
    rng = random.Random(7)
    t_start = time.monotonic()
    for _ in range(repeats):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            n = calls * 10 if name in cheap else calls
            samples[name].append(run_batch(name, variants[name], n))
    elapsed = time.monotonic() - t_start
    processor.shutdown()

    med = {n: statistics.median(v) for n, v in samples.items()}
    base = med["bare"]
    stock_added = med["stock"] - base
    print(
        f"python {sys.version.split()[0]}, {repeats} interleaved repeats x {calls} calls "
        f"(x10 for bare/disabled), {elapsed:.1f}s; medians per call"
    )
    print(f"{'variant':<13}{'per call us':>13}{'added us':>11}{'/ stock span':>14}")
    for name in names:
        added = med[name] - base
        ratio = "" if name == "bare" else f"{added / stock_added:>13.2f}x"
        print(f"{name:<13}{med[name]:>13.3f}{added:>11.3f}{ratio:>14}")
    spread = {n: (min(v), max(v)) for n, v in samples.items()}
    print(
        "min..max per call (us): "
        + ", ".join(f"{n} {a:.2f}..{b:.2f}" for n, (a, b) in spread.items())
    )
    print(
        f"spans exported to the discarding exporter: {exporter.spans}, dropped: {processor.dropped}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
