"""A harness's own HTTP clients in a Ray worker: ``traceparent`` and the rollout baggage.

Harness agents (``mini_swe_agent_2`` and the like) call the model server from inside a
Ray task through their own clients: litellm over httpx, or aiohttp. Gym's hop
instrumentation (``server_utils.request``) does not see those calls. In a Ray worker
(``ray_tasks``), ``instrument()`` turns on OpenTelemetry's own instrumentations for
them when they are installed: ``opentelemetry-instrumentation-httpx`` and
``opentelemetry-instrumentation-aiohttp-client``. Each call then gets a CLIENT span and
carries ``traceparent``.

The rollout id travels as W3C baggage (``nemo.gym.rollout.id``), as on Gym's own hops:
``RolloutBaggagePropagator`` is added to the process's global text-map propagator, so
the instrumentations' injection writes it from the rollout-correlation ContextVar. It
appends the member to a ``baggage`` header already there (it never replaces one) and
reads nothing on extract.

Not used in Gym server processes: there every hop already has its CLIENT span from
Gym's own call site, and instrumenting aiohttp globally would record each hop twice.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)

from gym_telemetry import rollout_correlation
from gym_telemetry.autoinstrument.propagation import BAGGAGE_KEY
from gym_telemetry.rollout_correlation import valid_rollout_id

_log = logging.getLogger(__name__)

BAGGAGE_HEADER: Final = "baggage"
#: The OpenTelemetry instrumentations turned on, by module and class name.
INSTRUMENTORS: Final = (
    ("opentelemetry.instrumentation.httpx", "HTTPXClientInstrumentor"),
    ("opentelemetry.instrumentation.aiohttp_client", "AioHttpClientInstrumentor"),
)


class RolloutBaggagePropagator(TextMapPropagator):
    """Injects ``baggage: nemo.gym.rollout.id=<id>`` for the current rollout id."""

    def extract(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        getter: Getter[CarrierT] = default_getter,
    ) -> Context:
        return context if context is not None else Context()

    def inject(
        self,
        carrier: CarrierT,
        context: Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        rollout_id = rollout_correlation.current_rollout_id()
        if not rollout_id or not valid_rollout_id(rollout_id):
            return
        member = f"{BAGGAGE_KEY}={rollout_id}"
        existing = _get(carrier, BAGGAGE_HEADER)
        if existing and BAGGAGE_KEY in existing:
            return
        setter.set(carrier, BAGGAGE_HEADER, f"{existing},{member}" if existing else member)

    @property
    def fields(self) -> set[str]:
        return {BAGGAGE_HEADER}


def _get(carrier: Any, key: str) -> str | None:
    if isinstance(carrier, Mapping) or hasattr(carrier, "get"):
        value = carrier.get(key)
        return value if isinstance(value, str) and value else None
    return None


def add_rollout_propagator() -> None:
    """Append ``RolloutBaggagePropagator`` to the global propagator (once)."""
    current = propagate.get_global_textmap()
    members = list(getattr(current, "_propagators", [current]))
    if any(isinstance(p, RolloutBaggagePropagator) for p in members):
        return
    propagate.set_global_textmap(CompositePropagator([*members, RolloutBaggagePropagator()]))


def instrument() -> list[str]:
    """Turn on the installed instrumentations (module doc); return the ones turned on.

    Idempotent; never raises (a missing or failing instrumentation is logged and skipped).
    """
    add_rollout_propagator()
    done: list[str] = []
    for module_name, class_name in INSTRUMENTORS:
        try:
            module = __import__(module_name, fromlist=[class_name])
            instrumentor = getattr(module, class_name)()
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument()
            done.append(module_name)
        except ImportError:
            _log.debug("gym_telemetry: %s is not installed", module_name)
        except Exception:  # an instrumentation that fails must not break the worker
            _log.warning("gym_telemetry: could not turn on %s", module_name, exc_info=True)
    return done
