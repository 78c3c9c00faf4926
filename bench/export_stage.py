"""Spans per second and per CPU-second through the export stage (a harness, not a test).

    uv run --frozen python -m bench.export_stage [--requests 400] [--repeats 3]

A counting OTLP/gRPC sink runs as its own process (``testkit.sink``). In this
process the export stage built by ``build_export_stage`` takes a pre-scanned trace
request (its wire view, as the pipeline carries it: 512 spans, ~190 KB) through
``consume`` (serialize -- the received bytes, as no stage changed them -- and enqueue)
as fast as the queue admits them (a Backpressure waits for its hint), while the sender
batches and exports them. Timed from the first consume to the
end of ``shutdown`` (queue drained). Variants: OTLP/gRPC with and without gzip (the
sink speaks gRPC only), through each gRPC client (``backend.grpc_client``: ``h2``, the
sidecar's own gRPC framing over HTTP/2, and ``grpcio``), interleaved. CPU is this
process's (stage, sender, gRPC client) only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from gym_sidecar.assemble import build_export_stage
from gym_sidecar.core.stage import Backpressure, Batch, Signal
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.stopsignals import run_main
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from testkit.otlp_samples import trace_view

SPANS_PER_REQUEST = 512


def make_request() -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for r in range(8):
        rs = req.resource_spans.add()
        rs.resource.attributes.append(
            KeyValue(key="service.name", value=AnyValue(string_value=f"svc-{r}"))
        )
        ss = rs.scope_spans.add()
        ss.scope.name = "gym.bench"
        for i in range(SPANS_PER_REQUEST // 8):
            sp = ss.spans.add()
            sp.name = f"span-{i}"
            sp.trace_id = i.to_bytes(16, "big")
            sp.span_id = (i + 1).to_bytes(8, "big")
            sp.start_time_unix_nano = 1_700_000_000_000_000_000 + i
            sp.end_time_unix_nano = 1_700_000_000_000_500_000 + i
            for k in range(8):
                sp.attributes.append(
                    KeyValue(key=f"attr.{k}", value=AnyValue(string_value=f"value-{k}-{i}"))
                )
    return req


async def one_run(
    endpoint: str, compression: str, client: str, requests: int
) -> tuple[float, float]:
    metrics = SelfMetrics()
    stage = build_export_stage(
        BackendConfig(url=f"http://{endpoint}", compression=compression, grpc_client=client),  # type: ignore[arg-type]
        QueueConfig(max_bytes=16 * 1024 * 1024),
        metrics,
    )
    view = trace_view(make_request())  # the export stage does not modify it
    await stage.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(requests):
        batch = Batch(Signal.TRACES, view, SPANS_PER_REQUEST)
        while True:
            try:
                await stage.consume(batch)
                break
            except Backpressure:
                await asyncio.sleep(0.01)
    await stage.shutdown(120)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    exported = metrics.registry.get_sample_value(
        "gym_sidecar_exported_items_total", {"signal": "traces"}
    )
    assert exported == requests * SPANS_PER_REQUEST, exported
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    sink = subprocess.Popen([sys.executable, "-m", "testkit.sink", "--port", str(port)])
    try:
        wait_listening(port)
        size = len(make_request().SerializeToString())
        print(f"request: {SPANS_PER_REQUEST} spans, {size} bytes; {args.requests} requests")
        results: dict[tuple[str, str], list[tuple[float, float]]] = {
            (c, client): [] for c in ("none", "gzip") for client in ("h2", "grpcio")
        }
        for _ in range(args.repeats):
            for (compression, client), runs in results.items():
                endpoint = f"127.0.0.1:{port}"
                runs.append(asyncio.run(one_run(endpoint, compression, client, args.requests)))
        spans = args.requests * SPANS_PER_REQUEST
        for (compression, client), runs in results.items():
            rate = statistics.median(spans / w for w, _ in runs)
            per_cpu = statistics.median(spans / c for _, c in runs)
            print(
                f"grpc {client:6s} compression={compression:5s} spans/s={rate:10.0f} "
                f"spans per CPU-second (this process)={per_cpu:10.0f}"
            )
    finally:
        sink.terminate()
        sink.wait()


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
