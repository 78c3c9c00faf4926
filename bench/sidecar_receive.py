"""End-to-end receive throughput of a real sidecar process (a benchmark, not a test).

    uv run --frozen python -m bench.sidecar_receive --transport grpc --seconds 5

Starts a counting sink process and a ``gym-sidecar run`` process (real pipeline:
enrich, derive, gate, queue, export over gRPC), then sends ready-serialised
``--spans``-span requests from ``--senders`` threads for ``--seconds``. Prints the spans
accepted per second, the spans the sink counted, and the sidecar's CPU seconds (user +
system from /proc), so runs can be compared by spans per sidecar CPU-second, which is
the figure that matters on a machine shared with the load generator.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import httpx
from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_demo.stopsignals import run_main

from testkit.otlp_samples import SERVICES, trace_request


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transport", choices=["grpc", "http"], default="grpc")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--spans", type=int, default=512)
    args = parser.parse_args()

    sink_port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "testkit.sink", "--port", str(sink_port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    wait_listening(sink_port)
    payload = trace_request("bench", args.spans).SerializeToString()
    sent = [0] * args.senders
    stop = threading.Event()
    try:
        with SidecarProcess(backend=f"127.0.0.1:{sink_port}") as sc:
            assert sc.proc is not None

            def grpc_sender(i: int) -> None:
                with grpc.insecure_channel(sc.grpc_endpoint) as ch:
                    call = ch.unary_unary(f"/{SERVICES['traces']}/Export")
                    while not stop.is_set():
                        try:
                            call(payload, timeout=10)
                            sent[i] += args.spans
                        except grpc.RpcError:
                            time.sleep(0.01)

            def http_sender(i: int) -> None:
                with httpx.Client(timeout=10) as client:
                    while not stop.is_set():
                        resp = client.post(
                            sc.http_url + "/v1/traces",
                            content=payload,
                            headers={"Content-Type": "application/x-protobuf"},
                        )
                        if resp.status_code == 200:
                            sent[i] += args.spans
                        else:
                            time.sleep(0.01)

            target = grpc_sender if args.transport == "grpc" else http_sender
            threads = [threading.Thread(target=target, args=(i,)) for i in range(args.senders)]
            cpu0 = cpu_seconds(sc.proc.pid)
            t0 = time.monotonic()
            for t in threads:
                t.start()
            time.sleep(args.seconds)
            stop.set()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - t0
            cpu = cpu_seconds(sc.proc.pid) - cpu0
    finally:
        sink.send_signal(signal.SIGTERM)
        out, _ = sink.communicate(timeout=30)
    accepted = sum(sent)
    print(
        f"transport={args.transport} spans/request={args.spans} senders={args.senders} "
        f"bytes/request={len(payload)} seconds={elapsed:.1f}"
    )
    print(f"accepted={accepted} ({accepted / elapsed:,.0f} spans/s)  sink: {out.strip()}")
    print(
        f"sidecar cpu={cpu:.2f}s ({cpu / elapsed:.0%} of one core), "
        f"{accepted / cpu:,.0f} spans per sidecar CPU-second"
    )
    print(f"sidecar exit code={sc.returncode}")


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
