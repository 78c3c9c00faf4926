"""Per-request cost of the enrich stage with a warm cache (a harness, not a test).

    uv run --frozen python -m bench.enrich_stage [--requests N] [--repeats R]

Requests are shaped like Gym traffic: one ResourceSpans per request (a Gym server's
resource as the agent sends it: service.name, nemo.gym.server.*, container.id,
telemetry.sdk.*, process.pid) with four ScopeSpans (span groups) of 64 spans each,
and a variant with four ResourceSpans (a sidecar batching several servers). Every
request is a fresh wire view scanned from the bytes, as the receiver hands it over, so
the stage sees an unenriched resource each time; scanning is done before timing.

The stage runs with static attributes, OTEL_RESOURCE_ATTRIBUTES, host, Gym and
Kubernetes sources on, Docker off (its results are cached the same way; the lookup
itself runs in a thread). Printed: median microseconds per request over repeats, for
the stage, for a pass-through stage, the cold cost of one cache miss, and for
scale the cost of scanning the same request from bytes (the receiver's).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from gym_sidecar.core.stage import Batch, PassThrough, Signal, Stage
from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.enrich.enricher import Enricher
from gym_sidecar.enrich.stage import EnrichStage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from testkit.otlp_samples import trace_view

GROUPS = ("server", "http_client", "rollout", "model_call")


def gym_request(servers: int, spans_per_scope: int = 64) -> bytes:
    req = ExportTraceServiceRequest()
    for s in range(servers):
        rs = req.resource_spans.add()
        for key, value in (
            ("service.name", f"math_with_judge_{s}"),
            ("nemo.gym.server.name", f"math_with_judge_{s}"),
            ("nemo.gym.server.type", "resources"),
            ("container.id", f"{s:064x}"),
            ("telemetry.sdk.language", "python"),
            ("telemetry.sdk.name", "opentelemetry"),
            ("telemetry.sdk.version", "1.45.2"),
            ("process.pid", "4242"),
        ):
            rs.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
        for group in GROUPS:
            ss = rs.scope_spans.add()
            ss.scope.name = f"gym_telemetry.{group}"
            for i in range(spans_per_scope):
                sp = ss.spans.add()
                sp.trace_id = bytes(16)
                sp.span_id = (i + 1).to_bytes(8, "big")
                sp.name = f"POST /{group}"
                sp.attributes.append(
                    KeyValue(key="nemo.gym.rollout.id", value=AnyValue(string_value=f"r-{i}"))
                )
    return req.SerializeToString()


def make_stage(metrics: SelfMetrics, tail: Stage) -> EnrichStage:
    cfg = EnrichConfig.model_validate(
        {
            "attributes": {"deployment.environment.name": "bench", "team": "rl"},
            "server_name": "fallback",
            "docker": {"enabled": False},
            "kubernetes": {"enabled": True},
        }
    )
    environ = {
        "OTEL_RESOURCE_ATTRIBUTES": "cloud.region=eu-west-1,k8s.cluster.name=gym",
        "K8S_POD_NAME": "gym-math-0",
        "K8S_NAMESPACE_NAME": "gym",
        "K8S_NODE_NAME": "node-7",
        "K8S_POD_UID": "9b8f1c1e-0000-4000-8000-000000000001",
        "K8S_CONTAINER_NAME": "math",
    }
    return EnrichStage(Enricher.from_config(cfg, metrics, environ), tail, metrics)


async def time_stage(stage: Stage, wire: bytes, requests: int, spans: int) -> float:
    batches = [Batch(Signal.TRACES, trace_view(wire), spans, "10.0.0.2:1") for _ in range(requests)]
    start = time.perf_counter()
    for batch in batches:
        await stage.consume(batch)
    return (time.perf_counter() - start) / requests * 1e6


async def run(requests: int, repeats: int) -> None:
    for servers in (1, 4):
        wire = gym_request(servers)
        spans = servers * len(GROUPS) * 64
        metrics = SelfMetrics()
        sink = PassThrough("sink", None, metrics)
        stage = make_stage(metrics, sink)
        cold_batch = Batch(Signal.TRACES, trace_view(wire), spans)
        t0 = time.perf_counter()
        await stage.consume(cold_batch)
        cold_us = (time.perf_counter() - t0) * 1e6
        warm, base = [], []
        for _ in range(repeats):
            warm.append(await time_stage(stage, wire, requests, spans))
            base.append(await time_stage(PassThrough("p", sink, metrics), wire, requests, spans))
        added = [w - b for w, b in zip(warm, base, strict=True)]
        t0 = time.perf_counter()
        for _ in range(requests):
            trace_view(wire)
        parse_us = (time.perf_counter() - t0) / requests * 1e6
        print(
            f"resource_spans={servers} spans={spans} bytes={len(wire)}: "
            f"enrich {statistics.median(warm):.1f} us/request "
            f"(pass-through {statistics.median(base):.1f}, added "
            f"{statistics.median(added):.1f} = {statistics.median(added) / servers:.1f} "
            f"us per ResourceSpans); first request (cache miss) {cold_us:.0f} us; "
            f"computed={stage.enricher.computed}; for scale, scanning the request "
            f"{parse_us:.1f} us"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.requests, args.repeats))


if __name__ == "__main__":
    main()
