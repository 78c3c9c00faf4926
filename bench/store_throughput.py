"""Does the local store keep up with the sidecar? (a benchmark, not a test)

    uv run --frozen python -m bench.store_throughput --seconds 10

Two figures:

1. ``store alone``: the :class:`LocalStoreExporter` fed serialized Gym-shaped trace
   requests (``--rollouts-per-request`` rollouts of ``--spans-per-rollout`` spans, two
   of them gym.rollout and gym.verify, over two services) by ``--in-flight``
   concurrent exports, as the export queue's sender would: the store's ceiling in
   spans written per second.
2. ``through a sidecar``: a real ``gym-sidecar run`` process with no backend (so the
   local store is its exporter) receiving the same requests over OTLP/gRPC from
   ``--senders`` threads as fast as it accepts them. Prints the spans accepted per
   second (received), the spans the store wrote per second over the same interval (its
   counter on ``/metrics``), the spans refused by backpressure (when the store falls
   behind, the bounded export queue, ``--queue-mib``, fills and clients are told to
   retry later: nothing grows and nothing is dropped silently), and after SIGTERM the
   total written against the total accepted.
3. ``sidecar to a sink`` (the reference): the same sidecar and load with the store off
   and a counting OTLP/gRPC sink process as its backend: what the sidecar receives
   when the exporter is not the limit.

Every request carries distinct trace and span ids (``--payloads`` of them, cycled).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

import grpc
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.store import db, queries
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.exporter import LocalStoreExporter
from gym_sidecar.store.writer import StoreMetrics
from gym_telemetry_demo.ports import free_port, wait_listening
from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_demo.stopsignals import run_main

from testkit.otlp_samples import SERVICES
from testkit.rollout_requests import Rollout, trace_request

BASE_SPANS_PER_ROLLOUT = 5
"""Spans of a ``testkit.rollout_requests.Rollout`` without extra spans."""


def payloads(count: int, rollouts: int, spans_per_rollout: int) -> list[bytes]:
    now = time.time_ns()
    extra = max(0, spans_per_rollout - BASE_SPANS_PER_ROLLOUT)
    return [
        trace_request(
            [
                Rollout(f"{p}-{i}", now + i * 1000, 100.0 + i, extra_spans=extra)
                for i in range(rollouts)
            ]
        ).SerializeToString()
        for p in range(count)
    ]


def store_alone(data: list[bytes], spans: int, seconds: float, in_flight: int, root: Path) -> None:
    metrics = StoreMetrics()

    async def run() -> tuple[int, float]:
        exporter = LocalStoreExporter(root / "alone" / "traces.db", LocalStoreConfig(), metrics)
        written = 0
        deadline = time.monotonic() + seconds
        counter = iter(range(1 << 62))

        async def worker() -> None:
            nonlocal written
            while time.monotonic() < deadline:
                payload = data[next(counter) % len(data)]
                result = await exporter.export(Signal.TRACES, payload, spans)
                assert result.outcome is Outcome.SUCCESS, result
                written += spans

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        elapsed = time.monotonic() - t0
        await exporter.close()
        return written, elapsed

    written, elapsed = asyncio.run(run())
    tx = metrics.registry.get_sample_value("gym_sidecar_store_transactions_total") or 0
    print(
        f"store alone: {written:,} spans in {elapsed:.1f}s = {written / elapsed:,.0f} spans/s "
        f"written ({in_flight} exports in flight, {tx:.0f} transactions, "
        f"{len(data[0]):,} bytes/request)"
    )


def through_sidecar(
    data: list[bytes],
    spans: int,
    seconds: float,
    senders: int,
    root: Path,
    queue_mib: int,
    backend: str | None = None,
) -> float:
    """Drive a sidecar; returns the spans/s it received. With ``backend`` the store is
    off and the sidecar forwards there."""
    sent = [0] * senders
    refused = [0] * senders
    stop = threading.Event()
    config = {
        "local_store": {"data_dir": str(root / "sidecar")},
        "queue": {"max_bytes": queue_mib * 1024 * 1024},
        "shutdown_timeout_s": 120,
        "span_groups": {"spec": "all"},  # the default preset would gate the verify spans
    }
    extra = ["--no-local-store"] if backend else []
    with SidecarProcess(backend, config=config, log_dir=root, extra_args=extra) as sc:

        def sender(i: int) -> None:
            with grpc.insecure_channel(sc.grpc_endpoint) as ch:
                call = ch.unary_unary(f"/{SERVICES['traces']}/Export")
                n = i
                while not stop.is_set():
                    try:
                        call(data[n % len(data)], timeout=10)
                        sent[i] += spans
                    except grpc.RpcError:
                        refused[i] += spans
                        time.sleep(0.01)
                    n += senders

        written_metric = "gym_sidecar_store_written_items_total"
        threads = [threading.Thread(target=sender, args=(i,)) for i in range(senders)]
        w0 = sc.metric(written_metric, signal="traces") if not backend else 0
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        w1 = sc.metric(written_metric, signal="traces") if not backend else 0
    accepted = sum(sent)
    if backend:
        print(
            f"sidecar to a sink: received {accepted:,} spans = {accepted / elapsed:,.0f} "
            f"spans/s; refused {sum(refused):,} (exit code {sc.returncode})"
        )
        return accepted / elapsed
    with closing(db.connect(root / "sidecar" / "traces.db", readonly=True)) as conn:
        final = queries.store_counts(conn)["spans"]
    print(
        f"through a sidecar: received {accepted:,} spans = {accepted / elapsed:,.0f} spans/s; "
        f"store wrote {w1 - w0:,.0f} = {(w1 - w0) / elapsed:,.0f} spans/s in the same "
        f"{elapsed:.1f}s; refused (backpressure, retried by the senders) {sum(refused):,}"
    )
    print(
        f"after SIGTERM: {final:,} spans in the store of {accepted:,} accepted "
        f"(sidecar exit code {sc.returncode})"
    )
    return accepted / elapsed


def to_sink(data: list[bytes], spans: int, seconds: float, senders: int, root: Path) -> None:
    port = free_port()
    sink = subprocess.Popen(
        [sys.executable, "-m", "testkit.sink", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(port)
        through_sidecar(data, spans, seconds, senders, root, 64, backend=f"127.0.0.1:{port}")
    finally:
        sink.send_signal(signal.SIGTERM)
        out, _ = sink.communicate(timeout=60)
    print(f"  sink counted: {out.strip().splitlines()[-1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--rollouts-per-request", type=int, default=28)
    parser.add_argument("--spans-per-rollout", type=int, default=18)
    parser.add_argument("--queue-mib", type=int, default=8)
    parser.add_argument("--payloads", type=int, default=300)
    parser.add_argument("--only", choices=["alone", "sidecar", "sink"])
    args = parser.parse_args()
    per_rollout = max(BASE_SPANS_PER_ROLLOUT, args.spans_per_rollout)
    spans = args.rollouts_per_request * per_rollout
    data = payloads(args.payloads, args.rollouts_per_request, args.spans_per_rollout)
    root = Path(tempfile.mkdtemp(prefix="store-bench-"))
    print(f"cpus={os.cpu_count()} spans/request={spans} distinct requests={len(data)}")
    try:
        if args.only in (None, "alone"):
            store_alone(data, spans, args.seconds, args.in_flight, root)
        if args.only in (None, "sidecar"):
            through_sidecar(data, spans, args.seconds, args.senders, root, args.queue_mib)
        if args.only in (None, "sink"):
            to_sink(data, spans, args.seconds, args.senders, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    run_main(main)  # SIGTERM and SIGHUP stop its children as Ctrl-C does
