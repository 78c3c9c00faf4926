"""The gate on Gym's own telemetry: one scope (``nemo.lens.helpers``) carries every span
group, so the gate removes single spans from its blocks by span name, counts them per
group as it counts whole blocks, and writes out what upb would parse without them."""

from __future__ import annotations

import asyncio
from collections import Counter

import gym_telemetry_semconv as semconv
from gym_sidecar.core.producers import SPLIT_SCOPES
from gym_sidecar.core.stage import Batch, pipeline_trace_scan
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.stage import build_gate_stage
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.spans import SCAN_SPEC
from gym_sidecar.metrics.stage import build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_semconv import gym_dialect
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import parsed, trace_batch
from testkit.rollout_requests import (
    GYM_AGENT,
    GYM_MODEL,
    GYM_RESOURCES,
    Rollout,
    gym_dialect_request,
)
from tests.support.collect_stage import CollectStage

LENS = gym_dialect.SCOPE_LENS_HELPERS
COUNTER = "gym_sidecar_span_group_dropped_spans_total"
T0 = 1_700_000_000_000_000_000


def sample(metrics: SelfMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def names(req: ExportTraceServiceRequest) -> Counter[tuple[str, str, str]]:
    """(service, scope, span name) -> spans left."""
    out: Counter[tuple[str, str, str]] = Counter()
    for rs in req.resource_spans:
        service = next(
            kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"
        )
        for ss in rs.scope_spans:
            for span in ss.spans:
                out[(service, ss.scope.name, span.name)] += 1
    return out


def gate(spec: str, batch: Batch) -> tuple[SelfMetrics, CollectStage]:
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    stage = build_gate_stage(SpanGroupsConfig(spec=spec), sink, metrics)
    asyncio.run(stage.consume(batch))
    return metrics, sink


def test_the_gate_declares_the_split_scopes_and_the_pipeline_merges_them() -> None:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    gate_stage = build_gate_stage(SpanGroupsConfig(), tail, metrics)
    derive = build_derive_stage(MetricsConfig(), gate_stage, metrics, gate_stage.enabled_groups)
    spec = pipeline_trace_scan(derive)
    assert spec.split_scopes == SPLIT_SCOPES == frozenset({LENS})
    assert (spec.derive_scopes, spec.attr_keys, spec.event_keys) == (
        SCAN_SPEC.derive_scopes,
        SCAN_SPEC.attr_keys,
        SCAN_SPEC.event_keys,
    )
    # without the derive stage the gate's split scopes still reach the scanner
    assert pipeline_trace_scan(gate_stage).split_scopes == SPLIT_SCOPES
    assert pipeline_trace_scan(gate_stage).derive_scopes == frozenset()


def test_default_policy_keeps_rollouts_and_drops_verify_agent_and_model_spans() -> None:
    rollouts = [Rollout(f"{i}-0", T0 + i, 900.0, verify_ok=i % 4 != 3) for i in range(8)]
    req = gym_dialect_request(rollouts)
    want = names(req)
    batch = trace_batch(req)
    items = batch.items
    metrics, sink = gate("default", batch)
    assert sink.batches == [batch]
    out = names(parsed(batch.message))
    # rollout (on), server (on, the FastAPI instrumentor's scope), http_client (on, nemo.gym)
    for key, n in want.items():
        _, scope, name = key
        dropped = scope == LENS and name != semconv.SPAN_ROLLOUT
        assert out.get(key, 0) == (0 if dropped else n), key
    assert out[(GYM_AGENT, LENS, semconv.SPAN_ROLLOUT)] == 8
    agent = GYM_AGENT
    assert sample(metrics, COUNTER, group="verify", service=GYM_RESOURCES, mode="metrics") == 8
    # model_call: metrics mode by default since issue 41 (derived, then dropped)
    assert sample(metrics, COUNTER, group="model_call", service=GYM_MODEL, mode="metrics") == 8
    assert sample(metrics, COUNTER, group="agent", service=agent, mode="off") == 8
    assert batch.items == items - 24
    # The resources server's and the model's Lens blocks emptied: gone; the agent's kept.
    scopes = [
        (
            next(
                kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"
            ),
            ss.scope.name,
        )
        for rs in parsed(batch.message).resource_spans
        for ss in rs.scope_spans
    ]
    assert (GYM_AGENT, LENS) in scopes
    assert (GYM_RESOURCES, LENS) not in scopes and (GYM_MODEL, LENS) not in scopes


def test_spans_of_one_lens_block_are_removed_one_by_one() -> None:
    """A block holding a rollout, an agent span and a sandbox span: ``rollout,agent``
    keeps the first two in their order and drops the third, nothing else changes."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "svc"
    ss = rs.scope_spans.add()
    ss.scope.name = LENS
    ss.schema_url = "https://opentelemetry.io/schemas/1.27.0"
    for name in (
        semconv.SPAN_AGENT_RESPONSES,
        "gym.sandbox.exec",
        semconv.SPAN_ROLLOUT,
        "nemo_rl.step",  # not Gym's: in no group, never gated
    ):
        ss.spans.add(name=name, trace_id=b"\x01" * 16, span_id=name.encode()[:8].ljust(8, b"_"))
    batch = trace_batch(req)
    metrics, _ = gate("server,http_client,rollout,agent", batch)
    want = ExportTraceServiceRequest()
    want.CopyFrom(req)
    kept = [s for s in want.resource_spans[0].scope_spans[0].spans if s.name != "gym.sandbox.exec"]
    del want.resource_spans[0].scope_spans[0].spans[:]
    want.resource_spans[0].scope_spans[0].spans.extend(kept)
    assert parsed(batch.message) == want
    assert batch.items == 3
    assert sample(metrics, COUNTER, group="sandbox", service="svc", mode="off") == 1


def test_a_configured_scope_group_gates_the_lens_block_whole() -> None:
    """``scope_groups`` may map Gym's scope to one group (the operator's choice): the
    block is then gated whole, as any mapped scope."""
    req = gym_dialect_request([Rollout("0-0", T0, 900.0)])
    batch = trace_batch(req)
    metrics = SelfMetrics()
    sink = CollectStage(metrics)
    cfg = SpanGroupsConfig(spec="default", scope_groups={LENS: semconv.GROUP_SANDBOX})
    asyncio.run(build_gate_stage(cfg, sink, metrics).consume(batch))
    assert not any(scope == LENS for _, scope, _ in names(parsed(batch.message)))
    assert sample(metrics, COUNTER, group="sandbox", service=GYM_AGENT, mode="off") == 2
