"""CPU and memory of the gateway tier per span (a benchmark, not a test).

    uv run --frozen python -m bench.gateway_throughput --requests 400 --spans 512

Runs tier 1 (``deploy/gateway/tier1.yaml``) in front of two tier-2 collectors
(``deploy/gateway/tier2.yaml``) exporting to a counting OTLP sink
(``testkit.sink``), all on loopback, and sends ``bench.loadgen``'s Gym-shaped
load (``--load random-ids``: every span its own trace id, so tier 2 holds one trace per
span, the worst case per span) into tier 1. Reported per tier, from ``/proc``:
CPU seconds (user + system) spent while the load ran, spans per CPU-second, peak RSS
(``VmHWM``), and for tier 2 the RSS held per trace still waiting for its decision
(``decision_wait`` is set longer than the run, so every trace is held at the end; RSS
growth divided by ``otelcol_processor_tail_sampling_sampling_traces_on_memory``).

The machine is shared: compare runs by CPU-seconds per span, not by wall time, and
repeat. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.stopsignals import run_main

from testkit.otelcol import TIER1, TIER2, Collector, gateway_binary

CLK_TCK = 100


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--spans", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    binary = gateway_binary(lambda line: print(line, file=sys.stderr))
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    sink_port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "testkit.sink", "--port", str(sink_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_listening(sink_port, timeout_s=60)
    env2 = {
        "GATEWAY_BACKEND_OTLP_GRPC": f"127.0.0.1:{sink_port}",
        "GATEWAY_DECISION_WAIT": "3600s",  # hold everything: memory per trace held
        "GATEWAY_NUM_TRACES": "2000000",
        "GATEWAY_EXPECTED_NEW_TRACES_PER_S": "20000",
    }
    tier2 = [Collector(binary, TIER2, work, f"tier2-{n}", env2).start() for n in "ab"]
    endpoints = ", ".join(c.grpc_endpoint for c in tier2)
    tier1 = Collector(binary, TIER1, work, "tier1", {"GATEWAY_TIER2_ENDPOINTS": f"[{endpoints}]"})
    tier1.start()
    collectors = [tier1, *tier2]
    try:
        pids = {c.name: c.proc.pid for c in collectors if c.proc is not None}
        before = {n: (_cpu_s(p), _status_kib(p, "VmRSS")) for n, p in pids.items()}
        started = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.loadgen",
                "--target",
                tier1.grpc_endpoint,
                "--protocol",
                "grpc",
                "--load",
                "random-ids",
                "--spans",
                str(args.spans),
                "--requests",
                str(args.requests),
                "--distinct",
                str(args.requests),
                "--concurrency",
                str(args.concurrency),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        total = args.requests * args.spans

        def received() -> float:
            return sum(c.metric("otelcol_receiver_accepted_spans") for c in tier2)

        deadline = time.monotonic() + 600
        while received() < total and time.monotonic() < deadline:
            time.sleep(1)
        wall = time.monotonic() - started
        report: dict[str, object] = {"spans": total, "wall_s": round(wall, 1)}
        for c in collectors:
            pid = pids[c.name]
            cpu = _cpu_s(pid) - before[c.name][0]
            spans = total if c is tier1 else c.metric("otelcol_receiver_accepted_spans")
            entry: dict[str, object] = {
                "spans": spans,
                "cpu_s": round(cpu, 2),
                "spans_per_cpu_s": round(spans / cpu) if cpu else None,
                "rss_start_mib": round(before[c.name][1] / 1024, 1),
                "peak_rss_mib": round(_status_kib(pid, "VmHWM") / 1024, 1),
            }
            if c is not tier1:
                held = c.metric("otelcol_processor_tail_sampling_sampling_traces_on_memory")
                grown = (_status_kib(pid, "VmRSS") - before[c.name][1]) * 1024
                entry["traces_held"] = held
                entry["rss_bytes_per_trace_held"] = round(grown / held) if held else None
            report[c.name] = entry
        print(json.dumps(report, indent=1))
    finally:
        for c in collectors:
            c.stop()
        sink.terminate()
        sink.wait(timeout=30)
    return 0


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
