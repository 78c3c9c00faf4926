"""Build OTLP trace requests shaped like Gym traffic, for the derive-stage tests."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from testkit.otlp_samples import set_attrs

T0_NS = 1_700_000_000_000_000_000
"""A fixed start time for spans (2023-11-14)."""

RESOURCE = {
    semconv.SERVICE_NAME: "math_with_judge",
    semconv.SERVER_NAME: "math_with_judge",
    semconv.SERVER_TYPE: "resources",
}


@dataclass
class SpanSpec:
    name: str
    duration_ms: float
    attrs: dict[str, object] = field(default_factory=dict)
    error: bool = False
    start_ns: int = T0_NS
    trace_id: bytes = field(default_factory=lambda: os.urandom(16))
    span_id: bytes = field(default_factory=lambda: os.urandom(8))


def rollout(duration_ms: float, **kw: object) -> SpanSpec:
    return SpanSpec(
        semconv.SPAN_ROLLOUT,
        duration_ms,
        {semconv.ROLLOUT_ID: "7-0"},
        **kw,  # type: ignore[arg-type]
    )


def verify(
    duration_ms: float,
    *,
    succeeded: bool | None = True,
    error_type: str | None = None,
    reward: float = 1.0,
    **kw: object,
) -> SpanSpec:
    attrs: dict[str, object] = {semconv.ROLLOUT_ID: "7-0", "reward": reward}
    if succeeded is not None:
        attrs[semconv.VERIFY_SUCCEEDED] = succeeded
    if error_type is not None:
        attrs[semconv.ERROR_TYPE] = error_type
    return SpanSpec(semconv.SPAN_VERIFY, duration_ms, attrs, error=error_type is not None, **kw)  # type: ignore[arg-type]


def add_span(scope_spans: object, spec: SpanSpec) -> Span:
    sp: Span = scope_spans.spans.add()  # type: ignore[attr-defined]
    sp.name = spec.name
    sp.trace_id = spec.trace_id
    sp.span_id = spec.span_id
    sp.kind = Span.SPAN_KIND_INTERNAL
    sp.start_time_unix_nano = spec.start_ns
    sp.end_time_unix_nano = spec.start_ns + int(spec.duration_ms * 1_000_000)
    set_attrs(sp.attributes, spec.attrs)
    if spec.error:
        sp.status.code = Status.STATUS_CODE_ERROR
    return sp


def add_resource(
    req: ExportTraceServiceRequest,
    scopes: Mapping[str, Sequence[SpanSpec]],
    resource: Mapping[str, object] = RESOURCE,
) -> ResourceSpans:
    rs = req.resource_spans.add()
    set_attrs(rs.resource.attributes, resource)
    for scope, specs in scopes.items():
        ss = rs.scope_spans.add()
        ss.scope.name = scope
        for spec in specs:
            add_span(ss, spec)
    return rs


def request(
    scopes: Mapping[str, Sequence[SpanSpec]], resource: Mapping[str, object] = RESOURCE
) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    add_resource(req, scopes, resource)
    return req


ROLLOUT_SCOPE = semconv.scope_name(semconv.GROUP_ROLLOUT)
VERIFY_SCOPE = semconv.scope_name(semconv.GROUP_VERIFY)
SERVER_SCOPE = semconv.scope_name(semconv.GROUP_SERVER)
