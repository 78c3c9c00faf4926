"""In-process cost of the auto-instrumentation's SERVER span layer, per request.

Drives ``ServerSpanMiddleware`` around a minimal ASGI app directly (no network, no
Gym), with a real SDK ``TracerProvider`` and a batch processor in front of an exporter
that discards, and compares it in the same run with:

- the bare app;
- the layer with every span group off (the fast path);
- the layer with only ``verify`` on (no span here, but the caller's ``traceparent`` and
  rollout baggage are still extracted and made current);
- the layer with ``server`` on (one SERVER span);
- one stock SDK span (``start_as_current_span`` + 3 attributes) around the app, the
  yardstick of docs/agent-overhead figures.

Requests carry a ``traceparent`` and the rollout-id baggage, as Gym's hops do. Rounds are
interleaved; medians are printed. Only ratios from the same run carry over.

    uv run python bench/gym_server_span_overhead.py [--requests 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import gym_telemetry_semconv as semconv
from gym_telemetry import span_groups
from gym_telemetry.autoinstrument.identity import RUNTIME
from gym_telemetry.autoinstrument.server_span import ServerSpanMiddleware
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

Scope = MutableMapping[str, Any]
App = Callable[[Scope, Any, Any], Awaitable[None]]

HEADERS = [
    (b"host", b"127.0.0.1"),
    (b"content-type", b"application/json"),
    (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    (b"baggage", b"nemo.gym.rollout.id=12-3"),
]


class _Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def _app(scope: Scope, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(message: Any) -> None:
    return None


async def _per_request_us(app: App, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await app(
            {"type": "http", "method": "POST", "path": "/verify", "headers": HEADERS},
            _receive,
            _send,
        )
    return (time.perf_counter() - start) / n * 1e6


async def main_async(requests: int, rounds: int) -> None:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Discard(), max_queue_size=1 << 16))
    trace.set_tracer_provider(provider)
    stock_tracer = provider.get_tracer("stock")
    RUNTIME.active = True
    layer = ServerSpanMiddleware(_app)

    async def stock(scope: Scope, receive: Any, send: Any) -> None:
        with stock_tracer.start_as_current_span(
            "POST /verify", kind=trace.SpanKind.SERVER, attributes={"a": 1, "b": "x", "c": 2.0}
        ):
            await _app(scope, receive, send)

    variants: dict[str, tuple[App, frozenset[str]]] = {
        "bare": (_app, frozenset()),
        "layer, all groups off": (layer, frozenset()),
        "layer, verify only": (layer, frozenset({semconv.GROUP_VERIFY})),
        "layer, server on": (layer, frozenset({semconv.GROUP_SERVER})),
        "stock SDK span": (stock, frozenset()),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (app, groups) in variants.items():
            span_groups.set_enabled(groups)
            results[name].append(await _per_request_us(app, requests))
    provider.shutdown()
    med = {name: statistics.median(v) for name, v in results.items()}
    bare = med["bare"]
    stock_added = med["stock SDK span"] - bare
    print(f"{requests} requests x {rounds} rounds, median us/request (added over bare):")
    for name, value in med.items():
        print(f"  {name:>22}: {value:7.2f} us  (+{value - bare:6.2f} us)")
    layer_added = med["layer, server on"] - bare
    print(f"  layer with server on / one stock SDK span: {layer_added / stock_added:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main_async(args.requests, args.rounds))


if __name__ == "__main__":
    main()
