"""gym_telemetry: in-process OpenTelemetry instrumentation for NeMo Gym servers.

- ``gym_telemetry.endpoints``: span-group-gated wrappers for endpoint handlers.
- ``gym_telemetry.span_groups``: Gym's span groups, presets, the enabled set.
- ``gym_telemetry.rollout_correlation``: the rollout-id ContextVar (Gym's own when present).
- ``init_telemetry`` / ``shutdown_telemetry``: SDK setup towards the local sidecar.

The three setup functions are loaded from ``gym_telemetry.provider`` on first access
(PEP 562), so importing ``gym_telemetry.span_groups`` alone does not load the
OpenTelemetry SDK. The names shared with the sidecar are in ``gym_telemetry_semconv``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_telemetry.provider import fastapi_telemetry_off, init_telemetry, shutdown_telemetry

__all__ = ["fastapi_telemetry_off", "init_telemetry", "shutdown_telemetry"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gym_telemetry import provider

        return getattr(provider, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
