"""Stores for the web-view and query-API tests, written the way the sidecar writes them.

:func:`write` inserts OTLP trace requests with :func:`gym_sidecar.store.db.insert` (the
writer thread's own call) at a chosen stored time, so tests control what has arrived
and when. :class:`SpanSpec` / :func:`request` build requests span by span; the
Gym-shaped rollouts of ``testkit/rollout_requests.py`` are reused for whole traces.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import gym_telemetry_semconv as semconv
from gym_sidecar.store import db
from gym_sidecar.store.rows import Truncation, trace_rows
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from testkit.otlp_samples import set_attrs


@dataclass
class SpanSpec:
    service: str
    name: str
    span_id: bytes
    parent: bytes = b""
    start_ns: int = 0
    end_ns: int = 0
    kind: int = Span.SpanKind.SPAN_KIND_INTERNAL
    scope: str = semconv.scope_name(semconv.GROUP_SERVER)
    attrs: Mapping[str, object] = field(default_factory=dict)
    error: str | None = None
    """Status ERROR with this message."""
    events: Sequence[tuple[str, Mapping[str, object]]] = ()
    resource: Mapping[str, object] = field(default_factory=dict)


def new_id(n: int = 8) -> bytes:
    return os.urandom(n)


def request(trace_id: bytes, specs: Sequence[SpanSpec]) -> bytes:
    """One serialized request with a ResourceSpans per (service, resource) and a
    ScopeSpans per scope."""
    req = ExportTraceServiceRequest()
    groups: dict[tuple[str, str], dict[str, object]] = {}
    for spec in specs:
        key = (spec.service, repr(sorted(spec.resource.items())))
        if key not in groups:
            rs = req.resource_spans.add()
            set_attrs(rs.resource.attributes, {semconv.SERVICE_NAME: spec.service, **spec.resource})
            groups[key] = {"rs": rs}
        group = groups[key]
        if spec.scope not in group:
            ss = group["rs"].scope_spans.add()  # type: ignore[attr-defined]
            ss.scope.name = spec.scope
            group[spec.scope] = ss
        span = group[spec.scope].spans.add()  # type: ignore[attr-defined]
        span.trace_id = trace_id
        span.span_id = spec.span_id
        span.parent_span_id = spec.parent
        span.name = spec.name
        span.kind = spec.kind
        span.start_time_unix_nano = spec.start_ns
        span.end_time_unix_nano = spec.end_ns
        set_attrs(span.attributes, spec.attrs)
        if spec.error is not None:
            span.status.code = Status.STATUS_CODE_ERROR
            span.status.message = spec.error
        for name, attrs in spec.events:
            ev = span.events.add()
            ev.name = name
            ev.time_unix_nano = spec.start_ns + 1000
            set_attrs(ev.attributes, attrs)
    return req.SerializeToString()


def write(path: Path, payloads: Sequence[bytes], stored_ns: int | None = None) -> None:
    """Insert ``payloads`` in one transaction, as stored at ``stored_ns`` (now)."""
    with closing(db.connect(path)) as conn:
        rows = [(p, trace_rows(p, Truncation(4096))) for p in payloads]
        db.insert(conn, rows, [], time.time_ns() if stored_ns is None else stored_ns)


AGENT = "nemo-gym/simple_agent"
MODEL = "nemo-gym/policy_model"
RESOURCES = "nemo-gym/weather"


def gym_trace(
    rollout_id: str,
    start_ns: int,
    *,
    fail_verify: bool = False,
    trace_id: bytes | None = None,
    agent: str = AGENT,
    reward: float | None = None,
    turns: int | None = None,
    tokens: tuple[int, int] | None = None,
    model_call: tuple[str, int, int] | None = None,
) -> tuple[bytes, list[SpanSpec]]:
    """A Gym-shaped rollout across three services: the agent's /run with its rollout span,
    a model call and the resources server's /verify (its verify span failing on request).
    The RL figures go on the rollout span (``reward``, ``turns``, ``tokens``), and on the
    verify span (``reward``, unless it fails); ``model_call`` = (model, input, output
    tokens) adds the model server's ``gym.model.responses`` span."""
    tid = trace_id or new_id(16)
    rl: dict[str, object] = {}
    if reward is not None:
        rl[semconv.REWARD] = reward
    if turns is not None:
        rl[semconv.ROLLOUT_TURNS] = turns
    if tokens is not None:
        rl[semconv.ROLLOUT_INPUT_TOKENS], rl[semconv.ROLLOUT_OUTPUT_TOKENS] = tokens
    ms = 1_000_000
    run, rollout, mcall, mserver, vcall, vserver, verify = (new_id() for _ in range(7))
    server = semconv.scope_name(semconv.GROUP_SERVER)
    client = semconv.scope_name(semconv.GROUP_HTTP_CLIENT)
    err = "VerifierCrash: on purpose" if fail_verify else None
    specs = [
        SpanSpec(
            agent,
            "POST /run",
            run,
            b"",
            start_ns,
            start_ns + 100 * ms,
            Span.SpanKind.SPAN_KIND_SERVER,
            server,
            {"http.route": "/run"},
            error="500" if fail_verify else None,
        ),
        SpanSpec(
            agent,
            semconv.SPAN_ROLLOUT,
            rollout,
            run,
            start_ns + ms,
            start_ns + 99 * ms,
            scope=semconv.scope_name(semconv.GROUP_ROLLOUT),
            attrs={semconv.ROLLOUT_ID: rollout_id, **rl},
            error=err,
        ),
        SpanSpec(
            agent,
            "POST /v1/responses",
            mcall,
            rollout,
            start_ns + 2 * ms,
            start_ns + 60 * ms,
            Span.SpanKind.SPAN_KIND_CLIENT,
            client,
            {"url.template": "/v1/responses"},
        ),
        SpanSpec(
            MODEL,
            "POST /v1/responses",
            mserver,
            mcall,
            start_ns + 3 * ms,
            start_ns + 59 * ms,
            Span.SpanKind.SPAN_KIND_SERVER,
            server,
            {"http.route": "/v1/responses"},
        ),
        SpanSpec(
            agent,
            "POST /verify",
            vcall,
            rollout,
            start_ns + 70 * ms,
            start_ns + 98 * ms,
            Span.SpanKind.SPAN_KIND_CLIENT,
            client,
            {"url.template": "/verify"},
            error="500" if fail_verify else None,
        ),
        SpanSpec(
            RESOURCES,
            "POST /verify",
            vserver,
            vcall,
            start_ns + 71 * ms,
            start_ns + 97 * ms,
            Span.SpanKind.SPAN_KIND_SERVER,
            server,
            {"http.route": "/verify"},
            error=err,
        ),
        SpanSpec(
            RESOURCES,
            semconv.SPAN_VERIFY,
            verify,
            vserver,
            start_ns + 72 * ms,
            start_ns + 96 * ms,
            scope=semconv.scope_name(semconv.GROUP_VERIFY),
            attrs={
                semconv.ROLLOUT_ID: rollout_id,
                semconv.VERIFY_SUCCEEDED: not fail_verify,
                **({semconv.ERROR_TYPE: "VerifierCrash"} if fail_verify else {}),
                **({semconv.REWARD: reward} if reward is not None and not fail_verify else {}),
            },
            error=err,
        ),
    ]
    if model_call is not None:
        model, tokens_in, tokens_out = model_call
        specs.append(
            SpanSpec(
                MODEL,
                semconv.SPAN_MODEL_RESPONSES,
                new_id(),
                mserver,
                start_ns + 4 * ms,
                start_ns + 58 * ms,
                scope=semconv.scope_name(semconv.GROUP_MODEL_CALL),
                attrs={
                    semconv.ROLLOUT_ID: rollout_id,
                    semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT,
                    semconv.GEN_AI_REQUEST_MODEL: model,
                    semconv.GEN_AI_USAGE_INPUT_TOKENS: tokens_in,
                    semconv.GEN_AI_USAGE_OUTPUT_TOKENS: tokens_out,
                },
            )
        )
    return tid, specs


