"""issue 15.1: the agent's span groups before its first poll are the sidecar's default.

Both come from ``gym_telemetry_semconv.resolve_modes``; this pins that neither side
grows its own default again.
"""

from __future__ import annotations

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.policy import Policy
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import span_groups


def sidecar_answer(spec: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
    cfg = SpanGroupsConfig() if spec is None else SpanGroupsConfig(spec=spec)
    answer = Policy(cfg.policy(), generation=1).for_service("svc")
    forwarded = frozenset(g for g, m in answer.modes.items() if m is semconv.Mode.ON)
    return answer.enabled, forwarded


def test_unconfigured_agent_and_sidecar_agree() -> None:
    enabled, forwarded = sidecar_answer()
    assert enabled == span_groups.configure_from_env({})
    assert "verify" in enabled and "verify" not in forwarded
    assert enabled >= semconv.DERIVED_GROUPS


@pytest.mark.parametrize("spec", ["default", "per_rollout", "job", "all,-verify", "none"])
def test_agent_and_sidecar_agree_for_a_spec(spec: str) -> None:
    enabled, _ = sidecar_answer(spec)
    assert enabled == span_groups.configure_from_env({env_vars.GYM_TELEMETRY_SPAN_GROUPS: spec})
