"""The patches auto-instrumentation installs, each right after its target module loads.

``install()`` registers post-import hooks (``import_hooks.when_imported``) for:

- ``fastapi.applications``: ``FastAPI(...)`` defaults its built-in telemetry (fastapi
  >= 0.165) to off -- tracing, metrics and logs -- unless the caller passed
  ``telemetry=`` explicitly; ``build_middleware_stack`` wraps the built stack in
  ``ServerSpanMiddleware`` (the one SERVER span per request), except for an app whose
  caller switched FastAPI's own tracing on (never two SERVER spans).
- ``fastapi.routing``: ``APIRouter.add_api_route`` passes every endpoint through
  ``routes.instrument_route`` (covers subclass routes, tool routes and servers that
  build their own ``FastAPI()``).
- ``nemo_gym.telemetry._fallbacks`` / ``.spans`` / ``.contrib`` / ``.endpoints``: Gym's
  own telemetry primitives and endpoint wrappers become this project's
  (``gym_primitives.REPLACEMENTS``, ``routes.ENDPOINT_REPLACEMENTS``).
- ``nemo_gym.server_utils``: ``SimpleServer.setup_telemetry`` runs
  ``identity.start_server_telemetry(self)`` (identity + SDK) instead of Gym's own
  telemetry set-up; Gym's runs only when this project's could not start (one process,
  one telemetry: :func:`patch_server_utils`). The hops' ``_traced_request``,
  ``_request_with_retries`` and the shared aiohttp session get this project's CLIENT
  span, retry count, timeout and rollout step (``hops``).
- ``nemo_gym.base_responses_api_model``: a model server's answer objects are read before
  Gym serializes them (``model_calls``: usage, response model, finish reasons).
- ``nemo_gym.mcp_auto_exposure``: a span per MCP tool call (``mcp``).
- ``ray._private.worker`` / ``ray.util.tracing.tracing_helper``: a Ray cluster started
  here gets Ray's tracing startup hook; the rollout id travels into tasks
  (``ray_tasks``).
- ``uvicorn.server``: ``Server.startup`` starts the event-loop lag probe on the server's
  loop (``gym_telemetry._live``); ``Server.shutdown`` flushes this process's spans once the graceful
  shutdown is done (``GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S``, default 2 s, ``0``: off).
  uvicorn re-raises SIGTERM after that shutdown, so a server stopped by SIGTERM
  (Kubernetes, ``docker stop``) dies by the signal and no ``atexit`` hook runs; without
  this it would lose what its batch processor still held.

Importing this module and ``install()`` import nothing beyond the standard library; each
patch imports what it needs when its target loads. Nothing else happens until a Gym
server starts; no Gym file is modified.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any, Final

from gym_telemetry import environment_variables as env_vars
from gym_telemetry.autoinstrument.import_hooks import when_imported

_log = logging.getLogger(__name__)

#: Attribute marking a function this module put in place (makes patching idempotent).
PATCHED: Final = "_gym_telemetry_patched"
#: FastAPI's own telemetry, switched off for apps whose caller did not configure it.
FASTAPI_TELEMETRY_OFF: Final[dict[str, Any]] = {"tracing": False, "metrics": False, "logs": False}
GYM_ENDPOINTS_MODULE: Final = "nemo_gym.telemetry.endpoints"
#: Gym's telemetry modules whose functions are replaced (see ``gym_primitives``).
GYM_TELEMETRY_MODULES: Final = (
    "nemo_gym.telemetry._fallbacks",
    "nemo_gym.telemetry.spans",
    "nemo_gym.telemetry.contrib",
    GYM_ENDPOINTS_MODULE,
)


class _Installed:
    __slots__ = ("done", "lock")

    def __init__(self) -> None:
        self.done = False
        self.lock = threading.Lock()


_INSTALLED: Final = _Installed()


DEFAULT_STOP_FLUSH_TIMEOUT_S: Final = 2.0


def stop_flush_timeout_s(environ: dict[str, str] | None = None) -> float:
    """``GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S`` (default 2; 0 or less: no flush; a bad
    value: the default, logged)."""
    env = os.environ if environ is None else environ
    raw = env.get(env_vars.GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S, "").strip()
    if not raw:
        return DEFAULT_STOP_FLUSH_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        _log.warning(
            "gym_telemetry: %s=%r is not a number; using %s",
            env_vars.GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S,
            raw,
            DEFAULT_STOP_FLUSH_TIMEOUT_S,
        )
        return DEFAULT_STOP_FLUSH_TIMEOUT_S


def _already(func: Any) -> bool:
    return bool(getattr(func, PATCHED, False))


def patch_fastapi_applications(module: ModuleType) -> None:
    """Defaults FastAPI's built-in telemetry to off; wraps every app's stack."""
    from gym_telemetry.autoinstrument.server_span import (
        RolloutCorrelationMiddleware,
        ServerSpanMiddleware,
    )

    app_cls = module.FastAPI
    original_init = app_cls.__init__
    original_build = app_cls.build_middleware_stack
    if _already(original_build):
        return
    import inspect

    has_option = "telemetry" in inspect.signature(original_init).parameters

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if has_option and kwargs.get("telemetry") is None:
            kwargs["telemetry"] = dict(FASTAPI_TELEMETRY_OFF)
        original_init(self, *args, **kwargs)

    @functools.wraps(original_build)
    def build_middleware_stack(self: Any) -> Any:
        stack = original_build(self)
        own = getattr(self, "_telemetry", None)
        if isinstance(own, dict) and own.get("tracing"):
            return stack  # the caller chose FastAPI's own SERVER spans: do not add a second
        if getattr(self, "_is_instrumented_by_opentelemetry", False) and hasattr(stack, "app"):
            # The stock FastAPIInstrumentor owns this app's SERVER span, and it only steps
            # in when the outermost layer is Starlette's ServerErrorMiddleware: keep that
            # layer outermost and carry just the rollout id inside it (one SERVER span).
            stack.app = RolloutCorrelationMiddleware(stack.app)
            return stack
        return ServerSpanMiddleware(stack)

    setattr(build_middleware_stack, PATCHED, True)
    setattr(__init__, PATCHED, True)
    app_cls.__init__ = __init__
    app_cls.build_middleware_stack = build_middleware_stack


def patch_fastapi_routing(module: ModuleType) -> None:
    """Every ``APIRouter.add_api_route`` endpoint goes through ``instrument_route``."""
    from gym_telemetry.autoinstrument.routes import instrument_route

    router_cls = module.APIRouter
    original = router_cls.add_api_route
    if _already(original):
        return

    @functools.wraps(original)
    def add_api_route(self: Any, path: str, endpoint: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            endpoint = instrument_route(path, endpoint)
        except Exception:  # boundary: the route is registered uninstrumented
            _log.warning("gym_telemetry: could not instrument route %s", path, exc_info=True)
        return original(self, path, endpoint, *args, **kwargs)

    setattr(add_api_route, PATCHED, True)
    router_cls.add_api_route = add_api_route


def patch_gym_telemetry_module(module: ModuleType) -> None:
    """Replace the attributes of one ``nemo_gym.telemetry`` module with this project's."""
    from gym_telemetry.autoinstrument.gym_primitives import REPLACEMENTS
    from gym_telemetry.autoinstrument.routes import ENDPOINT_REPLACEMENTS

    replacements = {**REPLACEMENTS, GYM_ENDPOINTS_MODULE: ENDPOINT_REPLACEMENTS}[module.__name__]
    for name, value in replacements.items():
        setattr(module, name, value)


