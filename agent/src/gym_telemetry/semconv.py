"""Names shared by the agent and the sidecar: attribute keys, span names, span groups
and the rule that maps a span group to its instrumentation scope.

This module is the one place these strings live. The sidecar imports it to gate and
derive per ScopeSpans block, so the agent and the sidecar can never disagree on them.
It imports nothing beyond the standard library.
"""

from __future__ import annotations

from typing import Final

# --- span groups (NeMo Gym's own names) -------------------------------------------------
GROUP_JOB: Final = "job"
GROUP_SERVER: Final = "server"
GROUP_HTTP_CLIENT: Final = "http_client"
GROUP_ROLLOUT: Final = "rollout"
GROUP_VERIFY: Final = "verify"
GROUP_AGENT: Final = "agent"
GROUP_MODEL_CALL: Final = "model_call"
GROUP_SANDBOX: Final = "sandbox"

ALL_GROUPS: Final[tuple[str, ...]] = (
    GROUP_JOB,
    GROUP_SERVER,
    GROUP_HTTP_CLIENT,
    GROUP_ROLLOUT,
    GROUP_VERIFY,
    GROUP_AGENT,
    GROUP_MODEL_CALL,
    GROUP_SANDBOX,
)

PRESETS: Final[dict[str, frozenset[str]]] = {
    "default": frozenset({GROUP_JOB, GROUP_SERVER, GROUP_HTTP_CLIENT, GROUP_ROLLOUT}),
    "per_rollout": frozenset(
        {
            GROUP_SERVER,
            GROUP_HTTP_CLIENT,
            GROUP_ROLLOUT,
            GROUP_VERIFY,
            GROUP_AGENT,
            GROUP_MODEL_CALL,
        }
    ),
    "all": frozenset(ALL_GROUPS),
}

# --- instrumentation scopes ------------------------------------------------------------
# Each span group emits through its own tracer; the scope name is the group's name
# behind this prefix. The sidecar reverses it with ``group_of_scope``.
SCOPE_PREFIX: Final = "gym_telemetry."


def scope_name(group: str) -> str:
    """Instrumentation scope name for a span group's tracer."""
    return SCOPE_PREFIX + group


def group_of_scope(scope: str) -> str | None:
    """The span group a gym_telemetry scope belongs to, or None for a foreign scope."""
    if scope.startswith(SCOPE_PREFIX):
        return scope[len(SCOPE_PREFIX) :]
    return None


# --- span names ------------------------------------------------------------------------
SPAN_ROLLOUT: Final = "gym.rollout"
SPAN_VERIFY: Final = "gym.verify"

# --- attribute keys --------------------------------------------------------------------
ROLLOUT_ID: Final = "nemo.gym.rollout.id"
SERVER_NAME: Final = "nemo.gym.server.name"
SERVER_TYPE: Final = "nemo.gym.server.type"
VERIFY_SUCCEEDED: Final = "succeeded"
ERROR_TYPE: Final = "error.type"
SERVICE_NAME: Final = "service.name"

SERVER_TYPES: Final[tuple[str, ...]] = ("resources", "agent", "model", "environment")

# --- derived metrics -------------------------------------------------------------------
METRIC_ROLLOUT_DURATION: Final = "gym.rollout.duration_ms"
METRIC_VERIFY_DURATION: Final = "gym.verify.duration_ms"
METRIC_VERIFY_COUNT: Final = "gym.verify.count"
METRIC_VERIFY_SUCCESS_RATE: Final = "gym.verify.success_rate"
