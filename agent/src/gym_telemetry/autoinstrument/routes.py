"""Which Gym route becomes which span, and the endpoint wrappers that do it.

Two ways a route gets its span, never both:

1. Gym's own call sites: Gym 0.7.0's base classes already wrap ``/run``,
   ``/v1/responses``, ``/verify`` and the model routes with
   ``nemo_gym.telemetry.endpoints.traced_*``. The integration replaces those three
   functions with ``traced_endpoint`` / ``traced_rollout_endpoint`` /
   ``traced_verify_endpoint`` below, which build the same wrappers as
   ``gym_telemetry.endpoints`` (through ``gym_telemetry._engine``) with this module's
   ``RouteHooks``, and mark the result.
2. Every other route of a Gym server process, whoever registers it (a subclass after
   ``super()``, a server that builds its own ``FastAPI()``), goes through
   ``fastapi.routing.APIRouter.add_api_route``; ``instrument_route`` wraps it there when
   its path maps to a group (``route_span``) and it is not marked yet.

The mapping (paths after stripping Gym's ``/ng-rollout/{rollout_id}`` and token-capture
prefixes):

==========================  ==================  ==============  ===========================
path                        server type         group           span name
==========================  ==================  ==============  ===========================
``/run``                    any                 ``rollout``     ``gym.rollout``
``/verify``                 any                 ``verify``      ``gym.verify``
``/step``                   resources           ``verify``      ``gym.env.step``
``/v1/responses``           agent               ``agent``       ``gym.agent.responses``
``/v1/responses``           model               ``model_call``  ``gym.model.responses``
``/v1/chat/completions``    model               ``model_call``  ``gym.model.chat_completions``
``/v1/messages``            model               ``model_call``  ``gym.model.messages``
==========================  ==================  ==============  ===========================

Every request additionally gets its SERVER span from ``server_span``. The wrappers here
also put the rollout id on that SERVER span once it is known (the agent's ``/run``
learns it from the request body, after the SERVER span started). Both steps are hooks of
the one wrapper (``RouteHooks``), not wrappers of their own: one wrapper per route.

``/step`` is the environment step of the resources servers that build their own
``FastAPI()`` around a step loop (Gym's gymnasium base and its 8 servers, openenv,
aviary, toolsandbox, osworld): their reward comes from ``/step``, not ``/verify``.

Spans the route hook adds carry ``nemo.gym.server.name`` (the Gym server's config name),
as the spans of Gym's base-class call sites do.

A ``/run`` is marked nested only when a *recorded* ``gym.rollout`` span encloses it:
in this process (``rollout_correlation.ENCLOSING_ROLLOUT``, set by the rollout wrapper), or
upstream, when the request's baggage carries ``nemo.gym.rollout.outer=1`` (written by
``propagation.inject`` inside a recorded rollout; the SERVER layer sets
``ENCLOSING_ROLLOUT`` from it). A rollout id arriving by baggage or by the
``/ng-rollout/<id>/`` prefix alone does not: the caller may have recorded no rollout.
Sync and async ``/run`` handlers are treated alike.
"""

from __future__ import annotations

import contextlib
import logging
from contextvars import Token
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gym_telemetry import _engine, rollout_correlation, span_groups
from gym_telemetry._lean import context as lean_context
from gym_telemetry._lean.sdk_hooks import SPAN_KEY
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.autoinstrument.identity import (
    RUNTIME,
    SERVER_TYPE_AGENT,
    SERVER_TYPE_MODEL,
    SERVER_TYPE_RESOURCES,
)

_log = logging.getLogger(__name__)

#: Attribute set on every endpoint this module wrapped (value: the span group).
MARKER: Final = "_gym_telemetry_group"
#: How deep to follow ``__wrapped__`` looking for the marker.
MAX_UNWRAP_DEPTH: Final = 16

_ROLLOUT_PREFIX: Final = "/ng-rollout/{"
_TOKEN_CAPTURE: Final = "/training-token-capture"
_MODEL_ROUTES: Final[dict[str, str]] = {
    "/v1/responses": semconv.SPAN_MODEL_RESPONSES,
    "/v1/chat/completions": semconv.SPAN_MODEL_CHAT,
    "/v1/messages": semconv.SPAN_MODEL_MESSAGES,
}
_ENABLED: Final = span_groups.ENABLED
_SERVER: Final = semconv.GROUP_SERVER