def patch_server_utils(module: ModuleType) -> None:
    """``SimpleServer.setup_telemetry`` starts this project's telemetry, and Gym's own
    only when this project's is not exporting.

    One process, one telemetry: Gym's ``setup_telemetry`` calls
    ``nemo_gym.telemetry.setup.init_telemetry``, which -- once a nemo-lens with
    ``SpanRegistry`` is installed and ``NEMO_GYM_OTEL_ENABLED`` is set -- builds its own
    TracerProvider (refused as the global one, but with its own batch processor and
    OTLP exporter), sets its MeterProvider as the global one (Gym's in-process ``gym.*``
    metrics, exported beside the sidecar's derived ones) and its propagator. With
    ``GYM_TELEMETRY`` set the operator asked for this project's telemetry, so it wins:
    Gym's set-up is skipped, Gym's ``get_telemetry()`` stays None, and with it every
    ``record_*`` metric helper and the FastAPI instrumentor of
    ``instrument_app_for_telemetry`` (Gym's call sites already run through this
    project's primitives, ``gym_primitives``). Should this project's SDK not start
    (``OTEL_SDK_DISABLED``, an error), Gym's own runs as it would without the agent.
    The hops are patched here too (``hops``).
    """
    from gym_telemetry.autoinstrument.hops import patch as patch_hops
    from gym_telemetry.autoinstrument.identity import start_server_telemetry

    patch_hops(module)
    server_cls = module.SimpleServer
    original = server_cls.setup_telemetry
    if _already(original):
        return

    @functools.wraps(original)
    def setup_telemetry(self: Any) -> None:
        if not start_server_telemetry(self):
            original(self)

    setattr(setup_telemetry, PATCHED, True)
    server_cls.setup_telemetry = setup_telemetry


