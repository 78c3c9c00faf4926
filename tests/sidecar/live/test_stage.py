"""The live stage in an in-process pipeline (live -> derive -> a collecting tail): the live
events are consumed (or forwarded), applied once per accepted request, and a rollout
span read by the derive stage ends its rollout; every request is a sign of life."""

from __future__ import annotations

import asyncio
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.stage import Backpressure, Batch, Signal
from gym_sidecar.live.api import build_view
from gym_sidecar.live.config import RolloutsConfig
from gym_sidecar.live.stage import LiveStage, build_live_stage
from gym_sidecar.live.tracker import Clock, LiveTracker
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.stage import build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_semconv import live
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from testkit.live_events import (
    T0,
    HandClock,
    heartbeat,
    ids,
    logs_request,
    resource,
    start,
    step,
)
from testkit.otlp_samples import kv, trace_batch
from tests.sidecar.metrics.traces import ROLLOUT_SCOPE, SpanSpec, request
from tests.support.collect_stage import CollectStage

AGENT = {
    "service.name": "nemo-gym/agent_a",
    semconv.SERVER_NAME: "agent_a",
    "service.instance.id": "i-1",
}


def make(**cfg: Any) -> tuple[LiveStage, LiveTracker, CollectStage, SelfMetrics, HandClock]:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    derive = build_derive_stage(MetricsConfig(), tail, metrics)
    stage, tracker = build_live_stage(RolloutsConfig(**cfg), derive, metrics)
    assert tracker is not None
    clock = HandClock()
    tracker.clock = Clock(clock.wall_ns, clock.mono_ns)
    return stage, tracker, tail, metrics, clock


def logs(req: ExportLogsServiceRequest) -> Batch:
    return Batch(
        Signal.LOGS,
        req,
        sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs),
    )


def rollout_span(n: int) -> SpanSpec:
    trace_id, span_id = ids(n)
    return SpanSpec(
        semconv.SPAN_ROLLOUT,
        1500.0,
        {semconv.ROLLOUT_ID: f"r{n}"},
        trace_id=trace_id,
        span_id=span_id,
    )


def in_flight(tracker: LiveTracker) -> list[str | None]:
    return [r.rollout_id for r in build_view(tracker).in_flight]


def test_live_events_are_consumed_and_other_logs_pass() -> None:
    stage, tracker, tail, metrics, _ = make()
    req = logs_request(resource(), [start(1, T0, rollout_id="r1"), heartbeat(1)])
    other = req.resource_logs[0].scope_logs.add()  # an application log beside the events
    other.scope.name = "app"
    other.log_records.add().body.string_value = "hello"
    asyncio.run(stage.consume(logs(req)))
    assert in_flight(tracker) == ["r1"]
    [batch] = tail.batches
    assert batch.items == 1
    [rl] = batch.message.resource_logs  # type: ignore[union-attr]
    assert [sl.scope.name for sl in rl.scope_logs] == ["app"]
    assert metrics.dropped.labels("logs", "live_events").value == 2
    assert metrics.stage_items.labels("live", "logs", "dropped").value == 2


def test_a_request_of_live_events_only_ends_at_the_stage() -> None:
    stage, tracker, tail, _, _ = make()
    tail.refuse = 1  # would push back: nothing reaches it
    asyncio.run(stage.consume(logs(logs_request(resource(), [start(1, T0, rollout_id="r1")]))))
    assert tail.batches == [] and tail.refuse == 1
    assert in_flight(tracker) == ["r1"]


