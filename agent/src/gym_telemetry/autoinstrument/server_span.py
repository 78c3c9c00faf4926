"""The one SERVER span per request, as the outermost ASGI layer of every FastAPI app.

``ServerSpanMiddleware(app)`` wraps an app's built middleware stack (the Gym
integration installs it from ``FastAPI.build_middleware_stack``), so it sees every
request before Gym's own middlewares and the final status after them. Per HTTP request:

1. Nothing at all until this process's Gym server has started telemetry
   (``RUNTIME.active``), while every span group is off, for non-HTTP scopes, and for
   the excluded paths (health probes, ``GYM_TELEMETRY_EXCLUDED_PATHS``).
2. One pass over the request headers for ``traceparent``, ``tracestate`` and
   ``baggage``. The rollout id comes from a ``/ng-rollout/<id>/`` path prefix, else from
   the ``nemo.gym.rollout.id`` baggage member; when found it is telemetry's rollout id
   for the whole request (``rollout_correlation.ROLLOUT_ID_VAR``, read as the fallback
   when Gym has no id; Gym's own ContextVar is not touched). A ``nemo.gym.rollout.outer=1``
   baggage member (the caller made the hop inside a recorded ``gym.rollout`` span) sets
   ``rollout_correlation.ENCLOSING_ROLLOUT`` for the request, so a ``/run`` it reaches -- sync or
   async -- is marked nested. When the request's trace has a rollout in flight in this
   process (an agent calling its own ``/v1/responses`` from its ``/run``), its
   ``inflight`` record is what is set, so the hops made while serving the request
   update that rollout's step and turns.
3. Group ``server`` disabled: the remote parent (if any) is made current so the spans of
   other groups still join the caller's trace; no span.
4. Group ``server`` enabled: one SERVER-kind span, scope ``gym_telemetry.server``, child
   of the remote parent, current for the request, recorded through the lean path of
   ``gym_telemetry._lean`` (``GYM_TELEMETRY_RECORDER=sdk``: ``Tracer.start_span``).
   Named ``<METHOD> <route template>`` when routing matched,
   ``<METHOD> <path after the /ng-rollout/<id> prefix>`` for Gym's rollout-prefixed
   calls that Gym's ``RolloutContextMiddleware`` routed on a copy of the scope (their
   ``http.route`` is the template of the app's route matching that path, looked up
   once per distinct path, ``MAX_PREFIXED_ROUTES`` at most),
   the template of a plain Starlette route that served the request (Gym's MCP
   ``/mcp``), looked up the same way, ``<METHOD>`` otherwise, with
   ``http.request.method``, ``http.route``, ``http.response.status_code`` and the
   rollout id. Status ERROR for an exception or a 5xx.

5. A ``/run`` (agent route, plain or ``/ng-rollout/<id>/run``) that arrives with a
   ``traceparent`` but without the outer-rollout marker is the outermost rollout under a
   caller that is not Gym (a trainer's rollout dispatch). In ``link`` mode (the default,
   ``GYM_TELEMETRY_TRAINER_CONTEXT=link``) it starts a new trace: its SERVER span is a
   root with a span link to the incoming span context, so each rollout stays one trace
   (per-rollout tail sampling, rollout search) and still points at the training step.
   ``continue`` keeps the caller's trace (the rollout becomes a subtree of it). With the
   ``server`` group off the ``/run`` still starts its own trace, without the link.

FastAPI's built-in telemetry is switched off for Gym's apps by the integration, so this
is the only SERVER span. A nested app (a mounted FastAPI) sees the marker this layer
puts in the scope and does not add a second span. Telemetry failures are counted
(``failures()``) and never reach the request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode

from gym_telemetry import environment_variables, inflight, span_groups
from gym_telemetry._lean.context import attach as _attach
from gym_telemetry._lean.context import detach as _detach
from gym_telemetry._lean.context import with_span as _with_span
from gym_telemetry._lean.recorder import LeanRecorder, SdkRecorder, recorder_for
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.asgi import ASGIApp, Message, Receive, Scope, Send
from gym_telemetry.autoinstrument.identity import RUNTIME
from gym_telemetry.autoinstrument.propagation import (
    outer_rollout_in_baggage,
    parse_traceparent,
    read_rollout_baggage,
    rollout_id_from_baggage,
)
from gym_telemetry.rollout_correlation import (
    ENCLOSING_ROLLOUT,
    ROLLOUT_ID_VAR,
    ROLLOUT_PATH_PREFIX,
    call_with_rollout_id,
    rollout_id_from_path,
)

_log = logging.getLogger(__name__)

#: How an outermost ``/run`` treats an incoming ``traceparent`` (module doc, point 5).
ENV_TRAINER_CONTEXT: Final = environment_variables.GYM_TELEMETRY_TRAINER_CONTEXT
TRAINER_CONTEXT_LINK: Final = "link"
TRAINER_CONTEXT_CONTINUE: Final = "continue"
TRAINER_CONTEXT_MODES: Final = (TRAINER_CONTEXT_LINK, TRAINER_CONTEXT_CONTINUE)
_ROOT_CONTEXT: Final = context_api.Context()
_RUN_SUFFIX: Final = "/run"


#: Scope key marking that an outer layer already handles this request.
SCOPE_MARKER: Final = "gym_telemetry.server_span"
HTTP_METHOD: Final = semconv.HTTP_REQUEST_METHOD
HTTP_ROUTE: Final = semconv.HTTP_ROUTE
HTTP_STATUS: Final = semconv.HTTP_RESPONSE_STATUS_CODE
#: Distinct (app, method, path) lookups of prefixed requests' route templates kept.
MAX_PREFIXED_ROUTES: Final = 1024

_GROUP: Final = semconv.GROUP_SERVER
_ENABLED: Final = span_groups.ENABLED
_ERROR: Final = Status(StatusCode.ERROR)
_ENCLOSING: Final = ENCLOSING_ROLLOUT
_SERVER: Final = SpanKind.SERVER
_OWN_ID: Final = ROLLOUT_ID_VAR
_tracers = span_groups._tracers  # group -> tracer cache (cleared when the provider changes)


class _Recorder:
    """The recording path of the ``server`` group's tracer, re-resolved only when the
    tracer changes (a new provider) or was a proxy with no SDK behind it yet."""

    __slots__ = ("recorder", "tracer")

    def __init__(self) -> None:
        self.tracer: object = None
        self.recorder: LeanRecorder | SdkRecorder | None = None


_RECORDER: Final = _Recorder()


def _recorder() -> LeanRecorder | SdkRecorder:
    """The recorder of the ``server`` group's current tracer (re-resolved when the tracer
    changed or was a proxy with no SDK behind it)."""
    tracer = span_groups.tracer_for(_GROUP)
    recorder = _RECORDER.recorder
    if tracer is not _RECORDER.tracer or recorder is None or recorder.provisional:
        recorder = _RECORDER.recorder = recorder_for(tracer)
        _RECORDER.tracer = tracer
    return recorder


class _Failures:
    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


_FAILURES: Final = _Failures()


class _TrainerContext:
    """The ``GYM_TELEMETRY_TRAINER_CONTEXT`` mode, read once (first request) from the
    environment; an unknown value warns once and means ``link``."""

    __slots__ = ("link",)

    def __init__(self) -> None:
        self.link: bool | None = None

    def links(self) -> bool:
        link = self.link
        if link is None:
            raw = os.environ.get(ENV_TRAINER_CONTEXT, TRAINER_CONTEXT_LINK).strip().lower()
            if raw not in TRAINER_CONTEXT_MODES:
                _log.warning(
                    "gym_telemetry: %s=%r is not one of %s; using %r",
                    ENV_TRAINER_CONTEXT,
                    raw,
                    "/".join(TRAINER_CONTEXT_MODES),
                    TRAINER_CONTEXT_LINK,
                )
                raw = TRAINER_CONTEXT_LINK
            link = self.link = raw == TRAINER_CONTEXT_LINK
        return link


TRAINER_CONTEXT: Final = _TrainerContext()
"""Tests reset ``TRAINER_CONTEXT.link = None`` after changing the environment."""


def _is_run(path: str) -> bool:
    """``/run`` or ``/ng-rollout/<id>/run`` (the agent's rollout route)."""
    if path == _RUN_SUFFIX:
        return True
    return (
        path.startswith(ROLLOUT_PATH_PREFIX)
        and path.endswith(_RUN_SUFFIX)
        and path.count("/") == 3  # /ng-rollout/<id>/run
    )


def failures() -> int:
    """Telemetry failures swallowed by this layer (the requests were unaffected)."""
    return _FAILURES.count


def _record_failure(where: str) -> None:
    _FAILURES.count += 1
    if _FAILURES.count == 1 or _FAILURES.count % 1000 == 0:
        _log.warning(
            "gym_telemetry: server span failure in %s (%d so far)",
            where,
            _FAILURES.count,
            exc_info=True,
        )


class ServerSpanMiddleware:
    """ASGI wrapper adding the SERVER span and the rollout/trace context (module doc).

    One coroutine frame per request: every ``await`` below it that suspends (Gym's
    middlewares run the app in a task) resumes each frame of the chain above it, so the
    layer's steps are written out here instead of in coroutines of their own.
    """

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not RUNTIME.active
            or not _ENABLED.groups
            or scope["type"] != "http"
            or SCOPE_MARKER in scope
            or scope["path"] in RUNTIME.excluded_paths
        ):
            await self.app(scope, receive, send)
            return
        try:
            # The last of each repeated header, as a scan would keep (one C call).
            headers = dict(scope["headers"])
            traceparent = headers.get(b"traceparent")
            baggage = headers.get(b"baggage")
            path = scope["path"]
            rollout_id = None
            if path.startswith(ROLLOUT_PATH_PREFIX):
                rollout_id = rollout_id_from_path(path)
            outer = False
            if baggage is not None:
                baggage_id, outer = read_rollout_baggage(baggage)
                if rollout_id is None:
                    rollout_id = baggage_id
            parent = None
            if traceparent:
                parent = parse_traceparent(traceparent, headers.get(b"tracestate"))
            link = None
            if (
                parent is not None
                and not outer
                and path.endswith(_RUN_SUFFIX)
                and _is_run(path)
                and TRAINER_CONTEXT.links()
            ):
                link, parent = parent, None
                remote = True  # the request starts a new trace (module doc, point 5)
            else:
                remote = parent is not None
        except Exception:  # bad headers must not fail the request
            _record_failure("header parsing")
            await self.app(scope, receive, send)
            return
        scope[SCOPE_MARKER] = True
        enclosing = _ENCLOSING.set(_enclosing(parent)) if outer else None
        own_id = _OWN_ID.set(rollout_id) if rollout_id is not None else None
        try:
            if _GROUP not in _ENABLED.groups:
                # No span: the caller's context is made current, so the spans of the other
                # groups still join the caller's trace.
                token: object = None
                if remote:  # the caller's span, or a new trace for an outermost /run
                    token = _attach(
                        _ROOT_CONTEXT
                        if parent is None
                        else _with_span(NonRecordingSpan(parent), _ROOT_CONTEXT)
                    )
                try:
                    await self.app(scope, receive, send)
                finally:
                    if token is not None:
                        _detach(token)
                return
            method = scope.get("method") or "HTTP"
            try:
                attributes: dict[str, Any] = {HTTP_METHOD: method}
                if rollout_id is not None:
                    attributes[semconv.ROLLOUT_ID] = rollout_id
                recorder = _RECORDER.recorder
                if (
                    recorder is None
                    or recorder.provisional
                    or _RECORDER.tracer is not _tracers.get(_GROUP)
                ):
                    recorder = _recorder()
                if remote:
                    span, token = recorder.start_under(method, attributes, _SERVER, parent)
                else:
                    span, token = recorder.start(method, attributes, _SERVER)
            except Exception:
                _record_failure("span start")
                await self.app(scope, receive, send)
                return
            if link is not None:
                try:
                    span.add_link(link)
                except Exception:  # the request goes on without the link
                    _record_failure("span link")
            status_send = _new_status_send(_StatusSend)  # no __init__ frame per request
            status_send.send = send
            status_send.status = 0
            failed: BaseException | None = None
            try:
                await self.app(scope, receive, status_send)
            except BaseException as exc:
                failed = exc
                raise
            finally:
                try:
                    _detach(token)
                    _finish(span, scope, method, status_send.status, failed)
                except Exception:
                    _record_failure("span end")
        finally:
            if own_id is not None:
                _OWN_ID.reset(own_id)
            if enclosing is not None:
                _ENCLOSING.reset(enclosing)