def normalise_path(path: str) -> str:
    """Strip Gym's ``/ng-rollout/{rollout_id}`` and token-capture route prefixes."""
    if path.startswith(_ROLLOUT_PREFIX):
        close = path.find("}", len(_ROLLOUT_PREFIX))
        if close != -1:
            path = path[close + 1 :] or "/"
    if path.startswith(_TOKEN_CAPTURE + "/"):
        path = path[len(_TOKEN_CAPTURE) :]
    return path


def route_span(path: str, server_type: str | None) -> tuple[str, str] | None:
    """``(group, span name)`` for a route of a server of ``server_type``, or None."""
    path = normalise_path(path)
    if path == "/run":
        return semconv.GROUP_ROLLOUT, semconv.SPAN_ROLLOUT
    if path == "/verify":
        return semconv.GROUP_VERIFY, semconv.SPAN_VERIFY
    if path == "/step" and server_type == SERVER_TYPE_RESOURCES:
        return semconv.GROUP_VERIFY, semconv.SPAN_ENV_STEP
    if server_type == SERVER_TYPE_MODEL and path in _MODEL_ROUTES:
        return semconv.GROUP_MODEL_CALL, _MODEL_ROUTES[path]
    if server_type == SERVER_TYPE_AGENT and path == "/v1/responses":
        return semconv.GROUP_AGENT, semconv.SPAN_AGENT_RESPONSES
    return None


def is_marked(endpoint: Any) -> bool:
    """Whether ``endpoint`` (or something it wraps) was wrapped by this module."""
    current = endpoint
    for _ in range(MAX_UNWRAP_DEPTH):
        if current is None:
            return False
        if getattr(current, MARKER, None) is not None:
            return True
        current = getattr(current, "__wrapped__", None)
    return False


def _mark(wrapper: Any, group: str) -> Any:
    with contextlib.suppress(AttributeError, TypeError):  # a callable without __dict__
        setattr(wrapper, MARKER, group)
    return wrapper


def tag_server_span() -> None:
    """Put the current rollout id on the request's SERVER span if it lacks it."""
    span = lean_context.get_current().get(SPAN_KEY)
    if type(span) is LeanSpan:  # the id is looked up only when the span lacks it
        span.set_if_absent(semconv.ROLLOUT_ID, _current_rollout_id, SpanKind.SERVER)
        return
    rollout_id = rollout_correlation.current_rollout_id()
    if not rollout_id:
        return
    span = trace.get_current_span()
    if getattr(span, "kind", None) is not SpanKind.SERVER or not span.is_recording():
        return
    attributes = getattr(span, "attributes", None)
    if attributes is not None and semconv.ROLLOUT_ID in attributes:
        return
    span.set_attribute(semconv.ROLLOUT_ID, rollout_id)


class RouteHooks(_engine.Hooks):
    """The auto-instrumentation's steps in a route's one wrapper, before its gate:

    - ``/run`` only (``body_rollout``): when no rollout id is known yet (Gym's, or
      telemetry's from the hop) and some span group is on, the id derived from the
      request body with Gym's own rule (``rollout_correlation.rollout_id_from_body``;
      a sync handler: its parsed request models only) becomes telemetry's rollout id
      for the call, before the rollout span starts. Whether the span is nested is not
      decided here (module doc).
    - every route: with group ``server`` on, the request's SERVER span gets the rollout
      id if it lacks it (``tag_server_span``).

    Best effort: a failure of either step is swallowed (the request is unaffected).
    """

    __slots__ = ("awaits", "body_rollout")

    def __init__(self, body_rollout: bool = False) -> None:
        self.body_rollout = body_rollout
        # Only a /run's body id may need the raw request body read (awaited).
        self.awaits = body_rollout

    def enter(self, kwargs: dict[str, Any]) -> Token[Any] | None:
        token = None
        if self.body_rollout and _needs_body_id():
            try:
                rollout_id = rollout_correlation.rollout_id_from_models(kwargs)
            except Exception:  # best effort
                rollout_id = None
            if rollout_id is not None:
                token = _OWN_ID.set(rollout_id)
        if _SERVER in _ENABLED.groups:  # _tag, inlined: once per request on every route
            try:
                tag_server_span()
            except Exception:  # tagging is best effort
                _log.debug("gym_telemetry: could not tag the server span", exc_info=True)
        return token

    async def aenter(self, kwargs: dict[str, Any]) -> Token[Any] | None:
        rollout_id = None
        if self.body_rollout and _needs_body_id():
            try:
                rollout_id = await rollout_correlation.rollout_id_from_body(kwargs)
            except Exception:  # best effort
                rollout_id = None
        return _begin(rollout_id)

    def leave(self, token: Token[Any]) -> None:
        _OWN_ID.reset(token)


