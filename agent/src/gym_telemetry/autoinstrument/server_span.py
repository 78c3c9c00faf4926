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
   async -- is marked nested.
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
   ``<METHOD>`` otherwise, with ``http.request.method``, ``http.route``,
   ``http.response.status_code`` and the rollout id. Status ERROR for an exception or
   a 5xx.

FastAPI's built-in telemetry is switched off for Gym's apps by the integration, so this
is the only SERVER span. A nested app (a mounted FastAPI) sees the marker this layer
puts in the scope and does not add a second span. Telemetry failures are counted
(``failures()``) and never reach the request.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from gym_telemetry import span_groups
from gym_telemetry._lean.recorder import LeanRecorder, SdkRecorder, recorder_for
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.asgi import ASGIApp, Message, Receive, Scope, Send
from gym_telemetry.autoinstrument.identity import RUNTIME
from gym_telemetry.autoinstrument.propagation import (
    extract_parent,
    outer_rollout_in_baggage,
    rollout_id_from_baggage,
)
from gym_telemetry.rollout_correlation import (
    ENCLOSING_ROLLOUT,
    ROLLOUT_PATH_PREFIX,
    call_with_rollout_id,
    rollout_id_from_path,
)

_log = logging.getLogger(__name__)


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


class _Recorder:
    """The recording path of the ``server`` group's tracer, re-resolved only when the
    tracer changes (a new provider) or was a proxy with no SDK behind it yet."""

    __slots__ = ("recorder", "tracer")

    def __init__(self) -> None:
        self.tracer: object = None
        self.recorder: LeanRecorder | SdkRecorder | None = None


_RECORDER: Final = _Recorder()


def _recorder() -> LeanRecorder | SdkRecorder:
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
    """ASGI wrapper adding the SERVER span and the rollout/trace context (module doc)."""

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
            traceparent = tracestate = baggage = None
            for key, value in scope["headers"]:
                if key == b"traceparent":
                    traceparent = value
                elif key == b"baggage":
                    baggage = value
                elif key == b"tracestate":
                    tracestate = value
            rollout_id = rollout_id_from_path(scope["path"])
            outer = False
            if baggage is not None:
                if rollout_id is None:
                    rollout_id = rollout_id_from_baggage(baggage)
                outer = outer_rollout_in_baggage(baggage)
            parent = extract_parent(traceparent, tracestate) if traceparent else None
        except Exception:  # bad headers must not fail the request
            _record_failure("header parsing")
            await self.app(scope, receive, send)
            return
        scope[SCOPE_MARKER] = True
        if outer:
            token = _ENCLOSING.set(True)
            try:
                await self._serve(scope, receive, send, parent, rollout_id)
            finally:
                _ENCLOSING.reset(token)
        else:
            await self._serve(scope, receive, send, parent, rollout_id)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        parent: context_api.Context | None,
        rollout_id: str | None,
    ) -> None:
        if _GROUP not in _ENABLED.groups:
            await self._without_span(scope, receive, send, parent, rollout_id)
        else:
            await self._with_span(scope, receive, send, parent, rollout_id)

    async def _call(
        self, scope: Scope, receive: Receive, send: Send, rollout_id: str | None
    ) -> None:
        await call_with_rollout_id(self.app, scope, receive, send, rollout_id)

    async def _without_span(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        parent: context_api.Context | None,
        rollout_id: str | None,
    ) -> None:
        if parent is None:
            await self._call(scope, receive, send, rollout_id)
            return
        token = context_api.attach(parent)
        try:
            await self._call(scope, receive, send, rollout_id)
        finally:
            context_api.detach(token)

    async def _with_span(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        parent: context_api.Context | None,
        rollout_id: str | None,
    ) -> None:
        method = scope.get("method") or "HTTP"
        try:
            attributes: dict[str, Any] = {HTTP_METHOD: method}
            if rollout_id is not None:
                attributes[semconv.ROLLOUT_ID] = rollout_id
            span, token = _recorder().start(method, attributes, _SERVER, parent)
        except Exception:
            _record_failure("span start")
            await self._call(scope, receive, send, rollout_id)
            return
        send_with_status = _StatusSend(send)
        failed: BaseException | None = None
        try:
            await self._call(scope, receive, send_with_status, rollout_id)
        except BaseException as exc:
            failed = exc
            raise
        finally:
            try:
                context_api.detach(token)  # type: ignore[arg-type]
                _finish(span, scope, method, send_with_status.status, failed)
            except Exception:
                _record_failure("span end")


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
        token = _ENCLOSING.set(True)
        try:
            await call_with_rollout_id(self.app, scope, receive, send, rollout_id)
        finally:
            _ENCLOSING.reset(token)


class _StatusSend:
    """``send`` that remembers the response status. One slotted object per request
    instead of a closure (function, cells and a list): Gym's middlewares keep ``send``
    in frames that only the cyclic GC frees, so fewer objects there is less GC work."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


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
    route = scope.get("route")
    template = getattr(route, "path", None)
    if isinstance(template, str):
        span.update_name(f"{method} {template}")
        attributes[HTTP_ROUTE] = template
    elif scope["path"].startswith(ROLLOUT_PATH_PREFIX):
        # Gym's RolloutContextMiddleware routes a copy of the scope with the
        # ``/ng-rollout/<id>`` prefix stripped, so the route is not visible here; the
        # rest of the path is the route Gym dispatched to.
        rest = "/" + scope["path"][len(ROLLOUT_PATH_PREFIX) :].partition("/")[2]
        template = _route_template(scope, method, rest)
        span.update_name(f"{method} {rest if template is None else template}")
        if template is not None:
            attributes[HTTP_ROUTE] = template
    if status:
        attributes[HTTP_STATUS] = status
    if failed is not None:
        attributes[semconv.ERROR_TYPE] = type(failed).__qualname__
        span.set_status(_ERROR)
    elif status >= 500:
        attributes[semconv.ERROR_TYPE] = str(status)
        span.set_status(_ERROR)
    if type(span) is LeanSpan and span.is_recording():
        span._attrs.update(attributes)  # str and int values: already clean
    else:
        span.set_attributes(attributes)
    span.end()