def derived_metrics(payloads: Sequence[bytes]) -> bytes:
    """The derived metrics the sidecar's derive stage exports for these trace requests
    (cumulative), serialized: what the store receives from a running sidecar."""
    from gym_sidecar.metrics.config import MetricsConfig
    from gym_sidecar.metrics.derived import DerivedMetrics
    from gym_sidecar.metrics.otlp_request import build_request
    from gym_sidecar.metrics.spans import SpanDeriver

    from testkit.otlp_samples import trace_view

    store = DerivedMetrics(MetricsConfig())
    deriver = SpanDeriver(store)
    for payload in payloads:
        pending = deriver.extract(trace_view(payload))
        if pending is not None:
            deriver.record(pending)
    bounds = {
        semconv.METRIC_ROLLOUT_DURATION: store.rollout.bounds,
        semconv.METRIC_VERIFY_DURATION: store.verify.bounds,
        semconv.METRIC_ENV_STEP_DURATION: store.env_step.bounds,
        **{t.metric_names[0]: t.bounds for t in store.rl.histograms},
    }
    return build_request(store.collect(), bounds).SerializeToString()


def write_points(path: Path, metrics_payload: bytes, stored_ns: int | None = None) -> None:
    """Insert the points of a serialized metrics request, as the store's writer does."""
    from gym_sidecar.store.rows import point_rows

    with closing(db.connect(path)) as conn:
        db.insert(conn, [], point_rows(metrics_payload), stored_ns or time.time_ns())
