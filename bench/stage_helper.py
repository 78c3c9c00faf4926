"""Per-batch cost of the stage helper, in process (a harness, not a test).

    uv run --frozen python -m bench.stage_helper [--batches 200000] [--repeats 7]

``core.stage.ProcessorStage`` does the counting (received / dropped / passed) and the
forwarding that each stage used to write by hand. This times ``consume`` of three
stages with an empty job on the same small trace batch, interleaved, medians:

- ``pass-through``: ``PassThrough``, forwarding only (the floor);
- ``hand-written``: the pattern enrich and gate had before the helper: counter
  children resolved at construction, ``received`` / ``passed`` incremented inline,
  ``next`` awaited;
- ``helper``: a ``ProcessorStage`` whose ``process`` does nothing (the hooks
  ``nothing_left`` and ``accepted`` left at their defaults).

``helper - hand-written`` is what the helper adds per batch. For scale, the enrich
stage costs tens of microseconds per Gym request (``bench.enrich_stage``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from gym_sidecar.core.stage import Batch, PassThrough, ProcessorStage, Signal, Stage
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.selfmetrics import SelfMetrics


class HandWritten(Stage):
    """Counting and forwarding written out, as the stages did before the helper."""

    name = "hand"

    def __init__(self, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        self._counters = {
            signal: (
                metrics.stage_items.labels(self.name, signal.value, "received"),
                metrics.stage_items.labels(self.name, signal.value, "passed"),
            )
            for signal in Signal
        }

    def process(self, batch: Batch) -> None:
        pass

    async def consume(self, batch: Batch) -> None:
        received, passed = self._counters[batch.signal]
        received.inc(batch.items)
        self.process(batch)
        passed.inc(batch.items)
        if self.next is not None:
            await self.next.consume(batch)


class Helper(ProcessorStage[None]):
    name = "helper"

    def process(self, batch: Batch) -> None:
        pass


class Sink(Stage):
    async def consume(self, batch: Batch) -> None:
        pass


async def time_stage(stage: Stage, batch: Batch, n: int) -> float:
    consume = stage.consume
    start = time.perf_counter()
    for _ in range(n):
        await consume(batch)
    return (time.perf_counter() - start) / n * 1e9


async def run(batches: int, repeats: int) -> None:
    metrics = SelfMetrics()
    sink = Sink(None, metrics)
    stages: dict[str, Stage] = {
        "pass-through": PassThrough("p", sink, metrics),
        "hand-written": HandWritten(sink, metrics),
        "helper": Helper(sink, metrics),
    }
    batch = Batch(Signal.TRACES, TraceRequest(b"", [], []), items=8)
    times: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(repeats):
        for name, stage in stages.items():
            times[name].append(await time_stage(stage, batch, batches))
    print(f"stage helper, {batches} batches x {repeats} repeats (medians, ns per batch)")
    for name, values in times.items():
        print(f"  {name:<13} {statistics.median(values):8.0f}")
    added = [h - w for h, w in zip(times["helper"], times["hand-written"], strict=True)]
    print(f"  helper - hand-written: {statistics.median(added):+.0f} ns per batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(run(args.batches, args.repeats))


if __name__ == "__main__":
    main()
