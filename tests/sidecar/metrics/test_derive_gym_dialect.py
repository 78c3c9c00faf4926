"""The derive stage on Gym's own telemetry (``nemo.lens.helpers``, failures as an
exception event) and on a mixed fleet: each rollout and each verification is one point,
``succeeded`` and ``error.type`` read from the status and the exception event, and both
producers land in the same series."""

from __future__ import annotations

import asyncio
from typing import Any

import gym_telemetry_semconv as semconv
from gym_sidecar.core.stage import Signal
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.stage import build_gate_stage
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.stage import DeriveStage, build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics

from testkit.otlp_samples import parsed, trace_batch
from testkit.rollout_requests import (
    GYM_AGENT,
    GYM_RESOURCES,
    Rollout,
    gym_dialect_request,
    trace_request,
)
from tests.sidecar.metrics.collect import points
from tests.support.collect_stage import CollectStage

T0 = 1_700_000_000_000_000_000


def pipeline(**span_groups: Any) -> tuple[DeriveStage, CollectStage]:
    """derive -> gate -> collect, as ``build_pipeline`` wires them (defaults)."""
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    gate = build_gate_stage(SpanGroupsConfig(**span_groups), tail, metrics)
    stage = build_derive_stage(MetricsConfig(), gate, metrics, gate.enabled_groups)
    assert isinstance(stage, DeriveStage)
    return stage, tail


def derive(stage: DeriveStage, tail: CollectStage, *requests: Any) -> dict[str, list[Any]]:
    async def go() -> None:
        for req in requests:
            await stage.consume(trace_batch(req))
        assert await stage.flush()

    asyncio.run(go())
    out: dict[str, list[Any]] = {}
    for req in tail.metric_requests():
        for point in points(req):
            out.setdefault(point.metric, []).append(point)
    return out


def rollouts(n: int, failing: int, first: int = 0) -> list[Rollout]:
    return [
        Rollout(f"{i}-0", T0 + i, 800.0 + i, verify_ok=i < first + n - failing)
        for i in range(first, first + n)
    ]


def test_each_gym_rollout_and_verification_is_one_point() -> None:
    stage, tail = pipeline()
    got = derive(stage, tail, gym_dialect_request(rollouts(20, failing=4)))
    [rollout] = got[semconv.METRIC_ROLLOUT_DURATION]
    assert rollout.point.count == 20
    assert rollout.resource[semconv.SERVICE_NAME] == GYM_AGENT
    counts = {
        (p.attrs[semconv.VERIFY_SUCCEEDED], p.attrs.get(semconv.ERROR_TYPE)): p.point.as_int
        for p in got[semconv.METRIC_VERIFY_COUNT]
    }
    # the exception event's class, without its module, as the agent writes error.type
    assert counts == {(True, None): 16, (False, "VerifierCrash"): 4}
    assert {p.resource[semconv.SERVICE_NAME] for p in got[semconv.METRIC_VERIFY_COUNT]} == {
        GYM_RESOURCES
    }
    assert sum(p.point.count for p in got[semconv.METRIC_VERIFY_DURATION]) == 20
    # the derived metrics are the sidecar's own: its scope, not Lens's
    assert {p.scope for ps in got.values() for p in ps} == {"gym_sidecar.derived"}


def test_gym_spans_of_a_metrics_group_are_derived_then_dropped() -> None:
    """Default policy: verify and model_call in ``metrics`` mode (derived, not
    forwarded), agent ``off`` (dropped), rollout ``on``."""
    stage, tail = pipeline()
    derive(stage, tail, gym_dialect_request(rollouts(3, failing=1)))
    forwarded = {
        span.name
        for batch in tail.batches
        if batch.signal is Signal.TRACES
        for rs in parsed(batch.message).resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if ss.scope.name == "nemo.lens.helpers"
    }
    assert forwarded == {semconv.SPAN_ROLLOUT}


def test_an_off_group_is_not_derived_from_gym_spans_either() -> None:
    stage, tail = pipeline(modes={"verify": "off", "model_call": "off"})
    got = derive(stage, tail, gym_dialect_request(rollouts(3, failing=1)))
    assert set(got) == {semconv.METRIC_ROLLOUT_DURATION}
    # model_call is in ``metrics`` mode by default: Gym's model calls are derived too
    stage, tail = pipeline(modes={"verify": "off"})
    got = derive(stage, tail, gym_dialect_request(rollouts(3, failing=1)))
    assert set(got) == {
        semconv.METRIC_ROLLOUT_DURATION,
        semconv.METRIC_GEN_AI_OPERATION_DURATION,
    }
    stage, tail = pipeline(modes={"rollout": "off"})
    got = derive(stage, tail, gym_dialect_request(rollouts(3, failing=1)))
    assert semconv.METRIC_ROLLOUT_DURATION not in got
    assert sum(p.point.as_int for p in got[semconv.METRIC_VERIFY_COUNT]) == 3


def test_a_mixed_fleet_reads_as_one_fleet() -> None:
    """Some rollouts recorded by the agent, some by Gym's own telemetry: one point each,
    and failures with the same ``error.type`` from both producers."""
    stage, tail = pipeline()
    ours = trace_request(rollouts(10, failing=2))
    theirs = gym_dialect_request(rollouts(10, failing=2, first=10))
    got = derive(stage, tail, ours, theirs)
    assert sum(p.point.count for p in got[semconv.METRIC_ROLLOUT_DURATION]) == 20
    failed = [
        (p.resource[semconv.SERVICE_NAME], p.attrs[semconv.ERROR_TYPE], p.point.as_int)
        for p in got[semconv.METRIC_VERIFY_COUNT]
        if p.attrs[semconv.VERIFY_SUCCEEDED] is False
    ]
    assert sorted(failed) == [
        (GYM_RESOURCES, "VerifierCrash", 2),
        ("nemo-gym/weather", "VerifierCrash", 2),
    ]
    assert sum(p.point.as_int for p in got[semconv.METRIC_VERIFY_COUNT]) == 20
