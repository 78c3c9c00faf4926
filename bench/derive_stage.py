"""Spans per second through the derive stage, in-process (a harness, not a test).

    uv run --frozen python -m bench.derive_stage [--requests N] [--repeats R] [--spans S]

Each request is one OTLP trace export the way a Gym agent server's SDK sends it: one
ResourceSpans, S spans spread over the groups' scopes. Variants (interleaved, medians
over repeats, same pre-parsed messages, a tail stage that discards):

- ``passthrough``: a PassThrough stage, the floor (call + await overhead);
- ``derive/none``: the derive stage, request with no rollout/verify scope (server,
  http_client, model_call, agent): what most requests cost;
- ``derive/gym``: the derive stage on the Gym mix: per rollout ~1 rollout span,
  1 verify span and 10 other spans (so 1 span in 6 is walked);
- ``derive/all``: every span a rollout or verify span (the worst case).

Figures are spans per second of the stage alone, on requests already scanned into
their wire view (the scan is the receiver's, paid once for the whole pipeline; it also
extracts the fields of the rollout/verify spans the stage reads).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Sequence

import gym_telemetry_semconv as semconv
from gym_sidecar.core.stage import Batch, PassThrough, Signal, Stage
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.stage import DeriveStage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.otlp_samples import trace_view

RESOURCE = {
    semconv.SERVICE_NAME: "simple_agent",
    semconv.SERVER_NAME: "simple_agent",
    semconv.SERVER_TYPE: "agent",
    "host.name": "gym-node-17",
    "k8s.pod.name": "simple-agent-7d9f-abcde",
}
OTHER = (
    semconv.GROUP_SERVER,
    semconv.GROUP_HTTP_CLIENT,
    semconv.GROUP_MODEL_CALL,
    semconv.GROUP_AGENT,
)


class Discard(Stage):
    name = "discard"

    async def consume(self, batch: Batch) -> None:
        return None


def _span(ss: object, name: str, ms: float, attrs: dict[str, object]) -> None:
    sp: Span = ss.spans.add()  # type: ignore[attr-defined]
    sp.name = name
    sp.trace_id = os.urandom(16)
    sp.span_id = os.urandom(8)
    sp.parent_span_id = os.urandom(8)
    sp.start_time_unix_nano = 1_700_000_000_000_000_000
    sp.end_time_unix_nano = sp.start_time_unix_nano + int(ms * 1e6)
    for k, v in attrs.items():
        kv = sp.attributes.add()
        kv.key = k
        if isinstance(v, bool):
            kv.value.bool_value = v
        else:
            kv.value.string_value = str(v)


def make_request(n_spans: int, mix: str) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in RESOURCE.items():
        kv = rs.resource.attributes.add()
        kv.key = k
        kv.value.string_value = v
    groups = list(OTHER)
    per_rollout = 12
    if mix == "gym":
        groups += [semconv.GROUP_ROLLOUT, semconv.GROUP_VERIFY]
    elif mix == "all":
        groups = [semconv.GROUP_ROLLOUT, semconv.GROUP_VERIFY]
    scopes = {}
    for g in groups:
        ss = rs.scope_spans.add()
        ss.scope.name = semconv.scope_name(g)
        scopes[g] = ss
    rnd = random.Random(1)
    for i in range(n_spans):
        rid = f"{i // per_rollout}-0"
        if mix == "all":
            g = groups[i % 2]
        elif mix == "gym" and i % per_rollout == 0:
            g = semconv.GROUP_ROLLOUT
        elif mix == "gym" and i % per_rollout == 1:
            g = semconv.GROUP_VERIFY
        else:
            g = OTHER[i % len(OTHER)]
        attrs: dict[str, object] = {semconv.ROLLOUT_ID: rid}
        if g == semconv.GROUP_ROLLOUT:
            _span(scopes[g], semconv.SPAN_ROLLOUT, rnd.uniform(2_000, 600_000), attrs)
        elif g == semconv.GROUP_VERIFY:
            attrs[semconv.VERIFY_SUCCEEDED] = rnd.random() > 0.05
            _span(scopes[g], semconv.SPAN_VERIFY, rnd.uniform(5, 30_000), attrs)
        else:
            attrs.update({"http.request.method": "POST", "url.path": "/v1/responses"})
            _span(scopes[g], "POST /v1/responses", rnd.uniform(1, 5000), attrs)
    return req


async def _time(stage: Stage, reqs: Sequence[ExportTraceServiceRequest], n_spans: int) -> float:
    views = {id(r): r.SerializeToString() for r in reqs}
    batches = [Batch(Signal.TRACES, trace_view(views[id(r)]), items=n_spans) for r in reqs]
    t0 = time.perf_counter()
    for b in batches:
        await stage.consume(b)
    return len(batches) * n_spans / (time.perf_counter() - t0)


async def main_async(n_requests: int, repeats: int, n_spans: int) -> None:
    metrics = SelfMetrics()
    tail = Discard(None, metrics)
    variants: dict[str, tuple[Stage, list[ExportTraceServiceRequest]]] = {
        "passthrough": (PassThrough("p", tail, metrics), [make_request(n_spans, "none")] * 8),
        "derive/none": (
            DeriveStage(MetricsConfig(), tail, metrics),
            [make_request(n_spans, "none")] * 8,
        ),
    }
    m2, m3 = SelfMetrics(), SelfMetrics()
    variants["derive/gym"] = (
        DeriveStage(MetricsConfig(), Discard(None, m2), m2),
        [make_request(n_spans, "gym") for _ in range(8)],
    )
    variants["derive/all"] = (
        DeriveStage(MetricsConfig(), Discard(None, m3), m3),
        [make_request(n_spans, "all") for _ in range(8)],
    )
    results: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    for _ in range(repeats):
        random.shuffle(order)
        for name in order:
            stage, reqs = variants[name]
            batch = (reqs * (n_requests // len(reqs) + 1))[:n_requests]
            results[name].append(await _time(stage, batch, n_spans))
    print(f"derive stage, {n_requests} requests x {n_spans} spans, {repeats} repeats (medians)")
    for name in variants:
        med = statistics.median(results[name])
        print(f"  {name:12s} {med / 1e3:10.0f}k spans/s  {1e6 * n_spans / med:8.1f} us/request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spans", type=int, default=512)
    args = parser.parse_args()
    asyncio.run(main_async(args.requests, args.repeats, args.spans))


if __name__ == "__main__":
    main()
