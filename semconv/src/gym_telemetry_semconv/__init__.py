"""gym_telemetry_semconv: the names gym-telemetry's agent and sidecar share.

Each name is written once, in one of the submodules below, and re-exported here flat
(``import gym_telemetry_semconv as semconv; semconv.GROUP_VERIFY``):

- :mod:`~gym_telemetry_semconv.attributes`: attribute keys and span names;
- :mod:`~gym_telemetry_semconv.metrics`: derived metric names and their source groups;
- :mod:`~gym_telemetry_semconv.span_groups`: groups, presets, scopes, the spec grammar,
  modes and defaults;
- :mod:`~gym_telemetry_semconv.admin_api`: the sidecar admin listener's port and paths.

It also holds the one helper both programs share, not re-exported here:
:mod:`~gym_telemetry_semconv.ratelimit`, the rate-limited logging filter. It lives here,
and not in either program, so that the agent and the sidecar apply one rate-limit rule to
the lines that repeat in their logs (one line per logger and message per interval, then
the count suppressed) without the sidecar depending on the agent.

Standard library only. The names hold no process state; the filter's state lives in the
filters a program installs on its loggers.
"""

from __future__ import annotations

from gym_telemetry_semconv.admin_api import (
    DEFAULT_ADMIN_PORT,
    HEALTHZ_PATH,
    METRICS_PATH,
    READYZ_PATH,
    SPAN_GROUPS_PATH,
)
from gym_telemetry_semconv.attributes import (
    ERROR_TYPE,
    FAILURE_STAGE,
    GEN_AI_REQUEST_MODEL,
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
    ROLLOUT_ID,
    ROLLOUT_NESTED,
    ROLLOUT_OUTER_BAGGAGE,
    SERVER_NAME,
    SERVER_TYPE,
    SERVER_TYPES,
    SERVICE_NAME,
    SPAN_AGENT_RESPONSES,
    SPAN_ENV_STEP,
    SPAN_MODEL_CHAT,
    SPAN_MODEL_MESSAGES,
    SPAN_MODEL_RESPONSES,
    SPAN_ROLLOUT,
    SPAN_VERIFY,
    URL_FULL,
    URL_PATH,
    URL_TEMPLATE,
    VERIFY_SUCCEEDED,
)
from gym_telemetry_semconv.metrics import (
    METRIC_ENV_STEP_COUNT,
    METRIC_ENV_STEP_DURATION,
    METRIC_ROLLOUT_DURATION,
    METRIC_VERIFY_COUNT,
    METRIC_VERIFY_DURATION,
    METRIC_VERIFY_SUCCESS_RATE,
    SOURCE_GROUP,
)
from gym_telemetry_semconv.span_groups import (
    ALL_GROUPS,
    DEFAULT_MODES,
    DEFAULT_SPEC,
    DERIVED_GROUPS,
    GROUP_AGENT,
    GROUP_HTTP_CLIENT,
    GROUP_JOB,
    GROUP_MODEL_CALL,
    GROUP_ROLLOUT,
    GROUP_SANDBOX,
    GROUP_SERVER,
    GROUP_VERIFY,
    NONE_SPEC,
    PRESETS,
    SCOPE_PREFIX,
    Mode,
    ParsedSpec,
    enabled_groups,
    forwarded_groups,
    group_of_scope,
    parse_spec,
    resolve_modes,
    scope_name,
)

__all__ = [
    "ALL_GROUPS",
    "DEFAULT_ADMIN_PORT",
    "DEFAULT_MODES",
    "DEFAULT_SPEC",
    "DERIVED_GROUPS",
    "ERROR_TYPE",
    "FAILURE_STAGE",
    "GEN_AI_REQUEST_MODEL",
    "GROUP_AGENT",
    "GROUP_HTTP_CLIENT",
    "GROUP_JOB",
    "GROUP_MODEL_CALL",
    "GROUP_ROLLOUT",
    "GROUP_SANDBOX",
    "GROUP_SERVER",
    "GROUP_VERIFY",
    "HEALTHZ_PATH",
    "HTTP_REQUEST_METHOD",
    "HTTP_RESPONSE_STATUS_CODE",
    "HTTP_ROUTE",
    "METRICS_PATH",
    "METRIC_ENV_STEP_COUNT",
    "METRIC_ENV_STEP_DURATION",
    "METRIC_ROLLOUT_DURATION",
    "METRIC_VERIFY_COUNT",
    "METRIC_VERIFY_DURATION",
    "METRIC_VERIFY_SUCCESS_RATE",
    "NONE_SPEC",
    "PRESETS",
    "READYZ_PATH",
    "ROLLOUT_ID",
    "ROLLOUT_NESTED",
    "ROLLOUT_OUTER_BAGGAGE",
    "SCOPE_PREFIX",
    "SERVER_NAME",
    "SERVER_TYPE",
    "SERVER_TYPES",
    "SERVICE_NAME",
    "SOURCE_GROUP",
    "SPAN_AGENT_RESPONSES",
    "SPAN_ENV_STEP",
    "SPAN_GROUPS_PATH",
    "SPAN_MODEL_CHAT",
    "SPAN_MODEL_MESSAGES",
    "SPAN_MODEL_RESPONSES",
    "SPAN_ROLLOUT",
    "SPAN_VERIFY",
    "URL_FULL",
    "URL_PATH",
    "URL_TEMPLATE",
    "VERIFY_SUCCEEDED",
    "Mode",
    "ParsedSpec",
    "enabled_groups",
    "forwarded_groups",
    "group_of_scope",
    "parse_spec",
    "resolve_modes",
    "scope_name",
]
