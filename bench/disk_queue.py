"""Requests per second through the export queue: in memory vs on disk (a harness).

    uv run --frozen python -m bench.disk_queue [--seconds 3] [--size 65536] [--clients 8]

``clients`` tasks ``put`` requests of ``size`` bytes as fast as the queue answers them
(each waits for its own put, as a receiver handler does), while one consumer leases
batches of up to 2 MiB and acks them at once (an infinitely fast backend). Reported per
queue kind: acknowledged puts per second, MB/s, and the CPU-seconds of this process per
GB. The on-disk runs use a temporary directory on the machine's disk; ``always`` pays
one fsync per group of concurrent puts, ``interval`` one per second.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from gym_sidecar.core.stage import Signal
from gym_sidecar.export.disk_queue import DiskQueue
from gym_sidecar.export.queue import ExportQueue, MemoryQueue
from gym_sidecar.selfmetrics import SelfMetrics


async def run(queue: ExportQueue, seconds: float, size: int, clients: int) -> tuple[int, float]:
    payload = b"x" * size
    stop = time.monotonic() + seconds
    puts = 0

    async def client() -> None:
        nonlocal puts
        while time.monotonic() < stop:
            if await queue.put(Signal.TRACES, payload, 1):
                puts += 1
            else:
                await asyncio.sleep(0.001)

    async def consumer() -> None:
        while True:
            lease = await queue.get(2 * 1024 * 1024, 0.0)
            if lease is None:
                return
            await queue.ack(lease)

    cons = asyncio.create_task(consumer())
    cpu0 = time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    cpu = time.process_time() - cpu0
    queue.drain()
    await cons
    await queue.close()
    return puts, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    print(f"{args.clients} clients, {args.size}-byte requests, {args.seconds:.0f} s each")
    print(f"{'queue':<18} {'puts/s':>10} {'MB/s':>8} {'CPU-s/GB':>9}")
    for kind in ("memory", "disk always", "disk interval"):
        with tempfile.TemporaryDirectory(prefix="bench-dq-", dir=".") as d:

            async def go(kind: str = kind, d: str = d) -> tuple[int, float]:
                queue: ExportQueue
                if kind == "memory":
                    queue = MemoryQueue(256 * 1024 * 1024)
                else:
                    fsync = "always" if kind.endswith("always") else "interval"
                    queue = DiskQueue(d, 256 * 1024 * 1024, SelfMetrics(), fsync=fsync)
                return await run(queue, args.seconds, args.size, args.clients)

            puts, cpu = asyncio.run(go())
        mb = puts * args.size / 1e6
        rate = puts / args.seconds
        print(f"{kind:<18} {rate:>10.0f} {mb / args.seconds:>8.1f} {cpu / (mb / 1000):>9.2f}")


if __name__ == "__main__":
    main()
