"""Every environment variable the agent reads, as documented constants.

Like ``opentelemetry.sdk.environment_variables``: each constant's value is the
variable's name, and the docstring below it says who reads it, what it does and its
default. The modules that read a variable import its name from here; none spells it
itself. docs/agent.md's "Environment variables" table lists every name of this module
(``tests/agent/test_environment_variables.py`` checks both directions).

Precedence everywhere: argument > environment > default. Standard library only.
"""

from __future__ import annotations

from typing import Final

# --- gym_telemetry's own ------------------------------------------------------------------

GYM_TELEMETRY: Final = "GYM_TELEMETRY"
"""The auto-instrumentation switch (``gym_telemetry.autoinstrument``): any value but
empty, ``0``, ``false``, ``no``, ``off`` activates it in every Python process of the
environment. Default: unset (off)."""

GYM_TELEMETRY_SPAN_GROUPS: Final = "GYM_TELEMETRY_SPAN_GROUPS"
"""The span-group spec, e.g. ``default,sandbox`` (``span_groups.configure_from_env``,
``init_telemetry``). Default: ``default``."""

GYM_TELEMETRY_SERVER_NAME: Final = "GYM_TELEMETRY_SERVER_NAME"
"""``nemo.gym.server.name`` when ``init_telemetry`` is not given one. Default: unset."""

GYM_TELEMETRY_SERVER_TYPE: Final = "GYM_TELEMETRY_SERVER_TYPE"
"""``nemo.gym.server.type`` when ``init_telemetry`` is not given one. Default: unset."""

GYM_TELEMETRY_SERVICE_PREFIX: Final = "GYM_TELEMETRY_SERVICE_PREFIX"
"""``service.name`` prefix of auto-instrumented servers; the Gym server name follows
after a ``/``. Default: ``nemo-gym``."""

GYM_TELEMETRY_EXCLUDED_PATHS: Final = "GYM_TELEMETRY_EXCLUDED_PATHS"
"""Comma-separated exact request paths that get no SERVER span (auto-instrumentation).
Default: ``/,/health,/healthz,/livez,/readyz``."""

GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S: Final = "GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S"
"""Seconds an auto-instrumented server waits at exit to flush its spans. Default: ``2``."""

GYM_TELEMETRY_SIDECAR_ADMIN_URL: Final = "GYM_TELEMETRY_SIDECAR_ADMIN_URL"
"""The sidecar's admin URL the span-group poller reads. Default:
``http://localhost:13133``."""

GYM_TELEMETRY_POLL_INTERVAL_S: Final = "GYM_TELEMETRY_POLL_INTERVAL_S"
"""Seconds between span-group polls; ``0`` disables polling. Default: ``10``."""

GYM_TELEMETRY_RECORDER: Final = "GYM_TELEMETRY_RECORDER"
"""``sdk`` records every span through ``Tracer.start_span`` (``gym_telemetry._lean``).
Default: ``lean``."""

GYM_TELEMETRY_ENCODER: Final = "GYM_TELEMETRY_ENCODER"
"""``sdk`` makes the OTLP/gRPC exporter use its stock encoder
(``gym_telemetry._lean.exporter``). Default: ``lean``."""

GYM_TELEMETRY_TRAINER_CONTEXT: Final = "GYM_TELEMETRY_TRAINER_CONTEXT"
"""How an agent's outermost ``/run`` treats an incoming ``traceparent`` (a trainer's):
``link`` starts a new trace whose root links to the caller's span, ``continue`` keeps
the caller's trace (``autoinstrument.server_span``). Default: ``link``."""

GYM_TELEMETRY_LIVE_INTERVAL_S: Final = "GYM_TELEMETRY_LIVE_INTERVAL_S"
"""Seconds between two sends of the live events (rollouts started, their steps, the
heartbeat; ``gym_telemetry._live``); ``0`` disables them. Default: ``2``."""

GYM_TELEMETRY_LAG_PROBE_INTERVAL_S: Final = "GYM_TELEMETRY_LAG_PROBE_INTERVAL_S"
"""Seconds between two runs of the event-loop lag probe on a server's asyncio loop (its
samples go in the heartbeat); ``0`` disables it. Default: ``0.5``."""

# --- NeMo Gym's ---------------------------------------------------------------------------

NEMO_GYM_CONFIG_PATH: Final = "NEMO_GYM_CONFIG_PATH"
"""Set by Gym's launcher for each server process (its top-level config key); read as the
server name by the auto-instrumentation. Default: unset."""

# --- OpenTelemetry's (the SDK's own names; the agent reads them itself) --------------------

OTEL_SDK_DISABLED: Final = "OTEL_SDK_DISABLED"
"""``true``: ``init_telemetry`` leaves telemetry off. Default: ``false``."""

OTEL_EXPORTER_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""The export endpoint (``init_telemetry``). Default: ``localhost:4317``."""

OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
"""The trace export endpoint; wins over ``OTEL_EXPORTER_OTLP_ENDPOINT``."""

OTEL_EXPORTER_OTLP_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""``grpc`` or ``http/protobuf`` (``init_telemetry``). Default: ``grpc``."""

OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""The trace export protocol; wins over ``OTEL_EXPORTER_OTLP_PROTOCOL``."""

OTEL_EXPORTER_OTLP_INSECURE: Final = "OTEL_EXPORTER_OTLP_INSECURE"
"""TLS or plaintext for a scheme-less gRPC endpoint. Default: plaintext."""

OTEL_PROPAGATORS: Final = "OTEL_PROPAGATORS"
"""When set, the API's propagators are left as configured. Default:
``tracecontext,baggage``."""

OTEL_BSP_MAX_QUEUE_SIZE: Final = "OTEL_BSP_MAX_QUEUE_SIZE"
"""The batch processor's queue bound (spans). Default: ``2048``."""

OTEL_BSP_MAX_EXPORT_BATCH_SIZE: Final = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
"""Spans per export batch. Default: ``512``."""

OTEL_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
"""``service.name``; when set (or named in ``OTEL_RESOURCE_ATTRIBUTES``) the agent does
not derive one."""

OTEL_RESOURCE_ATTRIBUTES: Final = "OTEL_RESOURCE_ATTRIBUTES"
"""Resource attributes, ``k=v,...`` (merged by the SDK)."""

#: Every name above, in order.
ALL: Final[tuple[str, ...]] = tuple(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
