"""The metrics the sidecar derives from spans, and the span group each one reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gym_telemetry_semconv.span_groups import (
    GROUP_HTTP_CLIENT,
    GROUP_MODEL_CALL,
    GROUP_ROLLOUT,
    GROUP_VERIFY,
)

METRIC_ROLLOUT_DURATION: Final = "gym.rollout.duration_ms"
METRIC_VERIFY_DURATION: Final = "gym.verify.duration_ms"
METRIC_VERIFY_COUNT: Final = "gym.verify.count"
METRIC_VERIFY_SUCCESS_RATE: Final = "gym.verify.success_rate"
METRIC_ENV_STEP_DURATION: Final = "gym.env.step.duration_ms"
METRIC_ENV_STEP_COUNT: Final = "gym.env.step.count"

# --- the RL view (issue 41): derived by the sidecar; names agreed here -----------------------
METRIC_VERIFY_REWARD: Final = "gym.verify.reward"
"""Histogram ``1``: ``nemo.gym.reward`` of ``gym.verify`` spans (resources server,
``succeeded``)."""
METRIC_ENV_STEP_REWARD: Final = "gym.env.step.reward"
"""Histogram ``1``: ``nemo.gym.reward`` of ``gym.env.step`` spans."""
METRIC_GEN_AI_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
"""Histogram ``{token}`` (OpenTelemetry GenAI): per model call, per ``gen_ai.token.type``."""
METRIC_GEN_AI_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
"""Histogram ``s`` (OpenTelemetry GenAI): model-call duration."""
METRIC_GEN_AI_TIME_TO_FIRST_TOKEN: Final = "gen_ai.server.time_to_first_token"
"""Histogram ``s`` (OpenTelemetry GenAI): streamed model calls' time to first chunk."""
METRIC_ROLLOUT_TURNS: Final = "gym.rollout.turns"
"""Histogram ``{turn}``: ``nemo.gym.rollout.turns`` per rollout, per agent server."""
METRIC_ROLLOUT_TOKENS: Final = "gym.rollout.tokens"
"""Histogram ``{token}``: a rollout's tokens per ``gen_ai.token.type``, per agent server."""
METRIC_HTTP_CLIENT_RETRIES: Final = "gym.http.client.retries"
"""Sum (monotonic): ``http.request.resend_count`` of hops, per target server."""
METRIC_HTTP_CLIENT_TIMEOUTS: Final = "gym.http.client.timeouts"
"""Sum (monotonic): hops that ended with ``error.type=timeout``, per target server."""
METRIC_EVENT_LOOP_LAG: Final = "gym.server.event_loop.lag_ms"
"""Histogram ``ms``: the heartbeats' pre-aggregated event-loop lag, per server."""
METRIC_ROLLOUT_IN_FLIGHT: Final = "gym.rollout.in_flight"
"""Gauge: rollouts started and not ended, per agent server (live events)."""
METRIC_ROLLOUT_STALLED: Final = "gym.rollout.stalled"
"""Gauge: in-flight rollouts with no activity for the configured time, per agent server."""
METRIC_ROLLOUT_LOST: Final = "gym.rollout.lost"
"""Counter: in-flight rollouts whose server stopped or vanished, per agent server."""

SOURCE_GROUP: Final[Mapping[str, str]] = {
    METRIC_ROLLOUT_DURATION: GROUP_ROLLOUT,
    METRIC_VERIFY_DURATION: GROUP_VERIFY,
    METRIC_VERIFY_COUNT: GROUP_VERIFY,
    METRIC_VERIFY_SUCCESS_RATE: GROUP_VERIFY,
    METRIC_ENV_STEP_DURATION: GROUP_VERIFY,
    METRIC_ENV_STEP_COUNT: GROUP_VERIFY,
    METRIC_VERIFY_REWARD: GROUP_VERIFY,
    METRIC_ENV_STEP_REWARD: GROUP_VERIFY,
    METRIC_GEN_AI_TOKEN_USAGE: GROUP_MODEL_CALL,
    METRIC_GEN_AI_OPERATION_DURATION: GROUP_MODEL_CALL,
    METRIC_GEN_AI_TIME_TO_FIRST_TOKEN: GROUP_MODEL_CALL,
    METRIC_ROLLOUT_TURNS: GROUP_ROLLOUT,
    METRIC_ROLLOUT_TOKENS: GROUP_ROLLOUT,
    METRIC_HTTP_CLIENT_RETRIES: GROUP_HTTP_CLIENT,
    METRIC_HTTP_CLIENT_TIMEOUTS: GROUP_HTTP_CLIENT,
}
"""Derived metric (from spans) -> the span group whose spans it is computed from. Its
values are ``span_groups.DERIVED_GROUPS``, the groups in ``metrics`` mode by default. (The
live metrics, ``gym.rollout.in_flight|stalled|lost`` and ``gym.server.event_loop.lag_ms``,
come from the live events, not from spans.)"""
