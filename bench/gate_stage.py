"""What the gate stage costs per export request, in process (a harness, not a test).

    uv run --frozen python -m bench.gate_stage [--n 20000] [--repeats 5]

Each iteration scans an OTLP request from bytes into its wire view (as the receiver
does) and runs ``GateStage.gate`` on it; the scan alone is timed the same way and
subtracted, so the figure is the gate's own cost. Variants:

- ``small``: one Gym request's worth (1 resource; fastapi 4, rollout 1, verify 1,
  http_client 2 spans), and ``large``: 8 resources x 64 spans (512 spans, 8 scopes each);
- ``all-on``: nothing to drop (the fast path: one service lookup per resource);
- ``verify-off``: the verify block dropped (counted from the index);
- ``half-off``: spec ``rollout,verify``: server/http_client/... blocks dropped.

Interleaved repeats; medians. Absolute figures vary with the machine; compare the
variants within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import gym_telemetry_semconv as semconv
from gym_sidecar.core.stage import PassThrough
from gym_sidecar.core.traces import ScanSpec, TraceRequest
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.stage import GateStage, build_gate_stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import add_resource, trace_view


def small_request() -> bytes:
    req = ExportTraceServiceRequest()
    add_resource(
        req,
        "resources-1",
        {
            "fastapi": 4,
            semconv.scope_name(semconv.GROUP_ROLLOUT): 1,
            semconv.scope_name(semconv.GROUP_VERIFY): 1,
            "opentelemetry.instrumentation.aiohttp_client": 2,
        },
    )
    return req.SerializeToString()


def large_request() -> bytes:
    req = ExportTraceServiceRequest()
    for r in range(8):
        add_resource(req, f"svc-{r}", {semconv.scope_name(g): 8 for g in semconv.ALL_GROUPS})
    return req.SerializeToString()


def stage_for(spec: str, modes: dict[str, str] | None = None) -> GateStage:
    metrics = SelfMetrics()
    cfg = SpanGroupsConfig.model_validate({"spec": spec, "modes": modes or {}})
    return build_gate_stage(cfg, PassThrough("tail", None, metrics), metrics)


def time_loop(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    payloads = {"small": small_request(), "large": large_request()}
    stages = {
        "all-on": stage_for("all"),
        "verify-off": stage_for("all", {"verify": "off"}),
        "half-off": stage_for("rollout,verify"),
    }
    scan_nothing = ScanSpec()

    def parse(payload: bytes) -> TraceRequest:
        return trace_view(payload, scan_nothing)

    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for size, payload in payloads.items():
            n = args.n if size == "small" else max(1, args.n // 20)
            results.setdefault((size, "parse"), []).append(time_loop(lambda p=payload: parse(p), n))
            for name, stage in stages.items():
                gate = stage.gate
                results.setdefault((size, name), []).append(
                    time_loop(lambda p=payload, g=gate: g(parse(p)), n)
                )
    print(f"gate stage, in process: n={args.n} (large: n/20) x {args.repeats} repeats, medians")
    print(f"{'request':<8}{'variant':<12}{'us/request':>12}{'gate us':>10}{'ns/span':>10}")
    for size, payload in payloads.items():
        spans = parse(payload).span_count()
        base = statistics.median(results[(size, "parse")])
        print(f"{size:<8}{'scan only':<12}{base:>12.2f}{'':>10}{'':>10}")
        for name in stages:
            med = statistics.median(results[(size, name)])
            gate_us = med - base
            print(f"{size:<8}{name:<12}{med:>12.2f}{gate_us:>10.2f}{gate_us * 1000 / spans:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