_OWN_ID: Final = rollout_correlation.ROLLOUT_ID_VAR
_current_rollout_id: Final = rollout_correlation.current_rollout_id
_TAGGING: Final = RouteHooks()
_RUN: Final = RouteHooks(body_rollout=True)


def _begin(rollout_id: str | None) -> Token[Any] | None:
    """Make ``rollout_id`` (if any) telemetry's id for the call, then tag the SERVER span."""
    token = _OWN_ID.set(rollout_id) if rollout_id is not None else None
    _tag()
    return token


def _needs_body_id() -> bool:
    return bool(_ENABLED.groups) and rollout_correlation.current_rollout_id() is None


def _tag() -> None:
    if _SERVER in _ENABLED.groups:
        try:
            tag_server_span()
        except Exception:  # tagging is best effort
            _log.debug("gym_telemetry: could not tag the server span", exc_info=True)


def traced_endpoint(
    group: str, span_name: str, handler: Any, static_attributes: dict[str, Any] | None = None
) -> Any:
    """``gym_telemetry.endpoints.traced_endpoint``, marked, tagging the SERVER span."""
    _engine.check_group(group, span_name)
    wrapped = _engine.wrap(group, span_name, handler, static_attributes, hooks=_TAGGING)
    return _mark(wrapped, group)


def traced_rollout_endpoint(handler: Any, static_attributes: dict[str, Any] | None = None) -> Any:
    """``gym_telemetry.endpoints.traced_rollout_endpoint``, marked, tagging the SERVER span.

    When Gym has not set a rollout id (capture off), the id is derived from the ``/run``
    body with Gym's own rule, as telemetry's id, before the rollout span starts.
    """
    wrapped = _engine.wrap_rollout(handler, static_attributes, hooks=_RUN)
    return _mark(wrapped, semconv.GROUP_ROLLOUT)


def traced_verify_endpoint(handler: Any, static_attributes: dict[str, Any] | None = None) -> Any:
    """``gym_telemetry.endpoints.traced_verify_endpoint``, marked, tagging the SERVER span."""
    wrapped = _engine.wrap_verify(semconv.SPAN_VERIFY, handler, static_attributes, _TAGGING)
    return _mark(wrapped, semconv.GROUP_VERIFY)


def traced_env_step_endpoint(handler: Any, static_attributes: dict[str, Any] | None = None) -> Any:
    """``gym_telemetry.endpoints.traced_env_step_endpoint``, marked, tagging the SERVER span."""
    wrapped = _engine.wrap_verify(semconv.SPAN_ENV_STEP, handler, static_attributes, _TAGGING)
    return _mark(wrapped, semconv.GROUP_VERIFY)


def instrument_route(path: str, endpoint: Any) -> Any:
    """The endpoint to register for ``path``: wrapped when it maps to a group (see doc)."""
    if RUNTIME.server_type is None or is_marked(endpoint):
        return endpoint
    mapped = route_span(path, RUNTIME.server_type)
    if mapped is None:
        return endpoint
    group, span_name = mapped
    attributes = {semconv.SERVER_NAME: RUNTIME.server_name} if RUNTIME.server_name else None
    if group == semconv.GROUP_ROLLOUT:
        wrapped = traced_rollout_endpoint(endpoint, attributes)
    elif span_name == semconv.SPAN_VERIFY:
        wrapped = traced_verify_endpoint(endpoint, attributes)
    elif span_name == semconv.SPAN_ENV_STEP:
        wrapped = traced_env_step_endpoint(endpoint, attributes)
    else:
        wrapped = traced_endpoint(group, span_name, endpoint, attributes)
    _log.debug("gym_telemetry: route %s -> %s (%s)", path, span_name, group)
    return wrapped


#: Replacements for ``nemo_gym.telemetry.endpoints``, applied by the Gym integration.
ENDPOINT_REPLACEMENTS: Final[dict[str, Any]] = {
    "traced_endpoint": traced_endpoint,
    "traced_rollout_endpoint": traced_rollout_endpoint,
    "traced_verify_endpoint": traced_verify_endpoint,
}
