"""Traces through Ray tasks: Ray's own tracing hook, with the rollout id carried along.

Harness agents (``mini_swe_agent_2``, ``mini_swe_agent``, ``harbor_agent``, ...) run a
whole rollout inside a Ray task. Ray has its own OpenTelemetry support
(``ray.util.tracing``): a cluster started with a *tracing startup hook* runs that hook
in every process that connects to it (drivers and workers), injects the caller's
context into each task's keyword arguments (``_ray_trace_ctx``), and makes it the
parent of the task's execution, with a PRODUCER span at submission and a CONSUMER span
around the execution (scope ``ray.util.tracing.tracing_helper``). This module uses it:

- ``patch_ray_worker``: ``ray.init`` called in a process with ``GYM_TELEMETRY`` set, to
  *start* a cluster (no ``address`` argument, no ``RAY_ADDRESS``), gets
  ``_tracing_startup_hook=HOOK`` unless the caller chose one. That is how Gym's launcher
  (or a Gym server) starts Ray. For a cluster started by ``ray start``, pass
  ``--tracing-startup-hook=gym_telemetry.autoinstrument.ray_tasks:setup_tracing``.
- ``setup_tracing`` (the hook): in a Ray *worker* process it sets up the SDK as a Gym
  server does (``provider.init_telemetry``: the sidecar endpoint and span groups from
  the environment the worker inherited), with ``service.name`` =
  ``<prefix>/ray-worker`` and no server type; a span processor that puts the current
  rollout id on every span started in the worker; the harness HTTP
  instrumentations (``harness_http``); and threads started in the worker run in a copy
  of their starter's context (a harness's cleanup thread stays in the rollout's trace).
  In a driver (a Gym server, the launcher) it does nothing: a Gym server sets up its
  own SDK when its webserver starts.
- ``patch_tracing_helper``: the rollout id travels with the context. At submission the
  ``_ray_trace_ctx`` dict gets the W3C baggage member ``nemo.gym.rollout.id`` (and the
  PRODUCER span the id as an attribute); in the worker, the task runs inside
  ``own_rollout_context(<that id>)``, so every span it makes (sandbox, HTTP, Ray's
  CONSUMER span) carries it, and its hops carry it on. When the task ends, the worker
  flushes its spans (bounded by ``GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S``): Ray may end an
  idle worker at any time, and its atexit hooks do not always run.

Ray's own spans are not in a span group: they pass the sidecar as they are. Nothing
here runs, and nothing is imported, unless Ray is imported in an activated process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Final

_log = logging.getLogger(__name__)

HOOK: Final = "gym_telemetry.autoinstrument.ray_tasks:setup_tracing"
WORKER_SERVER_NAME: Final = "ray-worker"
_PATCHED: Final = "_gym_telemetry_patched"
_CONTEXT_KEY: Final = "gym_telemetry.rollout_id"


def _starts_cluster(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    address = args[0] if args else kwargs.get("address")
    return not address and not os.environ.get("RAY_ADDRESS")


def patch_ray_worker(module: ModuleType) -> None:
    """``ray._private.worker.init`` adds the tracing startup hook when it starts a cluster."""
    original = getattr(module, "init", None)
    if original is None or getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        if "_tracing_startup_hook" not in kwargs and _starts_cluster(args, kwargs):
            kwargs["_tracing_startup_hook"] = HOOK
        return original(*args, **kwargs)

    setattr(init, _PATCHED, True)
    module.init = init  # type: ignore[attr-defined]


def _in_worker() -> bool:
    try:
        ray = sys.modules.get("ray")
        if ray is None:
            return False
        worker = ray._private.worker.global_worker
        return bool(worker.mode == ray.WORKER_MODE)
    except Exception:  # not a Ray process we understand: treat as a driver
        return False


def _rollout_id_processor() -> Any:
    """A span processor that puts the current rollout id on every span started in this
    (worker) process. A subclass of the SDK's ``SpanProcessor`` (the SDK calls hooks of
    its own on every processor); never raises."""
    from gym_telemetry_semconv import ROLLOUT_ID
    from opentelemetry.sdk.trace import SpanProcessor

    from gym_telemetry import rollout_correlation

    class RolloutIdProcessor(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            try:
                rollout_id = rollout_correlation.current_rollout_id()
                if rollout_id and ROLLOUT_ID not in (span.attributes or {}):
                    span.set_attribute(ROLLOUT_ID, rollout_id)
            except Exception:  # a span without the id is still a span
                _log.debug("gym_telemetry: could not tag a span", exc_info=True)

    return RolloutIdProcessor()


def setup_tracing() -> None:
    """Ray's tracing startup hook (module doc). Never raises."""
    try:
        if not _in_worker():
            return
        from opentelemetry import trace

        from gym_telemetry import provider, rollout_correlation
        from gym_telemetry.autoinstrument import harness_http
        from gym_telemetry.autoinstrument.identity import service_name_for

        rollout_correlation.bind_fallback()
        if not provider.init_telemetry(
            service_name_for(WORKER_SERVER_NAME), server_name=WORKER_SERVER_NAME
        ):
            return
        sdk_provider = trace.get_tracer_provider()
        add = getattr(sdk_provider, "add_span_processor", None)
        if add is not None:
            add(_rollout_id_processor())
        harness_http.instrument()
        _carry_context_into_threads()
        _log.info("gym_telemetry: instrumenting Ray worker %d", os.getpid())
    except Exception:  # boundary: a worker must start whatever telemetry does
        _log.warning("gym_telemetry: could not set up telemetry in a Ray worker", exc_info=True)


