"""One owner per metric name (``metrics.owned``): Gym's own in-process copies of the
derived names are renamed (default) or dropped, counted; everything else passes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gym_sidecar.configmodel import ValidationError
from gym_sidecar.core.signals import count_data_points
from gym_sidecar.core.stage import Batch, Signal
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.otlp_request import SCOPE_NAME
from gym_sidecar.metrics.stage import build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_semconv import gym_dialect
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from tests.support.collect_stage import CollectStage

GYM_METRICS = {
    gym_dialect.METRIC_ROLLOUT_DURATION: 2,
    gym_dialect.METRIC_VERIFY_DURATION: 1,
    gym_dialect.METRIC_VERIFY_SUCCESS_RATE: 1,
    gym_dialect.METRIC_ROLLOUT_COMPLETED: 2,
    "gym.servers.active": 1,
    "gym.sandbox.exec_duration_ms": 1,
    "http.server.request.duration": 3,
}


def request() -> ExportMetricsServiceRequest:
    """Gym's in-process metrics under Lens's scope, and a sidecar's derived ones."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.add(key="service.name").value.string_value = "nemo-gym/agent"
    lens = rm.scope_metrics.add()
    lens.scope.name = gym_dialect.METRIC_SCOPE
    for name, points in GYM_METRICS.items():
        metric = lens.metrics.add(name=name)
        for _ in range(points):
            metric.histogram.data_points.add(count=1)
    derived = rm.scope_metrics.add()
    derived.scope.name = SCOPE_NAME  # another sidecar's derived metrics: its own
    derived.metrics.add(name=gym_dialect.METRIC_ROLLOUT_DURATION).histogram.data_points.add()
    return req


def run(**owned: Any) -> tuple[Batch, SelfMetrics]:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    stage = build_derive_stage(MetricsConfig(owned=owned), tail, metrics)
    req = request()
    batch = Batch(Signal.METRICS, req, items=count_data_points(req))
    asyncio.run(stage.consume(batch))
    assert tail.batches == [batch]
    return batch, metrics


def names(batch: Batch) -> dict[str, list[str]]:
    assert isinstance(batch.message, ExportMetricsServiceRequest)
    return {
        sm.scope.name: [m.name for m in sm.metrics]
        for rm in batch.message.resource_metrics
        for sm in rm.scope_metrics
    }


def counted(metrics: SelfMetrics, action: str, prefix: str) -> float:
    labels = {"action": action, "prefix": prefix}
    return metrics.registry.get_sample_value("gym_sidecar_owned_metric_points_total", labels) or 0


def test_gym_copies_are_renamed_by_default() -> None:
    batch, metrics = run()
    assert names(batch) == {
        gym_dialect.METRIC_SCOPE: [
            "gym.inprocess.rollout.duration_ms",
            "gym.inprocess.verify.duration_ms",
            "gym.inprocess.verify.success_rate",
            "gym.inprocess.rollout.completed_total",
            "gym.servers.active",
            "gym.sandbox.exec_duration_ms",
            "http.server.request.duration",
        ],
        SCOPE_NAME: [gym_dialect.METRIC_ROLLOUT_DURATION],
    }
    assert batch.items == sum(GYM_METRICS.values()) + 1  # nothing lost
    assert counted(metrics, "rename", "gym.rollout.") == 4
    assert counted(metrics, "rename", "gym.verify.") == 2


def test_drop_removes_the_copies_and_their_points() -> None:
    batch, metrics = run(action="drop")
    assert names(batch)[gym_dialect.METRIC_SCOPE] == [
        "gym.servers.active",
        "gym.sandbox.exec_duration_ms",
        "http.server.request.duration",
    ]
    assert batch.items == 1 + 1 + 3 + 1
    assert counted(metrics, "drop", "gym.rollout.") == 4
    stage_dropped = metrics.registry.get_sample_value(
        "gym_sidecar_stage_items_total",
        {"stage": "derive", "signal": "metrics", "outcome": "dropped"},
    )
    assert stage_dropped == 6


def test_keep_and_a_narrower_namespace() -> None:
    batch, _ = run(action="keep")
    assert names(batch)[gym_dialect.METRIC_SCOPE] == list(GYM_METRICS)
    batch, metrics = run(prefixes=["gym.verify."], rename_prefix="gym_lens.")
    assert names(batch)[gym_dialect.METRIC_SCOPE][:3] == [
        gym_dialect.METRIC_ROLLOUT_DURATION,
        "gym_lens.verify.duration_ms",
        "gym_lens.verify.success_rate",
    ]
    assert counted(metrics, "rename", "gym.verify.") == 2


def test_an_empty_prefix_is_refused() -> None:
    with pytest.raises(ValidationError, match="must not be empty"):
        MetricsConfig(owned={"prefixes": ["gym.rollout.", ""]})