def _enclosing(parent: Any) -> bool | inflight.InFlight:
    """What ``ENCLOSING_ROLLOUT`` holds for a request relayed from inside a rollout: the
    rollout's record when it is in flight here, else True."""
    if parent is None:
        return True
    try:
        return inflight.for_trace(parent.trace_id) or True
    except Exception:  # an odd parent: the rollout stays an upstream one
        return True


class RolloutCorrelationMiddleware:
    """The rollout-id part of :class:`ServerSpanMiddleware` alone, for apps whose SERVER
    span belongs to another instrumentation (the stock ``FastAPIInstrumentor``).

    It sits inside that instrumentation's span and changes no trace context: it only
    makes the rollout id from the ``/ng-rollout/<id>/`` prefix or the baggage member
    telemetry's rollout id for the request, so the route spans still carry it, and
    honours the outer-rollout baggage marker (``ENCLOSING_ROLLOUT``) the same way.
    """

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rollout_id = None
        outer = False
        if RUNTIME.active and scope["type"] == "http":
            try:
                rollout_id = rollout_id_from_path(scope["path"])
                for key, value in scope["headers"]:
                    if key == b"baggage":
                        if rollout_id is None:
                            rollout_id = rollout_id_from_baggage(value)
                        outer = outer_rollout_in_baggage(value)
                        break
            except Exception:  # bad headers must not fail the request
                _record_failure("header parsing")
        if not outer:
            await call_with_rollout_id(self.app, scope, receive, send, rollout_id)
            return
        token = _ENCLOSING.set(_enclosing(trace.get_current_span().get_span_context()))
        try:
            await call_with_rollout_id(self.app, scope, receive, send, rollout_id)
        finally:
            _ENCLOSING.reset(token)