def _carry_context_into_threads() -> None:
    """In this worker, a thread started inside a task runs in a copy of the starter's
    context (trace context and rollout id): harnesses tear sandboxes down from their own
    threads (``mini_swe_agent_2``'s cleanup thread), whose spans would otherwise start
    new traces without the rollout id. Idempotent."""
    import contextvars
    import threading

    original = threading.Thread.start
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def start(self: threading.Thread) -> None:
        context = contextvars.copy_context()
        run = self.run
        self.run = lambda: context.run(run)  # type: ignore[method-assign]
        original(self)

    setattr(start, _PATCHED, True)
    threading.Thread.start = start  # type: ignore[method-assign]


def _flush(timeout_s: float) -> None:
    from opentelemetry import trace

    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if timeout_s > 0 and flush is not None:
        flush(int(timeout_s * 1000))


def patch_tracing_helper(module: ModuleType, flush_timeout_s: Callable[[], float]) -> None:
    """Carry the rollout id through ``_ray_trace_ctx`` (module doc); a worker flushes for
    at most ``flush_timeout_s()`` seconds after each task. Idempotent."""
    propagator = getattr(module, "_DictPropagator", None)
    original_use = getattr(module, "_use_context", None)
    if propagator is None or original_use is None or getattr(original_use, _PATCHED, False):
        return
    original_inject = propagator.inject_current_context
    original_extract = propagator.extract

    from opentelemetry import context as context_api
    from opentelemetry import trace

    from gym_telemetry import rollout_correlation
    from gym_telemetry.autoinstrument import propagation

    def inject_current_context() -> dict[Any, Any]:
        carrier: dict[Any, Any] = original_inject()
        try:
            rollout_id = rollout_correlation.current_rollout_id()
            if rollout_id and rollout_correlation.valid_rollout_id(rollout_id):
                member = f"{propagation.BAGGAGE_KEY}={rollout_id}"
                existing = carrier.get("baggage")
                carrier["baggage"] = f"{existing},{member}" if existing else member
                trace.get_current_span().set_attribute(propagation.BAGGAGE_KEY, rollout_id)
        except Exception:  # the task still runs, without the id
            _log.debug("gym_telemetry: could not add the rollout id to a task", exc_info=True)
        return carrier

    def extract(context_dict: dict[Any, Any]) -> Any:
        ctx = original_extract(context_dict)
        try:
            header = context_dict.get("baggage") if isinstance(context_dict, dict) else None
            if isinstance(header, str):
                rollout_id = propagation.rollout_id_from_baggage(header.encode("latin-1"))
                if rollout_id is not None:
                    ctx = context_api.set_value(_CONTEXT_KEY, rollout_id, ctx)
        except Exception:  # the task still runs, without the id
            _log.debug("gym_telemetry: could not read a task's rollout id", exc_info=True)
        return ctx

    @contextlib.contextmanager
    def _use_context(parent_context: Any) -> Iterator[None]:
        rollout_id = None
        if parent_context is not None:
            rollout_id = context_api.get_value(_CONTEXT_KEY, parent_context)
        try:
            with (
                original_use(parent_context),
                rollout_correlation.own_rollout_context(
                    rollout_id if isinstance(rollout_id, str) else None
                ),
            ):
                yield
        finally:
            if _in_worker():
                try:
                    _flush(flush_timeout_s())
                except Exception:  # best effort
                    _log.debug("gym_telemetry: flush after a Ray task failed", exc_info=True)

    setattr(_use_context, _PATCHED, True)
    propagator.inject_current_context = staticmethod(inject_current_context)
    propagator.extract = staticmethod(extract)
    module._use_context = _use_context  # type: ignore[attr-defined]
