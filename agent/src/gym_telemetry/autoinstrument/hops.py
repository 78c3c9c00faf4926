"""Gym's outbound HTTP hops: their CLIENT span, retries, timeouts, and the rollout's step.

Every hop between Gym servers goes ``server_utils.request`` → (``http_client`` enabled)
``_traced_request`` → ``_request_with_retries`` → ``client.request`` per attempt on Gym's
one shared aiohttp session (notes in docs/nemo-gym.md). The Gym integration patches
``nemo_gym.server_utils`` right after it loads (``patch``):

- ``_traced_request`` becomes :func:`traced_request` (only when its signature is the
  expected ``(method, url, _internal, _max_connection_retries, _server_name, **kwargs)``;
  otherwise Gym's own stays, with ``gym_primitives.client_span`` as its span): the same
  job -- one CLIENT span over the whole retry loop, ``traceparent`` and the rollout
  baggage injected into a copy of the headers inside it -- with what Gym knows up front
  on the span from its start:

  - name ``{method} {url.template}`` (``gym_primitives.url_template``), ``http.request.method``,
    ``url.full`` without its query (Gym's own redaction), ``url.template``, the rollout id,
    and ``nemo.gym.target.server.name``: the ``_server_name`` Gym's ``ServerClient``
    passes (the configured server the hop is addressed to; absent for other targets);
  - ``http.response.status_code``, and status ERROR with ``error.type`` = the status
    code for a 4xx/5xx answer;
  - ``http.request.resend_count``: attempts after the first, when Gym's retry loop sent
    the request again (counted per call of the shared session's ``request``, which
    ``set_global_aiohttp_client``'s session gets wrapped with: one call and one
    ``ContextVar.get`` per attempt, instead of aiohttp's ``TraceConfig``, whose signals
    cost several coroutine sends per attempt and per response chunk);
  - an exception: recorded, status ERROR, ``error.type`` = ``timeout`` when it is a
    timeout (``TimeoutError``, which aiohttp's ``ServerTimeoutError`` and
    ``asyncio.TimeoutError`` are), else the exception's class name.

- ``_request_with_retries`` (what ``request`` calls with ``http_client`` off) gets a
  wrapper that only updates the rollout's step (below), then calls Gym's.

Inside a rollout in flight here (``rollout_correlation.ENCLOSING_ROLLOUT`` holds its
``inflight`` record) each hop, as it starts, is the rollout's step (the hop span's name,
its target server); a hop to a model route (``/v1/responses``, ``/v1/chat/completions``,
``/v1/messages``) of a configured model server (a ``responses_api_models`` entry of
Gym's global config), or of an unnamed target, is a turn; a hop to a ``/run`` route
relays the rollout. Never raises into the hop: a telemetry failure is logged (debug) and
the request goes on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from types import ModuleType
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.trace import SpanKind, Status, StatusCode

from gym_telemetry import rollout_correlation
from gym_telemetry._lean.context import detach
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.autoinstrument import gym_primitives
from gym_telemetry.inflight import InFlight

_log = logging.getLogger(__name__)

#: Attribute marking a function this module put in place (patching is idempotent).
PATCHED: Final = "_gym_telemetry_hops"
#: The parameters Gym 0.7.0's ``_traced_request`` takes; another shape is left alone.
TRACED_REQUEST_PARAMETERS: Final = (
    "method",
    "url",
    "_internal",
    "_max_connection_retries",
    "_server_name",
    "kwargs",
)
#: Bound of the memo of which server names are model servers (entries; cleared when full).
MAX_CACHED_SERVERS: Final = 1024
_MODEL_ROUTES: Final = semconv.MODEL_ROUTES
_RUN_ROUTE: Final = "/run"
_MODEL_SERVER_KEY: Final = "responses_api_models"
_CLIENT: Final = SpanKind.CLIENT
_ENCLOSING: Final = rollout_correlation.ENCLOSING_ROLLOUT
_current_rollout_id: Final = rollout_correlation.current_rollout_id
_ERROR: Final = Status(StatusCode.ERROR)


#: The current hop's attempt counter (set by ``traced_request`` around the retry loop).
#: A one-item list (a list, not an object of a class of its own: no constructor call per
#: hop): how many times the shared session's ``request`` ran during the hop.
_ATTEMPTS: Final[ContextVar[list[int] | None]] = ContextVar("gym_telemetry_hop", default=None)


class _Config:
    """Gym's global config reader, bound when ``server_utils`` is patched."""

    __slots__ = ("get_config", "model_servers")

    def __init__(self) -> None:
        self.get_config: Callable[[], Any] | None = None
        self.model_servers: dict[str, bool] = {}


_CONFIG: Final = _Config()


def is_model_server(name: str) -> bool:
    """Whether Gym's global config names ``name`` a model server (remembered)."""
    known = _CONFIG.model_servers.get(name)
    if known is None:
        known = False
        try:
            get_config = _CONFIG.get_config
            entry = get_config().get(name) if get_config is not None else None
            known = entry is not None and _MODEL_SERVER_KEY in entry
        except Exception:  # no config here: not a model server
            known = False
        if len(_CONFIG.model_servers) >= MAX_CACHED_SERVERS:
            _CONFIG.model_servers.clear()
        _CONFIG.model_servers[name] = known
    return known


