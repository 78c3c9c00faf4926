"""OTLP requests for the store tests: Gym-shaped traces (from this project's agent, and
from Gym's own telemetry) and gym.* metric points."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import gym_dialect
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from testkit.otlp_samples import set_attrs

AGENT = "nemo-gym/simple_agent"
RESOURCES = "nemo-gym/weather"


@dataclass
class Rollout:
    """One rollout's spans across two services: agent /run -> rollout -> client -> verify."""

    rollout_id: str
    start_ns: int
    duration_ms: float
    verify_ok: bool = True
    trace_id: bytes = field(default_factory=lambda: os.urandom(16))
    pad: str = ""
    """Added as an attribute to every span (to make rows big)."""
    extra_spans: int = 0
    """Further server-scope spans under the agent's /run span (a real Gym rollout has
    about 18 spans, 2 of them gym.rollout and gym.verify)."""


def _span(ss: object, trace_id: bytes, parent: bytes, name: str, start: int, end: int) -> Span:
    span: Span = ss.spans.add()  # type: ignore[attr-defined]
    span.trace_id = trace_id
    span.span_id = os.urandom(8)
    span.parent_span_id = parent
    span.name = name
    span.start_time_unix_nano = start
    span.end_time_unix_nano = end
    return span


def trace_request(rollouts: list[Rollout]) -> ExportTraceServiceRequest:
    """Two ResourceSpans (agent, resources server) holding every rollout's spans."""
    req = ExportTraceServiceRequest()
    agent = req.resource_spans.add()
    set_attrs(agent.resource.attributes, {semconv.SERVICE_NAME: AGENT})
    agent_rollout = agent.scope_spans.add()
    agent_rollout.scope.name = semconv.scope_name(semconv.GROUP_ROLLOUT)
    agent_server = agent.scope_spans.add()
    agent_server.scope.name = semconv.scope_name(semconv.GROUP_SERVER)
    res = req.resource_spans.add()
    set_attrs(res.resource.attributes, {semconv.SERVICE_NAME: RESOURCES})
    res_server = res.scope_spans.add()
    res_server.scope.name = semconv.scope_name(semconv.GROUP_SERVER)
    res_verify = res.scope_spans.add()
    res_verify.scope.name = semconv.scope_name(semconv.GROUP_VERIFY)
    for r in rollouts:
        end = r.start_ns + int(r.duration_ms * 1e6)
        extra = {"pad": r.pad} if r.pad else {}
        run = _span(agent_server, r.trace_id, b"", "POST /run", r.start_ns, end + 1000)
        run.kind = Span.SpanKind.SPAN_KIND_SERVER
        set_attrs(run.attributes, {"http.route": "/run", **extra})
        for i in range(r.extra_spans):
            child = _span(agent_server, r.trace_id, run.span_id, f"POST /s{i}", r.start_ns, end)
            child.kind = Span.SpanKind.SPAN_KIND_CLIENT
            set_attrs(child.attributes, {"http.request.method": "POST", "url.path": f"/s{i}"})
        rollout = _span(
            agent_rollout, r.trace_id, run.span_id, semconv.SPAN_ROLLOUT, r.start_ns, end
        )
        set_attrs(rollout.attributes, {semconv.ROLLOUT_ID: r.rollout_id, **extra})
        if not r.verify_ok:
            rollout.status.code = Status.STATUS_CODE_ERROR
        call = _span(
            agent_server, r.trace_id, rollout.span_id, "POST /verify", end - 2_000_000, end
        )
        call.kind = Span.SpanKind.SPAN_KIND_CLIENT
        verify_route = _span(
            res_server, r.trace_id, call.span_id, "POST /verify", end - 1_900_000, end - 100_000
        )
        verify_route.kind = Span.SpanKind.SPAN_KIND_SERVER
        set_attrs(verify_route.attributes, {"http.route": "/verify", **extra})
        verify = _span(
            res_verify,
            r.trace_id,
            verify_route.span_id,
            semconv.SPAN_VERIFY,
            end - 1_500_000,
            end - 500_000,
        )
        set_attrs(
            verify.attributes,
            {semconv.ROLLOUT_ID: r.rollout_id, semconv.VERIFY_SUCCEEDED: r.verify_ok, **extra},
        )
        if not r.verify_ok:
            verify.status.code = Status.STATUS_CODE_ERROR
            verify.status.message = "VerifierCrash: on purpose"
            set_attrs(verify.attributes, {semconv.ERROR_TYPE: "VerifierCrash"})
    return req


