"""Auto-instrumentation of an unmodified NeMo Gym install, switched on by the environment.

Install ``gym-telemetry-agent`` into the Gym server environment and set
``GYM_TELEMETRY=1``: every Python process of that environment then installs a few
import hooks at start-up (through the ``gym_telemetry_autoinstrument.pth`` file the wheel
ships), and every Gym server process started in it -- by ``python app.py``, by
``gym env start`` or by ``gym-telemetry-run`` -- is instrumented. With the variable unset
(or ``0``/``false``/``no``/``off``) the ``.pth`` line costs one dictionary lookup and
imports nothing.

This module is imported at interpreter start-up, so it imports only ``os``; the real
work lives in ``gym_telemetry.autoinstrument.install`` and is loaded by ``activate()``.

Environment:

- ``GYM_TELEMETRY``: ``1`` (or any value but ``0``/``false``/``no``/``off``/empty)
  activates.
- ``GYM_TELEMETRY_SERVICE_PREFIX``: ``service.name`` is ``<prefix>/<gym server name>``;
  default ``nemo-gym``.
- ``GYM_TELEMETRY_SPAN_GROUPS``: the local span-group spec (``default``, ``per_rollout``,
  ``all``, names, ``-name``), read by ``gym_telemetry.span_groups``.
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (and the other standard ``OTEL_*`` variables): where
  the sidecar listens (default ``localhost:4317``), read by ``gym_telemetry.provider``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

from gym_telemetry import environment_variables as env_vars

_OFF_VALUES: Final = frozenset({"", "0", "false", "no", "off"})


def activation_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``GYM_TELEMETRY`` asks for auto-instrumentation. Cheap; never raises."""
    env = os.environ if environ is None else environ
    value = env.get(env_vars.GYM_TELEMETRY)
    return value is not None and value.strip().lower() not in _OFF_VALUES


def activate() -> bool:
    """Install the import hooks that instrument Gym servers. Idempotent; never raises.

    Returns True when the hooks are installed. Nothing is exported and no SDK is set up
    here: that happens when a Gym server process starts its webserver.
    """
    try:
        from gym_telemetry.autoinstrument.install import install

        return install()
    except Exception:  # boundary: activation must never break interpreter start-up
        import logging

        logging.getLogger(__name__).warning(
            "gym_telemetry: auto-instrumentation could not be activated", exc_info=True
        )
        return False


__all__ = [
    "activate",
    "activation_requested",
]
