"""The trace pipeline on the wire view writes out what it wrote when it worked on parsed
protobuf messages.

For requests hypothesis writes at the wire level (``wire/protobuf/wire_requests.py``: several
resources, repeated ``resource`` fields, unknown fields at every level, schema URLs,
empty and absent resources, ...), enrich -> derive -> gate runs on the scanned request,
and the reference -- the pipeline as it was before the wire view, on the upb message:
the enricher's protobuf path on each resource, then the gate's old loop deleting
ScopeSpans and emptied ResourceSpans (and, in a scope that carries several span groups,
the spans of dropped groups, then the ScopeSpans they emptied) -- runs on the parsed
request. The bytes the
pipeline hands on must parse, and parse to the reference's message (upb's equality:
every field, unknown fields included, in any order); whether the batch goes on at all
and how many spans it holds must agree; a request no stage changed goes on as the
bytes received.
"""

from __future__ import annotations

import asyncio
from typing import Any

import gym_telemetry_semconv as semconv
from gym_sidecar.core.stage import Signal
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.enrich.enricher import Enricher
from gym_sidecar.enrich.stage import EnrichStage
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.stage import GateStage, build_gate_stage
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.stage import build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import trace_batch
from tests.sidecar.wire.protobuf.wire_requests import trace_requests
from tests.support.collect_stage import CollectStage

ENRICH = {
    "nothing": {},
    "adds keys": {"attributes": {"deployment.environment.name": "ci", "team": "rl"}},
    "overwrites keys": {
        "attributes": {semconv.SERVICE_NAME: "svc-b", "team": "rl"},
        "overwrite": {"keys": [semconv.SERVICE_NAME, "team"]},
    },
    "names the unnamed": {"attributes": {semconv.SERVICE_NAME: "svc-a"}},
}
SPAN_GROUPS = {
    "all": {"spec": "all"},
    "default": {"spec": "default"},
    "rollout,verify": {"spec": "rollout,verify"},
    "none": {"spec": "none"},
    "per service": {"spec": "all", "services": {"svc-a": {"spec": "none"}}},
}


def enricher(name: str, metrics: SelfMetrics) -> Enricher:
    cfg = EnrichConfig.model_validate({"host": False, "docker": {"enabled": False}, **ENRICH[name]})
    return Enricher.from_config(cfg, metrics, {})


def reference(data: bytes, enrich: str, gate: GateStage) -> ExportTraceServiceRequest:
    """What the pipeline wrote before the wire view, from the parsed request."""
    req = ExportTraceServiceRequest.FromString(data)
    old = enricher(enrich, SelfMetrics())
    for rs in req.resource_spans:
        # The enricher's protobuf path, as traces took it: resource.CopyFrom(enriched)
        # when the enrichment changed it (a metrics request carries the resource there).
        carrier = ExportMetricsServiceRequest()
        rm = carrier.resource_metrics.add()
        if rs.HasField("resource"):
            rm.resource.CopyFrom(rs.resource)
        old.enrich(carrier, None)
        if rm.HasField("resource"):
            rs.resource.CopyFrom(rm.resource)
    policy, scopes = gate.state.policy, gate.state.scopes
    empty = []
    for ri, rs in enumerate(req.resource_spans):  # the gate's loop before the wire view
        service = None
        for kv in rs.resource.attributes:
            if kv.key == semconv.SERVICE_NAME:
                has = kv.value.HasField("string_value")
                service = kv.value.string_value if has else None
                break
        groups = policy.for_service(service)
        if not groups.drop:
            continue
        doomed = []
        for si, ss in enumerate(rs.scope_spans):
            group = scopes.group(ss.scope.name)
            role = scopes.split(ss.scope.name) if group is None else None
            if role is not None:  # several groups in one scope: by span name
                kept = [sp for sp in ss.spans if role.span(sp.name).group not in groups.drop]
                if len(kept) < len(ss.spans):
                    del ss.spans[:]
                    ss.spans.extend(kept)
                    if not kept:
                        doomed.append(si)
            elif group in groups.drop:
                doomed.append(si)
        for si in reversed(doomed):
            del rs.scope_spans[si]
        if not rs.scope_spans:
            empty.append(ri)
    for ri in reversed(empty):
        del req.resource_spans[ri]
    return req