def histogram_request(
    name: str,
    bounds: list[float],
    counts: list[int],
    start_ns: int,
    time_ns: int,
    temporality: int = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE,
    service: str = RESOURCES,
    extremes: tuple[float, float] | None = None,
) -> ExportMetricsServiceRequest:
    """One histogram point of ``name`` plus a non-gym gauge (which the store skips);
    ``extremes``: the point's ``min`` and ``max``."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    set_attrs(rm.resource.attributes, {semconv.SERVICE_NAME: service})
    sm = rm.scope_metrics.add()
    m = sm.metrics.add()
    m.name = name
    m.histogram.aggregation_temporality = temporality  # type: ignore[assignment]
    dp = m.histogram.data_points.add()
    dp.start_time_unix_nano = start_ns
    dp.time_unix_nano = time_ns
    dp.count = sum(counts)
    dp.explicit_bounds.extend(bounds)
    dp.bucket_counts.extend(counts)
    if extremes is not None:
        dp.min, dp.max = extremes
    other = sm.metrics.add()
    other.name = "process.cpu.time"
    other.gauge.data_points.add().as_double = 1.0
    return req


def count_request(ok: int, failed: int, start_ns: int, time_ns: int) -> ExportMetricsServiceRequest:
    """Cumulative ``gym.verify.count`` split by ``succeeded``."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    set_attrs(rm.resource.attributes, {semconv.SERVICE_NAME: RESOURCES})
    m = rm.scope_metrics.add().metrics.add()
    m.name = semconv.METRIC_VERIFY_COUNT
    m.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE  # type: ignore[assignment]
    m.sum.is_monotonic = True
    for succeeded, n in ((True, ok), (False, failed)):
        dp = m.sum.data_points.add()
        set_attrs(dp.attributes, {semconv.VERIFY_SUCCEEDED: succeeded})
        dp.start_time_unix_nano = start_ns
        dp.time_unix_nano = time_ns
        dp.as_int = n
    return req


GYM_AGENT = "nemo-gym/failing_weather_simple_agent"
GYM_RESOURCES = "nemo-gym/failing_weather"
GYM_MODEL = "nemo-gym/policy_model"
FASTAPI_SCOPE = "opentelemetry.instrumentation.fastapi"


def _scope(rs: object, name: str) -> object:
    ss = rs.scope_spans.add()  # type: ignore[attr-defined]
    ss.scope.name = name
    return ss


def _exception(span: Span, exception_type: str, message: str) -> None:
    span.status.code = Status.STATUS_CODE_ERROR
    span.status.message = message
    event = span.events.add(
        name=gym_dialect.EXCEPTION_EVENT, time_unix_nano=span.end_time_unix_nano
    )
    set_attrs(
        event.attributes,
        {
            gym_dialect.EXCEPTION_TYPE: exception_type,
            "exception.message": message,
            "exception.escaped": "False",
        },
    )