def test_forwarded_events_are_applied_once_when_the_request_is_accepted() -> None:
    stage, tracker, tail, _, _ = make(forward_events=True)
    n = len(live.EVENT_LOOP_LAG_BOUNDS_MS) + 1
    lag = {
        live.LAG_COUNT: 1,
        live.LAG_SUM: 1.0,
        live.LAG_MAX: 1.0,
        live.LAG_BUCKET_COUNTS: tuple([1] + [0] * (n - 1)),
    }
    req = logs_request(resource(), [start(1, T0, rollout_id="r1"), heartbeat(1, **lag)])
    tail.refuse = 1

    async def go() -> None:
        with pytest.raises(Backpressure):
            await stage.consume(logs(req))
        assert in_flight(tracker) == []  # refused: the client sends it again
        await stage.consume(logs(req))

    asyncio.run(go())
    assert in_flight(tracker) == ["r1"]
    [batch] = tail.batches
    assert batch.items == 2  # forwarded whole
    [p] = tracker.derived.collect().event_loop_lag
    assert p.count == 1  # the retried heartbeat counted once


def test_the_rollout_span_read_by_the_derive_stage_ends_the_rollout() -> None:
    stage, tracker, tail, _, _ = make()

    async def go() -> None:
        await stage.consume(
            logs(logs_request(resource(), [start(n, T0, rollout_id=f"r{n}") for n in (1, 2)]))
        )
        await stage.consume(trace_batch(request({ROLLOUT_SCOPE: [rollout_span(1)]}, AGENT)))

    asyncio.run(go())
    assert in_flight(tracker) == ["r2"]
    assert tracker.counters.rollouts == {"started": 2, "ended": 1}
    [span_batch] = [b for b in tail.batches if b.signal is Signal.TRACES]
    assert span_batch.items == 1  # the span itself goes on


def test_a_nested_rollout_span_does_not_end_anything() -> None:
    stage, tracker, _, _, _ = make()
    nested = rollout_span(1)
    nested.attrs[semconv.ROLLOUT_NESTED] = True

    async def go() -> None:
        await stage.consume(logs(logs_request(resource(), [start(1, T0, rollout_id="r1")])))
        await stage.consume(trace_batch(request({ROLLOUT_SCOPE: [nested]}, AGENT)))

    asyncio.run(go())
    assert in_flight(tracker) == ["r1"]


def test_spans_and_metrics_from_the_instance_are_signs_of_life() -> None:
    stage, tracker, _, _, clock = make(lost_after_s=30.0)

    async def go() -> None:
        await stage.consume(logs(logs_request(resource(), [start(1, T0, rollout_id="r1")])))
        for _ in range(3):
            clock.advance(20)
            await stage.consume(trace_batch(request({"app": [SpanSpec("x", 1.0)]}, AGENT)))
            tracker.sweep()
        metrics = ExportMetricsServiceRequest()
        metrics.resource_metrics.add().resource.attributes.extend(
            [kv(k, v) for k, v in AGENT.items()]
        )
        for _ in range(3):
            clock.advance(20)
            await stage.consume(Batch(Signal.METRICS, metrics, 0))
            tracker.sweep()

    asyncio.run(go())
    assert in_flight(tracker) == ["r1"]
    clock.advance(30)
    tracker.sweep()
    assert in_flight(tracker) == []
    assert [r.lost_reason for r in build_view(tracker).lost] == ["silent"]


def test_without_a_tracker_the_events_are_still_consumed() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    stage, tracker = build_live_stage(RolloutsConfig(enabled=False), tail, metrics)
    assert tracker is None
    asyncio.run(stage.consume(logs(logs_request(resource(), [step(1, T0)]))))
    assert tail.batches == []
    assert metrics.dropped.labels("logs", "live_events").value == 1


def test_the_derived_metrics_off_means_no_tracker() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    derive = build_derive_stage(MetricsConfig(enabled=False), tail, metrics)
    _, tracker = build_live_stage(RolloutsConfig(), derive, metrics)
    assert tracker is None


def test_the_event_name_attribute_stands_in_for_the_field() -> None:
    stage, tracker, _, _, _ = make()
    req = logs_request(resource(), [start(1, T0, rollout_id="r1")])
    req.resource_logs[0].scope_logs[0].log_records[0].event_name = ""  # an older sender
    asyncio.run(stage.consume(logs(req)))
    assert in_flight(tracker) == ["r1"]