def run_pipeline(data: bytes, enrich: str, span_groups: str) -> tuple[Any, GateStage, int]:
    """enrich -> derive -> gate -> collect, wired as ``build_pipeline`` wires them; the
    batch handed on (None if it ended in the gate), the gate, and its items."""
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    gate = build_gate_stage(SpanGroupsConfig(**SPAN_GROUPS[span_groups]), tail, metrics)
    derive = build_derive_stage(MetricsConfig(), gate, metrics, gate.enabled_groups)
    head = EnrichStage(enricher(enrich, metrics), derive, metrics)
    batch = trace_batch(data, peer="10.0.0.9:4000")
    asyncio.run(head.consume(batch))
    assert tail.batches in ([], [batch])
    return (batch if tail.batches else None), gate, batch.items


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(trace_requests(), st.sampled_from(list(ENRICH)), st.sampled_from(list(SPAN_GROUPS)))
def test_the_wire_pipeline_writes_what_the_message_pipeline_wrote(
    data: bytes, enrich: str, span_groups: str
) -> None:
    forwarded, gate, items = run_pipeline(data, enrich, span_groups)
    expected = reference(data, enrich, gate)
    spans = sum(len(ss.spans) for rs in expected.resource_spans for ss in rs.scope_spans)
    assert items == spans
    # The gate ends a batch left with no span and no ResourceSpans, as it did.
    assert (forwarded is not None) == (spans > 0 or len(expected.resource_spans) > 0)
    if forwarded is None:
        return
    assert forwarded.signal is Signal.TRACES
    view = forwarded.message
    assert isinstance(view, TraceRequest)
    out = view.SerializeToString()
    assert ExportTraceServiceRequest.FromString(out) == expected
    # What the export queue keeps of a request nothing was removed from: its pieces.
    assert b"".join(view.parts()) == out
    received = ExportTraceServiceRequest.FromString(data)

    def shape(req: ExportTraceServiceRequest) -> list[list[int]]:
        """Spans per ScopeSpans per ResourceSpans (single spans leave split scopes)."""
        return [[len(ss.spans) for ss in rs.scope_spans] for rs in req.resource_spans]

    assert view.removed_nothing() == (shape(received) == shape(expected))
    if ExportTraceServiceRequest.FromString(data) == expected:
        untouched = all(b.resource_out is None and not b.edited for b in view.blocks)
        if untouched and not view.changed:
            assert out is data


def test_enrichment_overwrites_and_the_gate_sees_the_enriched_service() -> None:
    """The overwritten service.name decides the span groups, as before."""
    from testkit.otlp_samples import add_resource

    req = ExportTraceServiceRequest()
    add_resource(req, "svc-a", {semconv.scope_name(semconv.GROUP_SANDBOX): 2, "my.lib": 1})
    add_resource(req, None, {semconv.scope_name(semconv.GROUP_SANDBOX): 3})
    data = req.SerializeToString()
    forwarded, gate, items = run_pipeline(data, "overwrites keys", "per service")
    assert items == 6  # svc-a is svc-b now: nothing of it is gated
    assert ExportTraceServiceRequest.FromString(forwarded.message.SerializeToString()) == reference(
        data, "overwrites keys", gate
    )
    forwarded, gate, items = run_pipeline(data, "names the unnamed", "per service")
    assert items == 1  # svc-a drops everything it can name; the unnamed is svc-a now
    out = ExportTraceServiceRequest.FromString(forwarded.message.SerializeToString())
    assert [[ss.scope.name for ss in rs.scope_spans] for rs in out.resource_spans] == [["my.lib"]]
    assert out == reference(data, "names the unnamed", gate)
