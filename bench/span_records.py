"""CPU per span of recording and exporting, with span records and without (in process).

A Gym-shaped request's two spans (the SERVER span and ``gym.verify``, lean-recorded, as
the SERVER layer and the verify wrapper record them) go through ``GymSpanProcessor`` into
a real ``BatchSpanProcessor`` whose lean gRPC exporter never gets to send (the queue and
batch are made large enough that nothing is exported during the run). Then the queued
batch is encoded the way the exporter would (``grpc_exporter.translate``, 512 per batch).

- ``records``: the exporter takes span records, so ``on_end`` encodes each span and
  queues bytes; the export step only joins them.
- ``spans``: the same exporter with records refused, so spans are queued and encoded at
  export (the agent before span records).

Each variant runs in a fresh process (the processor reads the exporter once, when
plugged), alternating, with the cyclic GC disabled: what is measured is the agent's own
CPU, not the GC work the records save (``bench/agent_allocations.py`` counts that).

    uv run --frozen python bench/span_records.py [--spans 20000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

from gym_telemetry_demo.stopsignals import run_main

_CHILD = r"""
import gc, os, sys, time
os.environ.update(
    OTEL_BSP_SCHEDULE_DELAY="100000000", OTEL_BSP_MAX_QUEUE_SIZE="10000000",
    OTEL_BSP_MAX_EXPORT_BATCH_SIZE="10000000",
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from gym_telemetry._lean import grpc_exporter
from gym_telemetry._export.processor import GymSpanProcessor, TrackingExporter
from gym_telemetry._lean.recorder import LeanRecorder, context_api, recorder_for
mode, n = sys.argv[1], int(sys.argv[2])
exporter = grpc_exporter.make_grpc_exporter("127.0.0.1:9", insecure=True)
type(exporter).accepts_span_records = mode == "records"
provider = TracerProvider(shutdown_on_exit=False)
batch = BatchSpanProcessor(exporter)
switch = GymSpanProcessor()
switch.plug(batch, TrackingExporter(exporter))
provider.add_span_processor(switch)
server = recorder_for(provider.get_tracer("gym_telemetry.server"))
verify = recorder_for(provider.get_tracer("gym_telemetry.verify"))
assert isinstance(server, LeanRecorder) and isinstance(verify, LeanRecorder)
START = {"http.request.method": "POST", "nemo.gym.rollout.id": "12-3"}
END = {"http.route": "/verify", "http.response.status_code": 200}
def run(count):
    for _ in range(count):
        span, token = server.start("POST", dict(START))
        child, child_token = verify.start("gym.verify", {"nemo.gym.rollout.id": "12-3"})
        context_api.detach(child_token)
        child._attrs["gym.verify.succeeded"] = True
        child.end()
        context_api.detach(token)
        span.update_name("POST /verify")
        span._attrs.update(END)
        span.end()
queue = batch._batch_processor._queue
run(500)
queue.clear()
gc.disable()
t0 = time.process_time()
run(n)
t1 = time.process_time()
items = list(queue)[::-1]
t2 = time.process_time()
for i in range(0, len(items), 512):
    grpc_exporter.translate(items[i : i + 512])
t3 = time.process_time()
spans = 2 * n
assert len(items) == spans and (switch.records == spans + 1000) == (mode == "records")
print(f"{1e6 * (t1 - t0) / spans:.3f} {1e6 * (t3 - t2) / spans:.3f}", flush=True)
os._exit(0)  # skip the exporter's shutdown (nothing listens on the endpoint)
"""


def _run(mode: str, spans: int) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(spans // 2)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    record, export = out.stdout.split()
    return float(record), float(export)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.1f}")
    results: dict[str, list[tuple[float, float]]] = {"spans": [], "records": []}
    for _ in range(args.repeats):
        for mode, runs in results.items():
            runs.append(_run(mode, args.spans))
    print("CPU us per span, medians of the repeats (range of the total):")
    for mode, runs in results.items():
        record = statistics.median(r for r, _ in runs)
        export = statistics.median(e for _, e in runs)
        totals = [r + e for r, e in runs]
        print(
            f"  {mode:>7}: recording + on_end {record:6.2f}, export encoding {export:5.2f}, "
            f"total {statistics.median(totals):6.2f} ({min(totals):.2f}-{max(totals):.2f})"
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
