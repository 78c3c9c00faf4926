"""The metrics the sidecar derives from spans, and the span group each one reads."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gym_telemetry_semconv.span_groups import GROUP_ROLLOUT, GROUP_VERIFY

METRIC_ROLLOUT_DURATION: Final = "gym.rollout.duration_ms"
METRIC_VERIFY_DURATION: Final = "gym.verify.duration_ms"
METRIC_VERIFY_COUNT: Final = "gym.verify.count"
METRIC_VERIFY_SUCCESS_RATE: Final = "gym.verify.success_rate"
METRIC_ENV_STEP_DURATION: Final = "gym.env.step.duration_ms"
METRIC_ENV_STEP_COUNT: Final = "gym.env.step.count"

SOURCE_GROUP: Final[Mapping[str, str]] = {
    METRIC_ROLLOUT_DURATION: GROUP_ROLLOUT,
    METRIC_VERIFY_DURATION: GROUP_VERIFY,
    METRIC_VERIFY_COUNT: GROUP_VERIFY,
    METRIC_VERIFY_SUCCESS_RATE: GROUP_VERIFY,
    METRIC_ENV_STEP_DURATION: GROUP_VERIFY,
    METRIC_ENV_STEP_COUNT: GROUP_VERIFY,
}
"""Derived metric -> the span group whose spans it is computed from. Its values are
``span_groups.DERIVED_GROUPS``, the groups in ``metrics`` mode by default."""
