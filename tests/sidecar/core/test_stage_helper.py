"""ProcessorStage, the helper every pipeline stage is built on: it counts received,
dropped and passed items per signal, forwards to ``next``, and calls ``accepted`` only
once ``next`` accepted the batch."""

from __future__ import annotations

import asyncio

import pytest
from gym_sidecar.core.stage import Backpressure, Batch, ProcessorStage, Signal, Stage
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tests.support.collect_stage import CollectStage


class Halve(ProcessorStage[int]):
    """Drops half of each trace batch (by count only) and remembers what it accepted."""

    name = "halve"
    signals = frozenset({Signal.TRACES})

    def __init__(self, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        self.accepted_tokens: list[int] = []
        self.end_empty = False

    def process(self, batch: Batch) -> int:
        batch.reject(batch.items // 2, "half")
        return batch.items

    def nothing_left(self, batch: Batch) -> bool:
        return self.end_empty

    def accepted(self, batch: Batch, token: int) -> None:
        self.accepted_tokens.append(token)


def count(metrics: SelfMetrics, signal: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "gym_sidecar_stage_items_total",
        {"stage": "halve", "signal": signal, "outcome": outcome},
    )
    return 0.0 if value is None else value


def traces(items: int) -> Batch:
    return Batch(Signal.TRACES, TraceRequest(b"", [], []), items=items)


def test_counts_received_dropped_passed_and_forwards() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    stage = Halve(tail, metrics)
    batch = traces(10)
    asyncio.run(stage.consume(batch))
    assert tail.batches == [batch]
    assert batch.items == 5
    assert (count(metrics, "traces", "received"), count(metrics, "traces", "dropped")) == (10, 5)
    assert count(metrics, "traces", "passed") == 5
    assert stage.accepted_tokens == [5]


def test_other_signals_are_forwarded_untouched_and_uncounted() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    stage = Halve(tail, metrics)
    logs = Batch(Signal.LOGS, ExportLogsServiceRequest(), items=4)
    asyncio.run(stage.consume(logs))
    assert tail.batches == [logs] and logs.items == 4
    assert count(metrics, "logs", "received") == 0
    assert stage.accepted_tokens == []


def test_no_dropped_series_until_something_is_dropped() -> None:
    metrics = SelfMetrics()
    stage = Halve(CollectStage(metrics), metrics)
    asyncio.run(stage.consume(traces(1)))  # 1 // 2 == 0: nothing dropped
    assert (
        metrics.registry.get_sample_value(
            "gym_sidecar_stage_items_total",
            {"stage": "halve", "signal": "traces", "outcome": "dropped"},
        )
        is None
    )


def test_accepted_is_not_called_when_next_pushes_back() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    tail.refuse = 1
    stage = Halve(tail, metrics)
    with pytest.raises(Backpressure):
        asyncio.run(stage.consume(traces(8)))
    assert stage.accepted_tokens == []
    asyncio.run(stage.consume(traces(8)))  # the client's retry
    assert stage.accepted_tokens == [4]


@pytest.mark.parametrize("end_empty", [True, False])
def test_an_empty_batch_ends_here_only_when_nothing_left_says_so(end_empty: bool) -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    stage = Halve(tail, metrics)
    stage.end_empty = end_empty
    asyncio.run(stage.consume(traces(0)))
    assert len(tail.batches) == (0 if end_empty else 1)
    assert stage.accepted_tokens == ([] if end_empty else [0])


def test_two_stages_reading_derive_fields_are_refused() -> None:
    from gym_sidecar.core.stage import PassThrough, pipeline_trace_scan
    from gym_sidecar.core.traces import ScanSpec
    from gym_sidecar.selfmetrics import SelfMetrics

    metrics = SelfMetrics()
    last = PassThrough("b", None, metrics)
    last.trace_scan = ScanSpec(attr_keys=("k",), split_scopes=frozenset({"s2"}))
    first = PassThrough("a", last, metrics)
    first.trace_scan = ScanSpec(split_scopes=frozenset({"s1"}))
    merged = pipeline_trace_scan(first)
    assert merged == ScanSpec(attr_keys=("k",), split_scopes=frozenset({"s1", "s2"}))
    first.trace_scan = ScanSpec(event_keys=(("e", "k"),))
    with pytest.raises(ValueError, match="more than one stage"):
        pipeline_trace_scan(first)