class _StatusSend:
    """``send`` that remembers the response status. One slotted object per request
    instead of a closure (function, cells and a list): Gym's middlewares keep ``send``
    in frames that only the cyclic GC frees, so fewer objects there is less GC work.
    Not a coroutine: it returns what the wrapped ``send`` returns (an awaitable), so a
    message costs no coroutine of its own."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    def __call__(self, message: Message) -> Awaitable[None]:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        return self.send(message)


_new_status_send: Final = object.__new__

_PREFIXED_ROUTES: dict[tuple[int, str, str], str | None] = {}


def _route_template(scope: Scope, method: str, path: str) -> str | None:
    """The template of the route of ``scope["app"]`` that ``method path`` matches, or None.

    For requests Gym routed on a copy of the scope (``/ng-rollout/<id>`` stripped), so
    the matched route never appears in this layer's scope. Cached per (app, method,
    path) up to ``MAX_PREFIXED_ROUTES`` entries; the paths of such calls are a handful of
    model/agent routes.
    """
    app = scope.get("app")
    key = (id(app), method, path)
    if key in _PREFIXED_ROUTES:
        return _PREFIXED_ROUTES[key]
    found: str | None = None
    routes = getattr(getattr(app, "router", None), "routes", None) or ()
    probe = {"type": "http", "path": path, "method": method, "root_path": ""}
    for route in routes:
        try:
            match, _child = route.matches(probe)
        except Exception:  # a route type that cannot match a bare scope
            continue
        if getattr(match, "name", "") == "FULL":
            template = getattr(route, "path", None)
            found = template if isinstance(template, str) else None
            break
    if len(_PREFIXED_ROUTES) < MAX_PREFIXED_ROUTES:
        _PREFIXED_ROUTES[key] = found
    return found


def _finish(
    span: trace.Span, scope: Scope, method: str, status: int, failed: BaseException | None
) -> None:
    attributes: dict[str, Any] = {}
    name = None
    route = scope.get("route")
    template = getattr(route, "path", None)
    if isinstance(template, str):
        name = _SPAN_NAMES.get((method, template)) or _span_name(method, template)
        attributes[HTTP_ROUTE] = template
    elif scope["path"].startswith(ROLLOUT_PATH_PREFIX):
        # Gym's RolloutContextMiddleware routes a copy of the scope with the
        # ``/ng-rollout/<id>`` prefix stripped, so the route is not visible here; the
        # rest of the path is the route Gym dispatched to.
        rest = "/" + scope["path"][len(ROLLOUT_PATH_PREFIX) :].partition("/")[2]
        template = _route_template(scope, method, rest)
        name = _span_name(method, rest if template is None else template)
        if template is not None:
            attributes[HTTP_ROUTE] = template
    elif 0 < status < 400:
        # Served by a plain Starlette route (Gym's MCP ``/mcp`` Route/Mount), which puts no
        # ``route`` in the scope: its template is looked up once per distinct path. Not for
        # 404s, so unmatched paths never fill the lookup cache.
        template = _route_template(scope, method, scope["path"])
        if template is not None:
            name = _span_name(method, template)
            attributes[HTTP_ROUTE] = template
    if status:
        attributes[HTTP_STATUS] = status
    error = False
    if failed is not None:
        attributes[semconv.ERROR_TYPE] = type(failed).__qualname__
        error = True
    elif status >= 500:
        attributes[semconv.ERROR_TYPE] = str(status)
        error = True
    if type(span) is LeanSpan:
        span.end_with(attributes, name, error)  # str and int values: already clean
        return
    if name is not None:
        span.update_name(name)
    if error:
        span.set_status(_ERROR)
    span.set_attributes(attributes)
    span.end()


_SPAN_NAMES: dict[tuple[str, str], str] = {}


def _span_name(method: str, route: str) -> str:
    """``<METHOD> <route>``, the few distinct ones remembered (``MAX_PREFIXED_ROUTES``)."""
    key = (method, route)
    name = _SPAN_NAMES.get(key)
    if name is None:
        name = f"{method} {route}"
        if len(_SPAN_NAMES) < MAX_PREFIXED_ROUTES:
            _SPAN_NAMES[key] = name
    return name
