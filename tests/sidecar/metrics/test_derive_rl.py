"""The RL view's derived metrics (issue 41): spans shaped as RL-DESIGN.md says the agent and
Gym's own telemetry write them, in; exact OTLP points and Prometheus samples out.

Pins the counting rules of issue 41 part 5: a model call counts once, at the model
server's ``gym.model.*`` span (not the hop that reached it, not ``gym.agent.responses``,
not the usage summed into ``/run``); ``gym.rollout.tokens`` comes from the rollout span's
totals; ``gym.verify.reward`` carries ``succeeded`` and the resources server's resource;
a verifier that raised gives no reward point; every rollout that ends, failed ones too,
gives its turns and tokens points.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.stage import Signal
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.stage import build_gate_stage
from gym_sidecar.metrics import fields
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.stage import DeriveStage, build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_semconv import gym_dialect
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client.parser import text_string_to_metric_families

from testkit.otlp_samples import parsed, set_attrs, trace_batch
from tests.sidecar.metrics.collect import Point, points
from tests.sidecar.metrics.traces import SpanSpec, add_resource, add_span
from tests.support.collect_stage import CollectStage

ROLLOUT = semconv.scope_name(semconv.GROUP_ROLLOUT)
VERIFY = semconv.scope_name(semconv.GROUP_VERIFY)
MODEL = semconv.scope_name(semconv.GROUP_MODEL_CALL)
HOPS = semconv.scope_name(semconv.GROUP_HTTP_CLIENT)
AGENT_SCOPE = semconv.scope_name(semconv.GROUP_AGENT)
SERVER = semconv.scope_name(semconv.GROUP_SERVER)


def resource(name: str, kind: str) -> dict[str, object]:
    return {
        semconv.SERVICE_NAME: f"nemo-gym/{name}",
        semconv.SERVER_NAME: name,
        semconv.SERVER_TYPE: kind,
    }


AGENT = resource("weather_agent", "agent")
RESOURCES = resource("weather", "resources")
MODEL_SERVER = resource("policy_model", "model")
GYM_MODEL_SERVER = resource("gym_model", "model")


def rollout(turns: Any = None, tokens: tuple[Any, Any] | None = None, **kw: Any) -> SpanSpec:
    attrs: dict[str, object] = {semconv.ROLLOUT_ID: "1-0"}
    if turns is not None:
        attrs[semconv.ROLLOUT_TURNS] = turns
    if tokens is not None:
        attrs[semconv.ROLLOUT_INPUT_TOKENS], attrs[semconv.ROLLOUT_OUTPUT_TOKENS] = tokens
    attrs.update(kw.pop("attrs", {}))
    return SpanSpec(semconv.SPAN_ROLLOUT, kw.pop("ms", 900.0), attrs, **kw)


def verify(reward: Any = None, succeeded: bool = True, **kw: Any) -> SpanSpec:
    attrs: dict[str, object] = {semconv.VERIFY_SUCCEEDED: succeeded}
    if reward is not None:
        attrs[semconv.REWARD] = reward
    if not succeeded:
        attrs[semconv.ERROR_TYPE] = kw.pop("error_type", "VerifierCrash")
    return SpanSpec(semconv.SPAN_VERIFY, 5.0, attrs, error=not succeeded, **kw)


def model_call(
    name: str = semconv.SPAN_MODEL_RESPONSES,
    ms: float = 150.0,
    model: str | None = "policy-7b",
    usage: tuple[int, int] | None = (13, 5),
    ttfc_s: float | None = None,
    error_type: str | None = None,
    operation: str | None = semconv.GEN_AI_OPERATION_CHAT,
) -> SpanSpec:
    attrs: dict[str, object] = {}
    if operation is not None:
        attrs[semconv.GEN_AI_OPERATION_NAME] = operation
    if model is not None:
        attrs[semconv.GEN_AI_REQUEST_MODEL] = model
    if usage is not None:
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS], attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = usage
    if ttfc_s is not None:
        attrs[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = ttfc_s
    if error_type is not None:
        attrs[semconv.ERROR_TYPE] = error_type
    return SpanSpec(name, ms, attrs, error=error_type is not None)


def hop(target: str | None, resends: int | None = None, error_type: str | None = None) -> SpanSpec:
    attrs: dict[str, object] = {"http.request.method": "POST"}
    if target is not None:
        attrs[semconv.TARGET_SERVER_NAME] = target
    if resends is not None:
        attrs[semconv.HTTP_REQUEST_RESEND_COUNT] = resends
    if error_type is not None:
        attrs[semconv.ERROR_TYPE] = error_type
    return SpanSpec("POST /v1/responses", 30.0, attrs, error=error_type is not None)


def request(*blocks: tuple[dict[str, object], dict[str, Sequence[SpanSpec]]]) -> Any:
    req = ExportTraceServiceRequest()
    for res, scopes in blocks:
        add_resource(req, scopes, res)
    return req


def pipeline(cfg: MetricsConfig | None = None, **span_groups: Any) -> tuple[DeriveStage, Any]:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    gate = build_gate_stage(SpanGroupsConfig(**span_groups), tail, metrics)
    stage = build_derive_stage(cfg or MetricsConfig(), gate, metrics, gate.enabled_groups)
    assert isinstance(stage, DeriveStage)
    return stage, tail


def derive(stage: DeriveStage, tail: Any, *requests: Any) -> dict[str, list[Point]]:
    async def go() -> None:
        for req in requests:
            await stage.consume(trace_batch(req))
        assert await stage.flush()

    asyncio.run(go())
    out: dict[str, list[Point]] = {}
    for req in tail.metric_requests():
        for point in points(req):
            out.setdefault(point.metric, []).append(point)
    return out


def by_attrs(found: list[Point]) -> dict[tuple[tuple[str, Any], ...], Any]:
    return {tuple(sorted(p.attrs.items())): p for p in found}


def test_verify_and_step_rewards() -> None:
    stage, tail = pipeline()
    got = derive(
        stage,
        tail,
        request(
            (
                RESOURCES,
                {
                    VERIFY: [
                        verify(1.0),
                        verify(1.0),
                        verify(0.0),  # judged wrong: the call still succeeded
                        verify(0.0, succeeded=False),  # a masked failure row with a reward
                        verify(None, succeeded=False),  # the verifier raised: no reward
                        verify(None),  # an answer without a numeric reward
                        SpanSpec(semconv.SPAN_ENV_STEP, 3.0, {semconv.REWARD: 0.25}),
                        SpanSpec(semconv.SPAN_ENV_STEP, 3.0, {semconv.REWARD: 2}),  # an int
                    ]
                },
            )
        ),
    )
    rewards = by_attrs(got[semconv.METRIC_VERIFY_REWARD])
    ok = rewards[((semconv.VERIFY_SUCCEEDED, True),)]
    failed = rewards[((semconv.VERIFY_SUCCEEDED, False),)]
    assert (ok.point.count, ok.point.sum, failed.point.count, failed.point.sum) == (3, 2.0, 1, 0.0)
    assert ok.unit == "1" and ok.kind == "histogram"
    assert ok.resource[semconv.SERVER_NAME] == "weather"  # the resources server's
    bounds = list(ok.point.explicit_bounds)
    assert ok.point.bucket_counts[bounds.index(0.0)] == 1  # reward 0 lands on bound 0
    assert ok.point.bucket_counts[bounds.index(1.0)] == 2
    assert ok.point.min == 0.0 and ok.point.max == 1.0
    [step] = got[semconv.METRIC_ENV_STEP_REWARD]
    assert (step.point.count, step.point.sum, step.attrs) == (2, 2.25, {})
    # exemplars carry the reward, not the span's duration
    assert {e.as_double for e in ok.point.exemplars} == {0.0, 1.0}


def test_rollout_turns_and_tokens_from_the_span_that_carries_them() -> None:
    stage, tail = pipeline()
    failed = rollout(turns=1, error=True)  # /run raised: turns, no usage
    got = derive(
        stage,
        tail,
        request(
            (
                AGENT,
                {
                    ROLLOUT: [
                        rollout(turns=2, tokens=(34, 13)),
                        rollout(turns=3, tokens=(55, 21)),
                        failed,
                        # a relayed /run: its nested span carries the figures
                        rollout(turns=2, tokens=(34, 13), attrs={semconv.ROLLOUT_NESTED: True}),
                        rollout(),  # the relaying rollout: none
                    ]
                },
            )
        ),
    )
    [turns] = got[semconv.METRIC_ROLLOUT_TURNS]
    assert (turns.point.count, turns.point.sum, turns.unit) == (4, 8.0, "{turn}")
    assert turns.resource[semconv.SERVER_NAME] == "weather_agent"
    tokens = by_attrs(got[semconv.METRIC_ROLLOUT_TOKENS])
    tokens_in = tokens[((semconv.GEN_AI_TOKEN_TYPE, "input"),)]
    tokens_out = tokens[((semconv.GEN_AI_TOKEN_TYPE, "output"),)]
    assert (tokens_in.point.count, tokens_in.point.sum) == (3, 123.0)
    assert (tokens_out.point.count, tokens_out.point.sum) == (3, 47.0)
    assert tokens_in.unit == "{token}"
    # the duration metric still counts the outermost rollouts only
    [duration] = got[semconv.METRIC_ROLLOUT_DURATION]
    assert duration.point.count == 4


def test_model_calls_count_once_at_the_model_server() -> None:
    """Usage and duration from the ``gym.model.*`` spans only: the agent's hop to the
    model, its ``gym.agent.responses`` relay and the rollout's summed usage give no
    GenAI point."""
    stage, tail = pipeline()
    relay = SpanSpec(semconv.SPAN_AGENT_RESPONSES, 200.0, {semconv.GEN_AI_USAGE_INPUT_TOKENS: 9})
    got = derive(
        stage,
        tail,
        request(
            (
                MODEL_SERVER,
                {
                    MODEL: [
                        model_call(ms=150.0),
                        model_call(ms=50.0, usage=(21, 8)),
                        model_call(semconv.SPAN_MODEL_CHAT, ms=300.0, usage=(7, 3), ttfc_s=0.125),
                        model_call(semconv.SPAN_MODEL_CHAT, ms=20.0, usage=None, error_type="500"),
                        model_call(semconv.SPAN_MODEL_MESSAGES, ms=80.0, model=None, usage=(1, 2)),
                    ],
                    SERVER: [SpanSpec("POST /v1/responses", 160.0)],
                },
            ),
            (
                AGENT,
                {
                    ROLLOUT: [rollout(turns=2, tokens=(34, 13))],
                    HOPS: [hop("policy_model"), hop("policy_model")],
                    AGENT_SCOPE: [relay],
                },
            ),
        ),
    )
    durations = by_attrs(got[semconv.METRIC_GEN_AI_OPERATION_DURATION])
    op = (semconv.GEN_AI_OPERATION_NAME, "chat")
    model = (semconv.GEN_AI_REQUEST_MODEL, "policy-7b")
    ok = durations[(op, model)]
    assert ok.unit == "s" and ok.resource[semconv.SERVER_NAME] == "policy_model"
    assert ok.point.count == 3
    assert ok.point.sum == pytest.approx(0.5)
    failed = durations[((semconv.ERROR_TYPE, "500"), op, model)]
    assert failed.point.count == 1 and failed.point.sum == pytest.approx(0.02)
    no_model = durations[(op,)]
    assert no_model.point.count == 1  # gen_ai.request.model left out when unknown
    assert sum(p.point.count for p in got[semconv.METRIC_GEN_AI_OPERATION_DURATION]) == 5
    bounds = list(ok.point.explicit_bounds)
    assert bounds == [
        0.01,
        0.02,
        0.04,
        0.08,
        0.16,
        0.32,
        0.64,
        1.28,
        2.56,
        5.12,
        10.24,
        20.48,
        40.96,
        81.92,
    ]
    usage = by_attrs(got[semconv.METRIC_GEN_AI_TOKEN_USAGE])
    tokens_in = usage[(op, model, (semconv.GEN_AI_TOKEN_TYPE, "input"))]
    tokens_out = usage[(op, model, (semconv.GEN_AI_TOKEN_TYPE, "output"))]
    assert (tokens_in.point.count, tokens_in.point.sum) == (3, 41.0)
    assert (tokens_out.point.count, tokens_out.point.sum) == (3, 16.0)
    assert tokens_in.unit == "{token}"
    assert list(tokens_in.point.explicit_bounds)[:4] == [1.0, 4.0, 16.0, 64.0]
    # every GenAI point is the model server's: none from the agent's spans
    for name in (semconv.METRIC_GEN_AI_TOKEN_USAGE, semconv.METRIC_GEN_AI_OPERATION_DURATION):
        assert {p.resource[semconv.SERVER_NAME] for p in got[name]} == {"policy_model"}
    [ttft] = got[semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN]
    assert (ttft.point.count, ttft.point.sum, ttft.attrs) == (1, 0.125, dict([op, model]))
    assert list(ttft.point.explicit_bounds)[:3] == [0.001, 0.005, 0.01]
    # no hop was retried or failed: no gym.http.client.* point
    assert semconv.METRIC_HTTP_CLIENT_RETRIES not in got
    assert semconv.METRIC_HTTP_CLIENT_TIMEOUTS not in got


def test_gym_own_model_spans_are_read_alike() -> None:
    """Gym's own telemetry (one Lens scope, no GenAI attributes, a failure as ERROR plus
    an exception event): durations with ``gen_ai.operation.name=chat`` and the failure's
    class name as ``error.type``; usage when a span carries it."""
    req = ExportTraceServiceRequest()
    ok = model_call(semconv.SPAN_MODEL_CHAT, ms=100.0, model=None, usage=None, operation=None)
    with_usage = model_call(ms=200.0, model=None, usage=(3, 4), operation=None)
    crash = model_call(ms=10.0, model=None, usage=None, operation=None)
    rs = add_resource(req, {}, GYM_MODEL_SERVER)
    ss = rs.scope_spans.add()
    ss.scope.name = gym_dialect.SCOPE_LENS_HELPERS
    add_span(ss, ok)
    add_span(ss, with_usage)
    failed: Span = add_span(ss, crash)
    failed.status.code = Status.STATUS_CODE_ERROR
    event = failed.events.add()
    event.name = gym_dialect.EXCEPTION_EVENT
    set_attrs(event.attributes, {gym_dialect.EXCEPTION_TYPE: "aiohttp.ClientResponseError"})
    stage, tail = pipeline()
    got = derive(stage, tail, req)
    durations = by_attrs(got[semconv.METRIC_GEN_AI_OPERATION_DURATION])
    op = (semconv.GEN_AI_OPERATION_NAME, "chat")
    assert durations[(op,)].point.count == 2
    assert durations[((semconv.ERROR_TYPE, "ClientResponseError"), op)].point.count == 1
    usage = by_attrs(got[semconv.METRIC_GEN_AI_TOKEN_USAGE])
    assert usage[(op, (semconv.GEN_AI_TOKEN_TYPE, "input"))].point.sum == 3.0


def test_retries_and_timeouts_per_target_server() -> None:
    stage, tail = pipeline()
    got = derive(
        stage,
        tail,
        request(
            (
                AGENT,
                {
                    HOPS: [
                        hop("weather"),
                        hop("weather", resends=2),
                        hop("weather", resends=1),
                        hop("policy_model", error_type=semconv.ERROR_TYPE_TIMEOUT),
                        hop("policy_model", resends=1, error_type=semconv.ERROR_TYPE_TIMEOUT),
                        hop("policy_model", error_type="500"),  # failed, not a timeout
                        hop(None, resends=4),  # a hop to no configured server
                    ]
                },
            )
        ),
    )
    retries = {
        p.attrs.get(semconv.TARGET_SERVER_NAME): p.point.as_int
        for p in got[semconv.METRIC_HTTP_CLIENT_RETRIES]
    }
    assert retries == {"weather": 3, "policy_model": 1, None: 4}
    timeouts = {
        p.attrs.get(semconv.TARGET_SERVER_NAME): p.point.as_int
        for p in got[semconv.METRIC_HTTP_CLIENT_TIMEOUTS]
    }
    assert timeouts == {"policy_model": 2}
    for p in got[semconv.METRIC_HTTP_CLIENT_RETRIES] + got[semconv.METRIC_HTTP_CLIENT_TIMEOUTS]:
        assert p.kind == "sum" and p.point.start_time_unix_nano > 0
        assert p.resource[semconv.SERVER_NAME] == "weather_agent"  # the client's


def test_sums_are_deltas_in_delta_temporality() -> None:
    stage, tail = pipeline(MetricsConfig(temporality="delta"))
    first = request((AGENT, {HOPS: [hop("weather", resends=2)]}))
    second = request((AGENT, {HOPS: [hop("weather", resends=1)]}))
    got = derive(stage, tail, first)
    assert [p.point.as_int for p in got[semconv.METRIC_HTTP_CLIENT_RETRIES]] == [2]
    tail.batches.clear()
    got = derive(stage, tail, second)
    assert [p.point.as_int for p in got[semconv.METRIC_HTTP_CLIENT_RETRIES]] == [1]
    tail.batches.clear()
    assert derive(stage, tail) == {}  # nothing new: no point


def test_label_sets_are_capped_to_other_and_counted() -> None:
    cfg = MetricsConfig(max_label_sets=2, label_sets={semconv.METRIC_HTTP_CLIENT_RETRIES: 1})
    stage, tail = pipeline(cfg)
    calls = [model_call(model=f"m{i}", usage=(1, 1), ms=10.0) for i in range(4)]
    got = derive(
        stage,
        tail,
        request(
            (MODEL_SERVER, {MODEL: calls}),
            (AGENT, {HOPS: [hop("a", resends=1), hop("b", resends=2), hop("c", resends=3)]}),
        ),
    )
    durations = {
        p.attrs.get(semconv.GEN_AI_REQUEST_MODEL): p.point.count
        for p in got[semconv.METRIC_GEN_AI_OPERATION_DURATION]
    }
    assert durations == {"m0": 1, "m1": 1, "_OTHER": 2}
    other = next(
        p
        for p in got[semconv.METRIC_GEN_AI_OPERATION_DURATION]
        if p.attrs.get(semconv.GEN_AI_REQUEST_MODEL) == "_OTHER"
    )
    assert other.attrs[semconv.GEN_AI_OPERATION_NAME] == "_OTHER"
    # token usage: (model, type) sets; the token type is kept, the model capped
    usage = {
        (p.attrs[semconv.GEN_AI_REQUEST_MODEL], p.attrs[semconv.GEN_AI_TOKEN_TYPE]): p.point.count
        for p in got[semconv.METRIC_GEN_AI_TOKEN_USAGE]
    }
    assert usage == {
        ("m0", "input"): 1,
        ("m0", "output"): 1,
        ("_OTHER", "input"): 3,
        ("_OTHER", "output"): 3,
    }
    retries = {
        p.attrs[semconv.TARGET_SERVER_NAME]: p.point.as_int
        for p in got[semconv.METRIC_HTTP_CLIENT_RETRIES]
    }
    assert retries == {"a": 1, "_OTHER": 5}
    overflow = stage.store.overflow_points
    assert overflow[semconv.METRIC_GEN_AI_OPERATION_DURATION] == 2
    assert overflow[semconv.METRIC_GEN_AI_TOKEN_USAGE] == 6
    assert overflow[semconv.METRIC_HTTP_CLIENT_RETRIES] == 5
    text = stage.metrics.render().decode()
    assert 'gym_sidecar_limit_hits_total{limit="metrics.max_label_sets"} 13.0' in text


def test_values_of_the_wrong_type_give_no_point_and_are_counted() -> None:
    stage, tail = pipeline()
    got = derive(
        stage,
        tail,
        request(
            (RESOURCES, {VERIFY: [verify("1.0"), verify(float("nan")), verify(True), verify(0.5)]}),
            (
                AGENT,
                {
                    ROLLOUT: [rollout(turns=True, tokens=(-1, 5)), rollout(turns="3")],
                    HOPS: [hop("x", resends=-2)],
                },
            ),
        ),
    )
    [reward] = got[semconv.METRIC_VERIFY_REWARD]
    assert (reward.point.count, reward.point.sum) == (1, 0.5)
    assert semconv.METRIC_ROLLOUT_TURNS not in got
    [tokens] = got[semconv.METRIC_ROLLOUT_TOKENS]
    assert tokens.attrs == {semconv.GEN_AI_TOKEN_TYPE: "output"} and tokens.point.sum == 5.0
    assert stage.store.rl.invalid_values == 7
    text = stage.metrics.render().decode()
    assert "gym_sidecar_derived_invalid_values_total 7.0" in text


def test_groups_that_are_off_are_not_derived() -> None:
    req = request(
        (MODEL_SERVER, {MODEL: [model_call()]}),
        (AGENT, {HOPS: [hop("weather", resends=1)]}),
    )
    stage, tail = pipeline(modes={"model_call": "off", "http_client": "off"})
    assert derive(stage, tail, req) == {}
    stage, tail = pipeline()  # defaults: model_call in metrics mode, http_client on
    got = derive(stage, tail, req)
    assert semconv.METRIC_GEN_AI_OPERATION_DURATION in got
    assert semconv.METRIC_HTTP_CLIENT_RETRIES in got
    forwarded = {
        ss.scope.name
        for batch in tail.batches
        if batch.signal is Signal.TRACES
        for rs in parsed(batch.message).resource_spans
        for ss in rs.scope_spans
    }
    assert forwarded == {HOPS}  # model calls derived, then dropped by the gate


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_prometheus_exposition() -> None:
    stage, tail = pipeline()
    derive(
        stage,
        tail,
        request(
            (RESOURCES, {VERIFY: [verify(1.0), verify(0.0)]}),
            (MODEL_SERVER, {MODEL: [model_call(ms=150.0, ttfc_s=0.05)]}),
            (AGENT, {ROLLOUT: [rollout(turns=2, tokens=(34, 13))], HOPS: [hop("w", resends=2)]}),
        ),
    )
    got = samples(stage.metrics.render().decode())

    def labels(res: dict[str, object], **extra: str) -> frozenset[tuple[str, str]]:
        out = {k.replace(".", "_"): str(v) for k, v in res.items()}
        return frozenset({**out, **extra}.items())

    ok = labels(RESOURCES, succeeded="true")
    assert got[("gym_verify_reward_count", ok)] == 2
    assert got[("gym_verify_reward_sum", ok)] == 1.0
    assert got[("gym_verify_reward_bucket", ok | {("le", "0.0")})] == 1
    assert got[("gym_verify_reward_bucket", ok | {("le", "0.9")})] == 1
    call = labels(MODEL_SERVER, gen_ai_operation_name="chat", gen_ai_request_model="policy-7b")
    assert got[("gen_ai_client_operation_duration_count", call)] == 1
    assert got[("gen_ai_client_operation_duration_sum", call)] == pytest.approx(0.15)
    assert got[("gen_ai_client_token_usage_sum", call | {("gen_ai_token_type", "input")})] == 13
    assert got[("gen_ai_client_token_usage_sum", call | {("gen_ai_token_type", "output")})] == 5
    assert got[("gen_ai_server_time_to_first_token_sum", call)] == 0.05
    agent = labels(AGENT)
    assert got[("gym_rollout_turns_sum", agent)] == 2
    assert got[("gym_rollout_tokens_sum", agent | {("gen_ai_token_type", "output")})] == 13
    target = agent | {("nemo_gym_target_server_name", "w")}
    assert got[("gym_http_client_retries_total", target)] == 2
    spans = "gym_sidecar_derived_spans_total"
    assert got[(spans, frozenset({("span", "gym.model.*")}))] == 1
    assert got[(spans, frozenset({("span", "http_client.retried_or_failed")}))] == 1


def test_rl_points_survive_a_refused_export() -> None:
    """Backpressure on the export: the RL points stay for the next interval (cumulative
    sums and histograms keep their totals)."""
    stage, _ = pipeline()
    asyncio.run(stage.consume(trace_batch(request((AGENT, {HOPS: [hop("w", resends=2)]})))))
    snap = stage.store.collect()
    assert [p.value for _, p in snap.rl_sums] == [2]
    # not committed (as after a refused export): the next snapshot has them again
    again = stage.store.collect()
    assert [p.value for _, p in again.rl_sums] == [2]


def test_the_value_indexes_name_their_keys() -> None:
    expected = {
        fields.SUCCEEDED: semconv.VERIFY_SUCCEEDED,
        fields.REWARD: semconv.REWARD,
        fields.OPERATION_NAME: semconv.GEN_AI_OPERATION_NAME,
        fields.TURNS: semconv.ROLLOUT_TURNS,
        fields.USAGE_INPUT_TOKENS: semconv.GEN_AI_USAGE_INPUT_TOKENS,
        fields.USAGE_OUTPUT_TOKENS: semconv.GEN_AI_USAGE_OUTPUT_TOKENS,
        fields.REQUEST_MODEL: semconv.GEN_AI_REQUEST_MODEL,
        fields.TIME_TO_FIRST_CHUNK: semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
        fields.ROLLOUT_INPUT_TOKENS: semconv.ROLLOUT_INPUT_TOKENS,
        fields.ROLLOUT_OUTPUT_TOKENS: semconv.ROLLOUT_OUTPUT_TOKENS,
        fields.ERROR_TYPE: semconv.ERROR_TYPE,
        fields.NESTED: semconv.ROLLOUT_NESTED,
        fields.RESEND_COUNT: semconv.HTTP_REQUEST_RESEND_COUNT,
        fields.TARGET_SERVER: semconv.TARGET_SERVER_NAME,
    }
    assert {i: fields.ATTR_KEYS[i] for i in expected} == expected
    assert len(fields.ATTR_KEYS) == len(expected) == fields.EXCEPTION_TYPE
    assert set(fields.SCAN_SPEC.sparse_keys) == {
        semconv.HTTP_REQUEST_RESEND_COUNT,
        semconv.ERROR_TYPE,
    }


def test_the_openmetrics_exposition_parses() -> None:
    """Every RL histogram keeps a ``_sum`` in OpenMetrics, which forbids one on a
    histogram with a negative bucket: no bound may be negative (a negative reward counts
    in the first bucket)."""
    from prometheus_client.openmetrics.exposition import generate_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om

    stage, tail = pipeline()
    got = derive(
        stage,
        tail,
        request(
            (RESOURCES, {VERIFY: [verify(-2.0), verify(1.0)]}),
            (AGENT, {ROLLOUT: [rollout(turns=2)]}),
        ),
    )
    text = generate_latest(stage.metrics.registry).decode()
    families = {f.name: f for f in om(text)}
    reward = families["gym_verify_reward"]
    first = [s for s in reward.samples if s.name.endswith("_bucket") and s.labels["le"] == "0.0"]
    assert [s.value for s in first] == [1.0]
    # a negative sum: that series has no _sum nor _count there (OpenMetrics forbids a
    # negative one); the OTLP export carries it
    assert not [s for s in reward.samples if s.name.endswith(("_sum", "_count"))]
    assert [p.point.sum for p in got[semconv.METRIC_VERIFY_REWARD]] == [-1.0]
    turns = families["gym_rollout_turns"]
    assert [s.value for s in turns.samples if s.name == "gym_rollout_turns_sum"] == [2.0]
    with pytest.raises(ValueError, match="must not be negative"):
        MetricsConfig(reward_buckets=[-1.0, 0.0, 1.0])