def patch_model_server(module: ModuleType) -> None:
    """A model server's answers are read before Gym serializes them (``model_calls``)."""
    from gym_telemetry.autoinstrument.model_calls import patch as patch_model_calls

    patch_model_calls(module)


def patch_uvicorn_server(module: ModuleType) -> None:
    """``Server.startup`` starts the lag probe on the server's loop; ``Server.shutdown``
    ends with a bounded flush of this process's spans (module doc).

    The flush blocks the (already stopped) server's loop for at most the timeout and
    never raises; in a process whose telemetry never started neither does anything.
    """
    server_cls = module.Server
    original = server_cls.shutdown
    if _already(original):
        return
    original_startup = server_cls.startup

    @functools.wraps(original_startup)
    async def startup(self: Any, *args: Any, **kwargs: Any) -> None:
        live = sys.modules.get("gym_telemetry._live")
        if live is not None:  # not imported: this process never set telemetry up
            import asyncio

            live.start_lag_probe(asyncio.get_running_loop())
        await original_startup(self, *args, **kwargs)

    setattr(startup, PATCHED, True)
    server_cls.startup = startup

    @functools.wraps(original)
    async def shutdown(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await original(self, *args, **kwargs)
        finally:
            provider = sys.modules.get("gym_telemetry.provider")
            timeout_s = stop_flush_timeout_s()
            # not imported: this process never set telemetry up, nothing to flush
            if provider is not None and timeout_s > 0 and provider.is_active():
                provider.shutdown_telemetry(timeout_s)

    setattr(shutdown, PATCHED, True)
    server_cls.shutdown = shutdown


def install() -> bool:
    """Register every hook (module doc). Idempotent and thread-safe; returns True."""
    with _INSTALLED.lock:
        if _INSTALLED.done:
            return True
        _INSTALLED.done = True
    when_imported("fastapi.routing", patch_fastapi_routing)
    when_imported("fastapi.applications", patch_fastapi_applications)
    for module_name in GYM_TELEMETRY_MODULES:
        when_imported(module_name, patch_gym_telemetry_module)
    when_imported("nemo_gym.server_utils", patch_server_utils)
    when_imported("nemo_gym.base_responses_api_model", patch_model_server)
    when_imported("uvicorn.server", patch_uvicorn_server)
    when_imported("nemo_gym.mcp_auto_exposure", _patch_mcp)
    when_imported("ray._private.worker", _patch_ray_worker)
    when_imported("ray.util.tracing.tracing_helper", _patch_ray_tracing)
    return True


def _patch_ray_worker(module: ModuleType) -> None:
    from gym_telemetry.autoinstrument.ray_tasks import patch_ray_worker

    patch_ray_worker(module)


def _patch_ray_tracing(module: ModuleType) -> None:
    from gym_telemetry.autoinstrument.ray_tasks import patch_tracing_helper

    patch_tracing_helper(module, stop_flush_timeout_s)


def _patch_mcp(module: ModuleType) -> None:
    from gym_telemetry.autoinstrument.mcp import patch_mcp_auto_exposure

    patch_mcp_auto_exposure(module)