def gym_dialect_request(rollouts: list[Rollout]) -> ExportTraceServiceRequest:
    """What Gym 0.7.0's own telemetry (``per_rollout``) exports for these rollouts, shaped
    as captured from a real run (``testkit.gym_fleet``): per service one resource;
    SERVER spans (and their ``http receive``/``http send`` children) in the FastAPI
    instrumentor's scope; ``gym.rollout``, ``gym.agent.responses``, ``gym.verify``,
    ``gym.model.responses`` all in ``nemo.lens.helpers``; the agent's hops as CLIENT
    ``HTTP POST`` in ``nemo.gym``; no rollout id (Gym's ``observability_enabled`` off);
    a failed verification as ERROR plus an ``exception`` event
    (``__main__.VerifierCrash``), its rollout likewise (the agent's
    ``ClientResponseError``)."""
    req = ExportTraceServiceRequest()
    services = {}
    for service, server_type in (
        (GYM_AGENT, "responses_api_agents"),
        (GYM_RESOURCES, "resources_servers"),
        (GYM_MODEL, "responses_api_models"),
    ):
        rs = req.resource_spans.add()
        set_attrs(
            rs.resource.attributes,
            {
                semconv.SERVICE_NAME: service,
                semconv.SERVER_NAME: service.split("/", 1)[1],
                semconv.SERVER_TYPE: server_type,
                gym_dialect.SERVICE_GROUP: "nemo-gym",
                gym_dialect.DL_RANK: 0,
            },
        )
        services[service] = (
            _scope(rs, FASTAPI_SCOPE),
            _scope(rs, gym_dialect.SCOPE_LENS_HELPERS),
            _scope(rs, gym_dialect.SCOPE_GYM_CLIENT),
        )
    agent_server, agent_lens, agent_client = services[GYM_AGENT]
    res_server, res_lens, _ = services[GYM_RESOURCES]
    model_server, model_lens, _ = services[GYM_MODEL]
    internal = Span.SpanKind.SPAN_KIND_INTERNAL
    for r in rollouts:
        t, start = r.trace_id, r.start_ns
        end = start + int(r.duration_ms * 1e6)
        run = _span(agent_server, t, b"", "POST /run", start, end + 1000)
        run.kind = Span.SpanKind.SPAN_KIND_SERVER
        set_attrs(run.attributes, {"http.route": "/run", "http.response.status_code": 200})
        _span(agent_server, t, run.span_id, "POST /run http send", end, end + 500).kind = internal
        rollout = _span(agent_lens, t, run.span_id, semconv.SPAN_ROLLOUT, start + 10, end)
        rollout.kind = internal
        set_attrs(rollout.attributes, {semconv.SERVER_NAME: GYM_AGENT.split("/", 1)[1]})
        # /run -> the agent's own /v1/responses -> the model's /v1/responses
        hop = _span(agent_client, t, rollout.span_id, "HTTP POST", start + 20, start + 900_000)
        hop.kind = Span.SpanKind.SPAN_KIND_CLIENT
        responses = _span(
            agent_server, t, hop.span_id, "POST /v1/responses", start + 25, start + 890_000
        )
        responses.kind = Span.SpanKind.SPAN_KIND_SERVER
        agent_span = _span(
            agent_lens,
            t,
            responses.span_id,
            semconv.SPAN_AGENT_RESPONSES,
            start + 26,
            start + 880_000,
        )
        agent_span.kind = internal
        model_hop = _span(
            agent_client, t, agent_span.span_id, "HTTP POST", start + 27, start + 850_000
        )
        model_hop.kind = Span.SpanKind.SPAN_KIND_CLIENT
        model_route = _span(
            model_server, t, model_hop.span_id, "POST /v1/responses", start + 30, start + 800_000
        )
        model_route.kind = Span.SpanKind.SPAN_KIND_SERVER
        model_span = _span(
            model_lens,
            t,
            model_route.span_id,
            semconv.SPAN_MODEL_RESPONSES,
            start + 40,
            start + 700_000,
        )
        model_span.kind = internal
        call = _span(agent_client, t, rollout.span_id, "HTTP POST", end - 2_000_000, end)
        call.kind = Span.SpanKind.SPAN_KIND_CLIENT
        route = _span(res_server, t, call.span_id, "POST /verify", end - 1_900_000, end - 100_000)
        route.kind = Span.SpanKind.SPAN_KIND_SERVER
        verify = _span(
            res_lens, t, route.span_id, semconv.SPAN_VERIFY, end - 1_500_000, end - 500_000
        )
        verify.kind = internal
        set_attrs(verify.attributes, {semconv.SERVER_NAME: GYM_RESOURCES.split("/", 1)[1]})
        if not r.verify_ok:
            _exception(verify, "__main__.VerifierCrash", "verifier crashed on purpose")
            _exception(rollout, "aiohttp.client_exceptions.ClientResponseError", "500")
    return req
