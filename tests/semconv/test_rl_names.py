"""issue 41: the names of the RL view, agreed between the agent and the sidecar.

The GenAI and HTTP keys are OpenTelemetry's own (checked against its semantic-convention
registry by hand: gen-ai ``registry.yaml`` before the GenAI conventions moved to their own
repository, ``http/registry.yaml``, ``error/registry.yaml``); the tests pin the spelling so
that a rename is a deliberate change on both sides.
"""

from __future__ import annotations

import itertools
import math

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import live


def test_span_attributes_are_spelled_as_agreed() -> None:
    assert semconv.REWARD == "nemo.gym.reward"
    assert semconv.ROLLOUT_TURNS == "nemo.gym.rollout.turns"
    assert semconv.ROLLOUT_INPUT_TOKENS == "nemo.gym.rollout.input_tokens"
    assert semconv.ROLLOUT_OUTPUT_TOKENS == "nemo.gym.rollout.output_tokens"
    assert semconv.TARGET_SERVER_NAME == "nemo.gym.target.server.name"


def test_opentelemetry_keys_are_opentelemetrys() -> None:
    assert semconv.GEN_AI_OPERATION_NAME == "gen_ai.operation.name"
    assert semconv.GEN_AI_OPERATION_CHAT == "chat"
    assert semconv.GEN_AI_REQUEST_MODEL == "gen_ai.request.model"
    assert semconv.GEN_AI_RESPONSE_MODEL == "gen_ai.response.model"
    assert semconv.GEN_AI_USAGE_INPUT_TOKENS == "gen_ai.usage.input_tokens"
    assert semconv.GEN_AI_USAGE_OUTPUT_TOKENS == "gen_ai.usage.output_tokens"
    assert semconv.GEN_AI_RESPONSE_FINISH_REASONS == "gen_ai.response.finish_reasons"
    assert semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK == "gen_ai.response.time_to_first_chunk"
    assert semconv.GEN_AI_TOKEN_TYPE == "gen_ai.token.type"
    assert (semconv.GEN_AI_TOKEN_TYPE_INPUT, semconv.GEN_AI_TOKEN_TYPE_OUTPUT) == (
        "input",
        "output",
    )
    assert semconv.OPENAI_API_TYPE == "openai.api.type"
    assert semconv.HTTP_REQUEST_RESEND_COUNT == "http.request.resend_count"
    assert semconv.ERROR_TYPE_TIMEOUT == "timeout"


def test_model_routes_are_the_three_dialects() -> None:
    assert semconv.MODEL_ROUTES == ("/v1/responses", "/v1/chat/completions", "/v1/messages")


def test_metric_names_are_spelled_as_agreed() -> None:
    assert {
        semconv.METRIC_VERIFY_REWARD,
        semconv.METRIC_ENV_STEP_REWARD,
        semconv.METRIC_GEN_AI_TOKEN_USAGE,
        semconv.METRIC_GEN_AI_OPERATION_DURATION,
        semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN,
        semconv.METRIC_ROLLOUT_TURNS,
        semconv.METRIC_ROLLOUT_TOKENS,
        semconv.METRIC_HTTP_CLIENT_RETRIES,
        semconv.METRIC_HTTP_CLIENT_TIMEOUTS,
        semconv.METRIC_EVENT_LOOP_LAG,
        semconv.METRIC_ROLLOUT_IN_FLIGHT,
        semconv.METRIC_ROLLOUT_STALLED,
        semconv.METRIC_ROLLOUT_LOST,
    } == {
        "gym.verify.reward",
        "gym.env.step.reward",
        "gen_ai.client.token.usage",
        "gen_ai.client.operation.duration",
        "gen_ai.server.time_to_first_token",
        "gym.rollout.turns",
        "gym.rollout.tokens",
        "gym.http.client.retries",
        "gym.http.client.timeouts",
        "gym.server.event_loop.lag_ms",
        "gym.rollout.in_flight",
        "gym.rollout.stalled",
        "gym.rollout.lost",
    }


def test_new_names_are_exported_flat_and_distinct() -> None:
    for name in semconv.__all__:
        assert hasattr(semconv, name), name
    assert len(set(semconv.__all__)) == len(semconv.__all__)


def test_live_event_names() -> None:
    assert live.SCOPE == "gym_telemetry.live"
    assert live.EVENT_NAME == "event.name"
    assert live.EVENTS == (
        "gym.rollout.start",
        "gym.rollout.step",
        "gym.agent.heartbeat",
        "gym.agent.stop",
    )
    assert live.ROLLOUT_STEP == "nemo.gym.rollout.step"
    assert live.ROLLOUT_STEP_TARGET == "nemo.gym.rollout.step.target"
    assert live.ROLLOUTS_IN_FLIGHT == "nemo.gym.rollouts.in_flight"
    lag = (live.LAG_COUNT, live.LAG_SUM, live.LAG_MAX, live.LAG_BUCKET_COUNTS)
    prefix = "nemo.gym.event_loop.lag_ms."
    assert lag == tuple(prefix + part for part in ("count", "sum", "max", "bucket_counts"))


def test_lag_bounds_are_strictly_increasing_finite_floats() -> None:
    bounds = live.EVENT_LOOP_LAG_BOUNDS_MS
    assert bounds, "at least one bound"
    assert all(type(b) is float and math.isfinite(b) and b > 0 for b in bounds)
    assert all(a < b for a, b in itertools.pairwise(bounds))


def test_live_defaults() -> None:
    assert live.DEFAULT_INTERVAL_S == 2.0
    assert live.DEFAULT_LAG_PROBE_INTERVAL_S == 0.5
