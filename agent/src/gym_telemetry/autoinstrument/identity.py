"""This process's Gym server identity, and the SDK start that goes with it.

A Gym server process learns who it is in ``SimpleServer.run_webserver``, which calls
``setup_telemetry()`` before it builds the app; the Gym integration hooks that call and
runs ``start_server_telemetry(server)`` here:

- ``nemo.gym.server.name``: ``NEMO_GYM_CONFIG_PATH`` (the top-level config key the
  launcher sets for each server process), else ``server.config.name``;
- ``nemo.gym.server.type``: ``resources`` / ``agent`` / ``model`` / ``environment``,
  from the Gym base class in the server class's MRO (matched by class name, so Gym is
  never imported from here);
- ``service.name``: ``<GYM_TELEMETRY_SERVICE_PREFIX or "nemo-gym">/<server name>``;
- then ``gym_telemetry.provider.init_telemetry`` (exporter to the sidecar,
  ``GYM_TELEMETRY_SPAN_GROUPS``).

````RUNTIME`` is what the per-request code reads: ``active`` (SDK set up), the server
type (which decides how ``/v1/responses`` maps to a span group) and the paths that get
no SERVER span (``GYM_TELEMETRY_EXCLUDED_PATHS``, comma-separated exact paths; default
Gym's liveness/readiness routes ``/``, ``/health``, ``/healthz``, ``/livez``, ``/readyz``;
empty string: none excluded).
"""

from __future__ import annotations

import logging
import os
from typing import Final

import gym_telemetry_semconv as semconv

from gym_telemetry import environment_variables as env_vars
from gym_telemetry import provider, rollout_correlation

_log = logging.getLogger(__name__)

#: ``service.name`` prefix when ``GYM_TELEMETRY_SERVICE_PREFIX`` is unset.
DEFAULT_SERVICE_PREFIX: Final = "nemo-gym"
#: Gym's liveness/readiness routes, polled by the launcher and by Kubernetes probes.
DEFAULT_EXCLUDED_PATHS: Final = "/,/health,/healthz,/livez,/readyz"

SERVER_TYPE_RESOURCES: Final = semconv.SERVER_TYPES[0]
SERVER_TYPE_AGENT: Final = semconv.SERVER_TYPES[1]
SERVER_TYPE_MODEL: Final = semconv.SERVER_TYPES[2]
SERVER_TYPE_ENVIRONMENT: Final = semconv.SERVER_TYPES[3]

#: Gym base-class name -> server type. The first match walking the MRO wins.
_TYPE_BY_BASE: Final[dict[str, str]] = {
    "BaseResourcesServer": SERVER_TYPE_RESOURCES,
    "SimpleResourcesServer": SERVER_TYPE_RESOURCES,
    "BaseResponsesAPIAgent": SERVER_TYPE_AGENT,
    "SimpleResponsesAPIAgent": SERVER_TYPE_AGENT,
    "BaseResponsesAPIModel": SERVER_TYPE_MODEL,
    "SimpleResponsesAPIModel": SERVER_TYPE_MODEL,
    "BaseEnvironmentServer": SERVER_TYPE_ENVIRONMENT,
}


class _Runtime:
    """Process-wide state read on every request (one attribute load each)."""

    __slots__ = ("active", "excluded_paths", "server_name", "server_type")

    def __init__(self) -> None:
        self.active = False
        self.excluded_paths: frozenset[str] = frozenset()
        self.server_name: str | None = None
        self.server_type: str | None = None


RUNTIME: Final = _Runtime()


def server_type_of(cls: type) -> str | None:
    """``resources`` / ``agent`` / ``model`` / ``environment`` for a Gym server class."""
    for base in cls.__mro__:
        server_type = _TYPE_BY_BASE.get(base.__name__)
        if server_type is not None:
            return server_type
    return None


def service_name_for(server_name: str | None) -> str:
    """``<prefix>/<server name>`` (just the prefix when the name is unknown)."""
    prefix = (
        os.environ.get(env_vars.GYM_TELEMETRY_SERVICE_PREFIX, "").strip() or DEFAULT_SERVICE_PREFIX
    )
    return f"{prefix}/{server_name}" if server_name else prefix


def excluded_paths(environ: dict[str, str] | None = None) -> frozenset[str]:
    """The paths from ``GYM_TELEMETRY_EXCLUDED_PATHS`` (default: Gym's health routes)."""
    env = os.environ if environ is None else environ
    raw = env.get(env_vars.GYM_TELEMETRY_EXCLUDED_PATHS)
    spec = DEFAULT_EXCLUDED_PATHS if raw is None else raw
    return frozenset(p.strip() for p in spec.split(",") if p.strip())


def start_server_telemetry(server: object) -> bool:
    """Record the identity of this Gym server process and set up the SDK. Never raises.

    Idempotent (``init_telemetry`` is). Returns whether spans will be exported.
    """
    try:
        config = getattr(server, "config", None)
        server_name = os.environ.get(env_vars.NEMO_GYM_CONFIG_PATH) or getattr(config, "name", None)
        server_type = server_type_of(type(server))
        rollout_correlation.bind_fallback()
        RUNTIME.server_name = str(server_name) if server_name else None
        RUNTIME.server_type = server_type
        RUNTIME.excluded_paths = excluded_paths()
        active = provider.init_telemetry(
            service_name_for(RUNTIME.server_name),
            server_name=RUNTIME.server_name,
            server_type=server_type,
        )
        RUNTIME.active = active
        _log.info(
            "gym_telemetry: instrumenting Gym server %s (type %s), exporting=%s",
            RUNTIME.server_name,
            server_type,
            active,
        )
        return active
    except Exception:  # boundary: telemetry must never stop a server from starting
        _log.warning("gym_telemetry: could not start telemetry for this server", exc_info=True)
        return False