def hop_kind(template: str | None, server_name: str | None) -> tuple[bool, bool]:
    """``(a model call, a relayed /run)`` for a hop whose URL has ``template``."""
    if template is None:
        return False, False
    if template.endswith(_MODEL_ROUTES):
        return server_name is None or is_model_server(server_name), False
    return False, template.endswith(_RUN_ROUTE)


def _hop_name(method: str, url: str) -> tuple[str, str | None]:
    """(span name, url template) of a hop (``gym_primitives``' naming)."""
    template = gym_primitives.cached_url_template(url)
    if method not in gym_primitives.KNOWN_METHODS:
        method = "HTTP"
    if template is None:
        return method, None
    return gym_primitives.client_name(method, template), template


#: Bound of the memo of hop shapes (entries; cleared when full).
MAX_CACHED_HOPS: Final = 1024


class _Shape:
    """What a hop's ``(method, url, server name)`` decides, remembered per triple (a
    server's hops are a few routes): the span's name, its attributes but the rollout
    id, and the hop's kind (``hop_kind``)."""

    __slots__ = ("attributes", "model_call", "name", "relay")

    def __init__(self, method: str, url: str, server_name: str | None) -> None:
        method = method.upper()
        url = url.split("?", 1)[0]  # Gym's redaction: query strings carry keys
        name, template = _hop_name(method, url)
        attributes: dict[str, Any] = {
            semconv.HTTP_REQUEST_METHOD: method,
            semconv.URL_FULL: url,
        }
        if template is not None:
            attributes[semconv.URL_TEMPLATE] = template
        if server_name:
            attributes[semconv.TARGET_SERVER_NAME] = str(server_name)
        self.name = name
        self.attributes = attributes
        try:
            self.model_call, self.relay = hop_kind(template, server_name)
        except Exception:  # the step is best effort; the span is named
            _log.debug("gym_telemetry: could not tell a hop's kind", exc_info=True)
            self.model_call = self.relay = False


_SHAPES: dict[tuple[str, str, str | None], _Shape] = {}


def _shape(method: str, url: str, server_name: str | None) -> _Shape:
    """The hop's ``_Shape``, remembered (``MAX_CACHED_HOPS``) unless its URL has a query
    (never kept: query strings carry keys) or its server name is not a str."""
    if server_name is not None and server_name.__class__ is not str:
        return _Shape(method, url, server_name)  # maybe not even hashable: never a key
    key = (method, url, server_name)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = _Shape(method, url, server_name)
        if "?" not in url:
            if len(_SHAPES) >= MAX_CACHED_HOPS:
                _SHAPES.clear()
            _SHAPES[key] = shape
    return shape


class _Hop:
    """One traced hop: its span, context token and attempt counter."""

    __slots__ = ("attempts", "attempts_token", "span", "token")

    def __init__(self, method: str, url: str, server_name: str | None) -> None:
        shape = _shape(method, url, server_name)
        attributes = shape.attributes.copy()
        rollout_id = _current_rollout_id()
        if rollout_id:
            attributes[semconv.ROLLOUT_ID] = (
                rollout_id if rollout_id.__class__ is str else str(rollout_id)
            )
        recorder = gym_primitives.client_recorder()
        self.span, self.token = recorder.start(shape.name, attributes, _CLIENT)
        self.attempts = [0]
        self.attempts_token = _ATTEMPTS.set(self.attempts)
        record = _ENCLOSING.get()
        if record.__class__ is InFlight:
            try:
                record.hop(shape.name, server_name, shape.model_call, shape.relay)
            except Exception:  # the step is best effort; the span is started
                _log.debug("gym_telemetry: could not note a rollout step", exc_info=True)

    def end(self, status: int | None, exc: BaseException | None) -> None:
        span = self.span
        try:  # noqa: SIM105 - try/except is cheaper than suppress() on this per-hop path
            _ATTEMPTS.reset(self.attempts_token)
        except ValueError:  # reset in another context: the counter is left behind, harmless
            pass
        detach(self.token)
        extra: dict[str, Any] = {}
        resent = self.attempts[0] - 1
        if resent > 0:
            extra[semconv.HTTP_REQUEST_RESEND_COUNT] = resent
        error = False
        if exc is not None:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            timeout = isinstance(exc, TimeoutError)
            extra[semconv.ERROR_TYPE] = (
                semconv.ERROR_TYPE_TIMEOUT if timeout else type(exc).__qualname__
            )
        elif status is not None:
            extra[semconv.HTTP_RESPONSE_STATUS_CODE] = status
            if status >= 400:
                error = True  # no description: the status code says it (HTTP semconv)
                extra[semconv.ERROR_TYPE] = str(status)
        if type(span) is LeanSpan:
            span.end_with(extra, None, error)
            return
        span.set_attributes(extra)
        if error:
            span.set_status(_ERROR)
        span.end()


