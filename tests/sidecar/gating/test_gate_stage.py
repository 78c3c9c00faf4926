"""The gate stage on real OTLP requests (their wire view, as the receivers hand them on):
whole ScopeSpans blocks dropped and counted."""

from __future__ import annotations

import asyncio

import gym_telemetry_semconv as semconv
from gym_sidecar.core.stage import Batch, Signal, Stage
from gym_sidecar.gating.config import Mode, ServiceOverride, SpanGroupsConfig
from gym_sidecar.gating.stage import build_gate_stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import add_resource, parsed, trace_batch
from tests.sidecar.gating.helpers import scope_counts
from tests.support.collect_stage import CollectStage

VERIFY = semconv.scope_name(semconv.GROUP_VERIFY)
ROLLOUT = semconv.scope_name(semconv.GROUP_ROLLOUT)
SANDBOX = semconv.scope_name(semconv.GROUP_SANDBOX)


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def run(stage: Stage, batch: Batch) -> None:
    asyncio.run(stage.consume(batch))


def test_drops_off_and_metrics_groups_per_service() -> None:
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    cfg = SpanGroupsConfig(
        spec="default,verify",
        modes={semconv.GROUP_VERIFY: Mode.METRICS},
        services={"res-2": ServiceOverride(modes={semconv.GROUP_VERIFY: Mode.ON})},
    )
    stage = build_gate_stage(cfg, sink, metrics)
    req = ExportTraceServiceRequest()
    add_resource(req, "res-1", {VERIFY: 3, ROLLOUT: 2, SANDBOX: 4, "my.lib": 1})
    add_resource(req, "res-2", {VERIFY: 5, SANDBOX: 1})
    add_resource(req, "res-3", {SANDBOX: 2})  # becomes empty: removed
    add_resource(req, None, {"fastapi": 2, "opentelemetry.instrumentation.aiohttp_client": 1})
    batch = trace_batch(req)
    assert batch.items == 21
    run(stage, batch)

    out = parsed(batch.message)
    assert scope_counts(out) == {
        ("res-1", ROLLOUT): 2,
        ("res-1", "my.lib"): 1,  # unknown scopes are never gated
        ("res-2", VERIFY): 5,
        (None, "fastapi"): 2,
        (None, "opentelemetry.instrumentation.aiohttp_client"): 1,
    }
    assert len(out.resource_spans) == 3
    assert batch.items == 21 - 3 - 4 - 1 - 2
    assert sink.batches == [batch]
    counter = "gym_sidecar_span_group_dropped_spans_total"
    assert sample(metrics, counter, group="verify", service="res-1", mode="metrics") == 3
    assert sample(metrics, counter, group="sandbox", service="res-1", mode="off") == 4
    assert sample(metrics, counter, group="sandbox", service="res-2", mode="off") == 1
    assert sample(metrics, counter, group="sandbox", service="res-3", mode="off") == 2
    assert (
        sample(
            metrics,
            "gym_sidecar_stage_items_total",
            stage="gate",
            signal="traces",
            outcome="dropped",
        )
        == 10
    )


def test_third_party_scopes_map_to_server_and_http_client() -> None:
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    stage = build_gate_stage(SpanGroupsConfig(spec="rollout,verify"), sink, metrics)
    req = ExportTraceServiceRequest()
    scopes = {
        "fastapi": 4,
        "opentelemetry.instrumentation.fastapi": 1,
        "opentelemetry.instrumentation.asgi": 2,
        "opentelemetry.instrumentation.aiohttp_client": 3,
        ROLLOUT: 1,
    }
    add_resource(req, "agent", scopes)
    batch = trace_batch(req)
    run(stage, batch)
    assert scope_counts(parsed(batch.message)) == {("agent", ROLLOUT): 1}
    counter = "gym_sidecar_span_group_dropped_spans_total"
    assert sample(metrics, counter, group="server", service="agent", mode="off") == 7
    # http_client feeds gym.http.client.* (issue 41): unselected, it is in metrics mode
    assert sample(metrics, counter, group="http_client", service="agent", mode="metrics") == 3


def test_all_dropped_batch_is_not_forwarded_and_other_signals_pass() -> None:
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    stage = build_gate_stage(SpanGroupsConfig(spec="none"), sink, metrics)
    req = ExportTraceServiceRequest()
    add_resource(req, "svc", {VERIFY: 2})
    batch = trace_batch(req)
    run(stage, batch)
    assert batch.items == 0 and sink.batches == []
    other = Batch(Signal.METRICS, ExportMetricsServiceRequest(), items=5)
    run(stage, other)
    assert sink.batches == [other] and other.items == 5


def test_policy_swap_takes_effect_on_next_batch_and_services_past_the_cap() -> None:
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    stage = build_gate_stage(SpanGroupsConfig(spec="all", max_services=1), sink, metrics)
    req = ExportTraceServiceRequest()
    add_resource(req, "a", {VERIFY: 1})
    batch = trace_batch(req)
    run(stage, batch)
    assert scope_counts(parsed(batch.message)) == {("a", VERIFY): 1}
    assert batch.message.SerializeToString() is batch.message.raw  # nothing dropped

    stage.state.replace_policy(SpanGroupsConfig(spec="default,-verify").policy())
    req = ExportTraceServiceRequest()
    add_resource(req, "a", {VERIFY: 1})
    add_resource(req, "b", {VERIFY: 2})
    batch = trace_batch(req)
    run(stage, batch)
    assert batch.items == 0 and len(sink.batches) == 1  # the first batch only
    assert scope_counts(parsed(batch.message)) == {}
    counter = "gym_sidecar_span_group_dropped_spans_total"
    assert sample(metrics, counter, group="verify", service="a", mode="off") == 1
    assert sample(metrics, counter, group="verify", service="_other", mode="off") == 2


def test_configured_scope_groups_extend_the_table() -> None:
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    cfg = SpanGroupsConfig.model_validate(
        {"spec": "default", "scope_groups": {"my.sandbox.client": "sandbox"}}
    )
    stage = build_gate_stage(cfg, sink, metrics)
    req = ExportTraceServiceRequest()
    add_resource(req, "svc", {"my.sandbox.client": 2, "my.other.lib": 1, ROLLOUT: 1})
    batch = trace_batch(req)
    run(stage, batch)
    assert scope_counts(parsed(batch.message)) == {("svc", "my.other.lib"): 1, ("svc", ROLLOUT): 1}


def test_service_names_are_cached_per_resource_bytes_and_bounded() -> None:
    from gym_sidecar.gating.stage import ServiceNames
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    def resource(*attrs: tuple[str, AnyValue]) -> bytes:
        return Resource(attributes=[KeyValue(key=k, value=v) for k, v in attrs]).SerializeToString()

    names = ServiceNames(max_entries=2, max_resource_bytes=64)
    svc = AnyValue(string_value="svc")
    assert names(resource(("k", svc), ("service.name", svc))) == "svc"
    assert names(resource(("service.name", AnyValue(int_value=3)))) is None  # not a string
    assert names(resource(("service.name", svc), ("service.name", AnyValue()))) == "svc"  # first
    assert names(b"") is None
    assert len(names._cache) == 2  # emptied when full, then refilled
    big = resource(("service.name", svc), ("pad", AnyValue(string_value="x" * 100)))
    assert names(big) == "svc" and big not in names._cache
