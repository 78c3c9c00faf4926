"""Cost of encoding a batch of ended spans for OTLP: the stock ``encode_spans`` against
the agent's ``gym_telemetry._lean.span_encoding`` (plus the protobuf parse the gRPC exporter
then does), per span, interleaved rounds, medians.

The batch looks like a Gym ``/verify`` server's: half SERVER spans recorded by the SERVER
layer's lean path (remote parent, 4 attributes), half ``gym.verify`` spans (3
attributes), with a resource like the agent's.

    uv run python bench/span_encoding.py [--batch 512] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from gym_telemetry._lean.recorder import recorder_for
from gym_telemetry._lean.span_encoding import encode_request
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind

PARENT = trace.SpanContext(
    0x4BF92F3577B34DA6A3CE929D0E0E4736,
    0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
)


class _Keep(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def gym_batch(size: int) -> list[ReadableSpan]:
    """``size`` ended spans shaped like a Gym /verify server's."""
    resource = Resource(
        {
            "service.name": "example_single_tool_call",
            "nemo.gym.server.name": "example_single_tool_call",
            "nemo.gym.server.type": "resources_servers",
            "service.instance.id": "77f3e26d-f02d-4e83-9453-e6479c494ab3",
        }
    )
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    keep = _Keep()
    provider.add_span_processor(keep)
    server = recorder_for(provider.get_tracer("gym_telemetry.server"))
    verify = recorder_for(provider.get_tracer("gym_telemetry.verify"))
    remote = trace.set_span_in_context(trace.NonRecordingSpan(PARENT))
    while len(keep.spans) < size:
        rollout = f"{len(keep.spans)}-3"
        attrs = {"http.request.method": "POST", "nemo.gym.rollout.id": rollout}
        span, token = server.start("POST", attrs, SpanKind.SERVER, remote)
        child, inner = verify.start("gym.verify", {"nemo.gym.rollout.id": rollout})
        child.set_attribute("succeeded", True)
        context_api.detach(inner)  # type: ignore[arg-type]
        child.end()
        context_api.detach(token)  # type: ignore[arg-type]
        span.update_name("POST /verify")
        span.set_attributes({"http.route": "/verify", "http.response.status_code": 200})
        span.end()
    return keep.spans[:size]


def stock(spans: Sequence[ReadableSpan]) -> Any:
    return encode_spans(spans)


def lean(spans: Sequence[ReadableSpan]) -> Any:
    return ExportTraceServiceRequest.FromString(encode_request(spans))


def _us_per_span(fn: Callable[[Sequence[ReadableSpan]], Any], spans: list[ReadableSpan]) -> float:
    repeats = 5
    start = time.perf_counter()
    for _ in range(repeats):
        fn(spans)
    return (time.perf_counter() - start) / repeats / len(spans) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    spans = gym_batch(args.batch)
    assert lean(spans) == stock(spans), "the encoders disagree"
    encoders = {"stock encode_spans": stock, "lean encode_request + parse": lean}
    results: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(args.rounds):
        for name, fn in encoders.items():
            results[name].append(_us_per_span(fn, spans))
    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"batch of {args.batch} Gym-shaped spans, {args.rounds} rounds, median us/span:")
    for name, value in med.items():
        print(f"  {name:>28}: {value:6.2f} us/span")
    print(f"  speed-up: {med['stock encode_spans'] / med['lean encode_request + parse']:.1f}x")


if __name__ == "__main__":
    main()