def traced_request(retries: Callable[..., Any]) -> Callable[..., Any]:
    """Gym's ``_traced_request`` done here, over Gym's ``_request_with_retries`` ``retries``
    (module doc)."""

    async def _traced_request(
        method: str,
        url: str,
        _internal: bool = False,
        _max_connection_retries: int | None = None,
        _server_name: str | None = None,
        **kwargs: Any,
    ) -> Any:
        hop: _Hop | None
        try:
            hop = _Hop(method, url, _server_name)
        except Exception:  # the hop goes on without its span
            _log.debug("gym_telemetry: could not start a hop span", exc_info=True)
            hop = None
        headers = kwargs.get("headers")
        # a copy: the caller's mapping is not changed (any mapping type aiohttp takes)
        headers = dict(headers) if headers else {}
        gym_primitives.inject_trace_context(headers)
        kwargs["headers"] = headers
        try:
            response = await retries(
                method,
                url,
                _internal=_internal,
                _max_connection_retries=_max_connection_retries,
                _server_name=_server_name,
                **kwargs,
            )
        except BaseException as exc:
            if hop is not None:
                _end(hop, None, exc)
            raise
        if hop is not None:
            _end(hop, getattr(response, "status", None), None)
        return response

    setattr(_traced_request, PATCHED, True)
    return _traced_request


def _end(hop: _Hop, status: Any, exc: BaseException | None) -> None:
    try:
        hop.end(status if type(status) is int else None, exc)
    except Exception:  # naming and status are best effort; the response goes back
        _log.debug("gym_telemetry: could not end a hop span", exc_info=True)


def stepping(retries: Callable[..., Any]) -> Callable[..., Any]:
    """Gym's ``_request_with_retries`` behind the rollout-step update (``http_client`` off)."""

    async def _request_with_retries(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        record = _ENCLOSING.get()
        if record.__class__ is InFlight:
            try:
                server_name = kwargs.get("_server_name")
                shape = _shape(method, url, server_name)
                record.hop(shape.name, server_name, shape.model_call, shape.relay)
            except Exception:  # the step is best effort
                _log.debug("gym_telemetry: could not note a rollout step", exc_info=True)
        return await retries(method, url, *args, **kwargs)

    setattr(_request_with_retries, PATCHED, True)
    return _request_with_retries


def count_attempts(session: Any) -> None:
    """Wrap ``session.request`` (an aiohttp ``ClientSession``'s) so each call counts as an
    attempt of the current hop. Set on the instance with ``object.__setattr__`` (aiohttp
    warns, in its debug mode, about attributes set through its own ``__setattr__``)."""
    request = session.request
    if getattr(request, PATCHED, False):
        return

    def counted(*args: Any, **kwargs: Any) -> Any:
        attempts = _ATTEMPTS.get()
        if attempts is not None:
            attempts[0] += 1
        return request(*args, **kwargs)

    setattr(counted, PATCHED, True)
    object.__setattr__(session, "request", counted)


def _counting_sessions(setup: Callable[..., Any]) -> Callable[..., Any]:
    def set_global_aiohttp_client(*args: Any, **kwargs: Any) -> Any:
        session = setup(*args, **kwargs)
        try:
            count_attempts(session)
        except Exception:  # no resend counts; the session works as Gym made it
            _log.debug("gym_telemetry: could not count a session's attempts", exc_info=True)
        return session

    setattr(set_global_aiohttp_client, PATCHED, True)
    return set_global_aiohttp_client


def _takes_gyms_parameters(func: Any) -> bool:
    try:
        parameters = tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return False
    return parameters == TRACED_REQUEST_PARAMETERS


def patch(module: ModuleType) -> None:
    """Patch ``nemo_gym.server_utils`` (module doc). Idempotent; a piece whose Gym
    counterpart is missing or shaped differently is left as Gym wrote it."""
    retries = getattr(module, "_request_with_retries", None)
    if retries is None or getattr(retries, PATCHED, False):
        return
    _CONFIG.get_config = getattr(module, "get_global_config_dict", None)
    traced = getattr(module, "_traced_request", None)
    if traced is not None and _takes_gyms_parameters(traced):
        module._traced_request = traced_request(retries)  # type: ignore[attr-defined]
    else:
        _log.info("gym_telemetry: Gym's _traced_request has another shape; kept as is")
    module._request_with_retries = stepping(retries)  # type: ignore[attr-defined]
    setup = getattr(module, "set_global_aiohttp_client", None)
    if setup is not None:
        module.set_global_aiohttp_client = _counting_sessions(setup)  # type: ignore[attr-defined]
    current = getattr(module, "_GLOBAL_AIOHTTP_CLIENT", None)
    if current is not None:
        count_attempts(current)


__all__ = [
    "count_attempts",
    "hop_kind",
    "is_model_server",
    "patch",
    "stepping",
    "traced_request",
]
