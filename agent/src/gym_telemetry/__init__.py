"""gym_telemetry: in-process OpenTelemetry instrumentation for NeMo Gym servers.

- ``gym_telemetry.endpoints``: span-group-gated wrappers for endpoint handlers.
- ``gym_telemetry.span_groups``: Gym's span groups, presets, the enabled set.
- ``gym_telemetry.rollout_correlation``: the rollout-id ContextVar (Gym's own when present).
- ``init_telemetry`` / ``shutdown_telemetry``: SDK setup towards the local sidecar.
"""

from gym_telemetry.provider import fastapi_telemetry_off, init_telemetry, shutdown_telemetry

__all__ = ["fastapi_telemetry_off", "init_telemetry", "shutdown_telemetry"]
