"""The engine behind the endpoint wrappers (private; the API is ``gym_telemetry.endpoints``).

One wrapper per wrapped handler, one sync/async pair in the whole agent
(``make_wrapper``). What is fixed at wrap time for a handler (its group, span name,
frozen static attributes, whether it reads Gym's in-band failure markers, whether it is a
rollout) is a ``Site``; the wrapper calls it to start and end the span. The contract the
wrappers keep is the one written in ``gym_telemetry.endpoints``.

``Hooks`` are steps of the auto-instrumentation that run in the same wrapper, before the
gate: setting the rollout id from a ``/run`` body and tagging the request's SERVER span
with the rollout id (``autoinstrument.routes.RouteHooks``). A wrapper without hooks (the
seed API's) tests its group first and does nothing else when it is off.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextvars import Token
from typing import Any, Final, cast

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.ratelimit import rate_limit
from opentelemetry.trace import Span, Status, StatusCode

from gym_telemetry import inflight, rollout_correlation, span_groups
from gym_telemetry._lean import context as lean_context
from gym_telemetry._lean.recorder import LeanRecorder, SdkRecorder, recorder_for
from gym_telemetry._lean.span import LeanSpan, clean_value
from gym_telemetry.answers import reward_of, usage_of
from gym_telemetry.genai import ROUTE_ATTRIBUTES, request_model
from gym_telemetry.inflight import InFlight
from gym_telemetry.outcomes import failure_of
from gym_telemetry.rollout_correlation import ENCLOSING_ROLLOUT
from gym_telemetry.streaming import is_stream
from gym_telemetry.streaming import watch as watch_stream

#: The wrappers log under the public module's name (what users filter on).
_log = logging.getLogger("gym_telemetry.endpoints")

ROLLOUT_ID_ATTRIBUTE: Final = semconv.ROLLOUT_ID

_ENABLED: Final = span_groups.ENABLED
_tracers = span_groups._tracers  # group -> tracer cache (cleared when the provider changes)
_tracer_for = span_groups.tracer_for
_current_rollout_id = rollout_correlation.current_rollout_id
_SOURCE: Final = rollout_correlation.SOURCE
_detach = lean_context.detach
_reset = lean_context.reset
_MODEL_CALL: Final = semconv.GROUP_MODEL_CALL

_NESTED: Final[dict[str, bool]] = {semconv.ROLLOUT_NESTED: True}
_REWARD: Final = semconv.REWARD
_TURNS: Final = semconv.ROLLOUT_TURNS
_INPUT_TOKENS: Final = semconv.ROLLOUT_INPUT_TOKENS
_OUTPUT_TOKENS: Final = semconv.ROLLOUT_OUTPUT_TOKENS
_REQUEST_MODEL: Final = semconv.GEN_AI_REQUEST_MODEL
_begin_rollout = inflight.begin
_isfinite = math.isfinite
_end_rollout = inflight.end


# --- telemetry failures: counted, logged rate-limited -------------------------------------


class _ErrorCounter:
    """Counts telemetry failures; logs them through a rate-limited logger (at most one
    WARNING per minute, the next one saying how many were suppressed)."""

    __slots__ = ("count", "lock")

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def record(self, where: str, exc: BaseException) -> None:
        try:
            with self.lock:
                self.count += 1
            _failure_log.warning(
                "gym_telemetry: telemetry failure in %s (%r); the handler was not affected",
                where,
                exc,
            )
        except Exception:  # logging itself failed; nothing more we can do safely
            pass


#: Its own logger, so the rate limit applies to the failure stream and not to the
#: wrap-time warnings of this module.
_failure_log = logging.getLogger("gym_telemetry.endpoints.failures")
rate_limit(_failure_log)


_ERRORS: Final = _ErrorCounter()


def telemetry_errors() -> int:
    """How many telemetry failures the wrappers have swallowed in this process."""
    return _ERRORS.count


# --- wrap-time helpers --------------------------------------------------------------------


def _freeze_attributes(static_attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Copy the static attributes once, keeping only values OpenTelemetry accepts."""
    out: dict[str, Any] = {}
    if not static_attributes:
        return out
    for key, value in dict(static_attributes).items():
        if not isinstance(key, str) or not key:
            _log.warning("gym_telemetry: dropping static attribute with key %r", key)
            continue
        if value is None:
            continue
        cleaned = clean_value(value)
        out[key] = cleaned if cleaned is not None else str(value)
    return out


def _async_kind(handler: Callable[..., Any]) -> str:
    """``"coroutine"`` for an ``async def`` (or a bound one), ``"maybe"`` when only what it
    wraps or its ``__call__`` is async (FastAPI awaits those too), ``"sync"`` otherwise."""
    if inspect.iscoroutinefunction(handler):
        return "coroutine"
    if inspect.iscoroutinefunction(inspect.unwrap(handler)):
        return "maybe"
    call = getattr(handler, "__call__", None)  # noqa: B004 - callable instances
    if call is not None and not inspect.isroutine(handler) and inspect.iscoroutinefunction(call):
        return "maybe"
    return "sync"


def _awaiting(handler: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """An ``async def`` calling ``handler`` and awaiting the result only if awaitable."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        result = handler(*args, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result

    return call


# --- the recording path -------------------------------------------------------------------


class Site:
    """Everything fixed at wrap time for one wrapped handler, and its recording path."""

    __slots__ = (
        "attributes",
        "failure_attributes",
        "group",
        "read_result",
        "recorder",
        "reward",
        "rollout",
        "span_name",
        "streams",
        "success_attributes",
        "tracer",
    )

    def __init__(
        self,
        group: str,
        span_name: str,
        attributes: dict[str, Any],
        success_attributes: dict[str, Any] | None,
        failure_attributes: dict[str, Any] | None,
        *,
        read_result: bool = False,
        rollout: bool = False,
        reward: bool = False,
    ) -> None:
        self.group = group
        self.span_name = span_name
        self.attributes = attributes
        self.success_attributes = success_attributes
        self.failure_attributes = failure_attributes
        # Read Gym's in-band failure markers on the handler's return value (outcomes).
        self.read_result = read_result
        # A rollout site: marks nested rollouts, is itself an enclosing rollout, is in
        # flight (inflight) while it runs, and records its turns, tokens and reward.
        self.rollout = rollout
        # Record the returned answer's reward (a verify or env-step site).
        self.reward = reward
        self.tracer: object = None
        self.recorder: LeanRecorder | SdkRecorder | None = None
        # A model call may answer with a stream: its span ends with the body.
        self.streams = group == _MODEL_CALL

    def _recorder(self) -> LeanRecorder | SdkRecorder:
        # The group's tracer changes only when the provider does (reset_tracers): one
        # dict lookup and one identity test per call.
        tracer = _tracers.get(self.group)
        if tracer is None:
            tracer = _tracer_for(self.group)
        recorder = self.recorder
        if tracer is not self.tracer or recorder is None or recorder.provisional:
            recorder = self.recorder = recorder_for(tracer)
            self.tracer = tracer
        return recorder

    def start(self, kwargs: dict[str, Any]) -> tuple[Span, object, bool]:
        """Start the span (static attributes + rollout id) and make it current.

        ``kwargs`` are the handler's keyword arguments (a model call's parsed ``body``
        gives ``gen_ai.request.model``). For a rollout site the returned token is
        ``(context token, ENCLOSING_ROLLOUT reset or None, InFlight record or None)``.
        """
        recorder = self.recorder
        if recorder is None or recorder.provisional or self.tracer is not _tracers.get(self.group):
            recorder = self._recorder()
        try:
            rollout_id = _SOURCE.get()  # current_rollout_id(), one call less
        except Exception:  # a foreign getter must never break a handler
            rollout_id = None
        if rollout_id is None:
            attributes = self.attributes.copy()
        else:
            if rollout_id.__class__ is not str:
                rollout_id = str(rollout_id)
            attributes = {**self.attributes, ROLLOUT_ID_ATTRIBUTE: rollout_id}
        if not self.rollout:
            if self.streams:
                model = request_model(kwargs.get("body"))
                if model is not None:
                    attributes[_REQUEST_MODEL] = model
            span, token = recorder.start(self.span_name, attributes)
            return span, token, rollout_id is not None
        nested = bool(ENCLOSING_ROLLOUT.get())
        if nested:
            attributes.update(_NESTED)
        span, token = recorder.start(self.span_name, attributes)
        # Only a recorded span encloses and is in flight: an unsampled one produces no
        # duration point, so a rollout inside it must stay the outermost (and keep its
        # point).
        if not span.is_recording():
            return span, (token, None, None), rollout_id is not None
        record = _begin_rollout(span, rollout_id, nested)
        return span, (token, ENCLOSING_ROLLOUT.set(record), record), rollout_id is not None

    def finish(self, span: Span, token: object, had_rollout_id: bool, result: Any = None) -> None:
        """End the span after the handler returned ``result``.

        A result carrying one of Gym's in-band failure markers
        (:func:`gym_telemetry.outcomes.failure_of`) ends the span like a failure:
        status ERROR, ``error.type`` = the failure kind, the failure attributes.
        A verify/step/rollout answer's reward and a rollout's turns and tokens are
        added either way (``gym_telemetry.answers``).
        """
        if self.streams and is_stream(result):
            # A streamed answer: the span ends with the body, not now (streaming module).
            self._end(span, token, had_rollout_id, self.success_attributes, result)
            return
        failure = None
        if self.read_result:
            try:
                failure = failure_of(result)
            except Exception as exc:  # never let reading the result break the handler
                _ERRORS.record("result markers", exc)
        extra = self.success_attributes if failure is None else self.failure_attributes
        if self.reward:
            # reward_of's usual case inline (a model's finite float field); else reward_of
            try:
                reward = (result if type(result) is dict else result.__dict__).get("reward")
            except Exception:  # no fields: reward_of decides
                reward = None
            if type(reward) is not float:
                reward = reward_of(result)
            elif not _isfinite(reward):
                reward = None
            if reward is not None:
                extra = extra.copy() if extra else {}
                extra[_REWARD] = reward
            if failure is None and had_rollout_id and type(span) is LeanSpan:
                # A completed verification, every /verify but a failed one: ``_end``'s
                # path for it, written out (once per verification on a resources server)
                try:
                    _reset(token)
                except Exception:  # as the API's detach: logged, never raised
                    _detach(token)
                span.end_with(extra)  # pre-cleaned constants and the float reward
                return
        elif self.rollout:
            extra = _rollout_attributes(token, result, extra)
        if failure is None:
            self._end(span, token, had_rollout_id, extra)
            return
        try:
            description = failure.kind
            if failure.reason is not None:
                description = f"{failure.kind}: {failure.reason}"
            span.set_status(Status(StatusCode.ERROR, description))
            span.set_attribute(semconv.ERROR_TYPE, failure.kind)
            if failure.stage is not None:
                span.set_attribute(semconv.FAILURE_STAGE, failure.stage)
        finally:  # even if describing the failure failed: detach and end
            self._end(span, token, had_rollout_id, extra)

    def fail(self, span: Span, token: object, had_rollout_id: bool, exc: BaseException) -> None:
        extra = self.failure_attributes
        try:
            span.record_exception(exc, escaped=True)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute(semconv.ERROR_TYPE, _error_type(exc, self.streams))
            if self.rollout:
                extra = _rollout_attributes(token, None, extra)
        finally:  # even if describing the exception failed: detach and end
            self._end(span, token, had_rollout_id, extra)

    def _end(
        self,
        span: Span,
        token: object,
        had_rollout_id: bool,
        extra: dict[str, Any] | None,
        stream: Any = None,
    ) -> None:
        ended = False
        try:
            if self.rollout:
                triple = cast(tuple[object, Token[Any] | None, InFlight | None], token)
                token = triple[0]
                if triple[1] is not None:
                    ENCLOSING_ROLLOUT.reset(triple[1])
                if triple[2] is not None:
                    _end_rollout(triple[2])
            try:
                _reset(token)
            except Exception:  # as the API's detach: logged, never raised
                _detach(token)
            if not had_rollout_id:
                # The handler may have set the id itself and left it set.
                rollout_id = _current_rollout_id()
                if rollout_id is not None:
                    span.set_attribute(ROLLOUT_ID_ATTRIBUTE, str(rollout_id))
            if stream is None and type(span) is LeanSpan:
                ended = True
                span.end_with(extra)  # pre-cleaned constants
                return
            if extra:
                span.set_attributes(extra)
        finally:
            if not ended and (stream is None or not watch_stream(stream, span)):
                span.end()


def _rollout_attributes(
    token: object, answer: Any, extra: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``extra`` plus a rollout's RL attributes: its turns (counted by its hops) and the
    reward and tokens of its ``answer``; a rollout that relayed its ``/run`` leaves turns
    and tokens to the rollout it reached (``inflight`` module doc)."""
    record = cast(tuple[object, object, InFlight | None], token)[2]
    out = dict(extra) if extra else {}
    if answer is not None:
        reward = reward_of(answer)
        if reward is not None:
            out[_REWARD] = reward
    if record is not None and not record.relayed:
        out[_TURNS] = record.turns
        usage = usage_of(answer) if answer is not None else None
        if usage is not None:
            out[_INPUT_TOKENS], out[_OUTPUT_TOKENS] = usage
    return out or None


def _error_type(exc: BaseException, model_call: bool) -> str:
    """``error.type`` of a handler's exception: its class name; for a model call that
    raised an HTTP error (FastAPI's ``HTTPException``), the status code it answered."""
    if model_call:
        status = getattr(exc, "status_code", None)
        if type(status) is int:
            return str(status)
    return type(exc).__qualname__


def _with_resolved_signature(
    wrapper: Callable[..., Any], handler: Callable[..., Any]
) -> Callable[..., Any]:
    """Give the wrapper the handler's signature with string annotations evaluated.

    ``functools.wraps`` does not carry ``__globals__``: a FastAPI that resolves string
    annotations (``from __future__ import annotations``) in the callable's globals
    instead of following ``__wrapped__`` (FastAPI < 0.12x) would look them up in this
    module and turn the body model into a query parameter. A pre-resolved
    ``__signature__`` is what ``inspect.signature`` returns first, on every version.
    When an annotation cannot be resolved now, the wrapper keeps ``__wrapped__`` only.
    """
    # Unresolvable forward references: leave it to FastAPI following __wrapped__.
    with contextlib.suppress(Exception):
        wrapper.__signature__ = inspect.signature(handler, eval_str=True)  # type: ignore[attr-defined]
    return wrapper


class Hooks:
    """Steps run by a wrapper before its gate, around the handler (one object per wrapped
    handler). ``enter`` / ``aenter`` run first (the async wrapper awaits ``aenter``),
    and what they return, when not None, is given to ``leave`` once the handler and its
    span are done. None of them may raise: a hook failure is the hook's to swallow."""

    __slots__ = ()

    #: Whether the async wrapper must await ``aenter``; when False it calls ``enter``,
    #: which then does what ``aenter`` would (no coroutine per call).
    awaits = True

    def enter(self, kwargs: dict[str, Any]) -> Token[Any] | None:
        """Before a sync handler; returns what ``leave`` undoes, or None."""
        return None

    async def aenter(self, kwargs: dict[str, Any]) -> Token[Any] | None:
        """Before an async handler; returns what ``leave`` undoes, or None."""
        return None

    def leave(self, token: Token[Any]) -> None:
        """Undo what ``enter`` / ``aenter`` did (called only when they returned a token)."""


def make_wrapper(
    site: Site, handler: Callable[..., Any], hooks: Hooks | None = None
) -> Callable[..., Any]:
    """The wrapper of ``handler`` for ``site``: async for a handler FastAPI would await,
    sync otherwise. The only sync/async pair of the agent."""
    group = site.group
    enabled = _ENABLED
    errors = _ERRORS

    kind = _async_kind(handler)
    if kind != "sync":
        original = handler
        if kind == "maybe":
            handler = _awaiting(handler)

        @functools.wraps(original)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if group not in enabled.groups:
                if hooks is None:
                    return await handler(*args, **kwargs)
                own = await hooks.aenter(kwargs) if hooks.awaits else hooks.enter(kwargs)
                try:
                    return await handler(*args, **kwargs)
                finally:
                    if own is not None:
                        hooks.leave(own)
            own = None
            if hooks is not None:
                own = await hooks.aenter(kwargs) if hooks.awaits else hooks.enter(kwargs)
            try:
                try:
                    span, token, had_id = site.start(kwargs)
                except Exception as exc:  # telemetry must never break the handler
                    errors.record("span start", exc)
                    return await handler(*args, **kwargs)
                try:
                    result = await handler(*args, **kwargs)
                except BaseException as exc:
                    try:
                        site.fail(span, token, had_id, exc)
                    except Exception as texc:  # never mask the handler's own exception
                        errors.record("span end", texc)
                    raise
                try:
                    site.finish(span, token, had_id, result)
                except Exception as texc:  # telemetry must never break the handler
                    errors.record("span end", texc)
                return result
            finally:
                if own is not None:
                    hooks.leave(own)  # type: ignore[union-attr]

        return _with_resolved_signature(async_wrapper, original)

    @functools.wraps(handler)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        if group not in enabled.groups:
            if hooks is None:
                return handler(*args, **kwargs)
            own = hooks.enter(kwargs)
            try:
                return handler(*args, **kwargs)
            finally:
                if own is not None:
                    hooks.leave(own)
        own = None if hooks is None else hooks.enter(kwargs)
        try:
            try:
                span, token, had_id = site.start(kwargs)
            except Exception as exc:  # telemetry must never break the handler
                errors.record("span start", exc)
                return handler(*args, **kwargs)
            try:
                result = handler(*args, **kwargs)
            except BaseException as exc:
                try:
                    site.fail(span, token, had_id, exc)
                except Exception as texc:  # never mask the handler's own exception
                    errors.record("span end", texc)
                raise
            try:
                site.finish(span, token, had_id, result)
            except Exception as texc:  # telemetry must never break the handler
                errors.record("span end", texc)
            return result
        finally:
            if own is not None:
                hooks.leave(own)  # type: ignore[union-attr]

    return _with_resolved_signature(sync_wrapper, handler)


def check_group(group: str, span_name: str) -> None:
    """Warn (once per call) when ``group`` is not a span group: such a wrapper never
    records."""
    if group not in span_groups.GROUPS:
        _log.warning("gym_telemetry: traced_endpoint(%r, %r): unknown span group", group, span_name)


def wrap(
    group: str,
    span_name: str,
    handler: Callable[..., Any],
    static_attributes: Mapping[str, Any] | None,
    *,
    success_attributes: dict[str, Any] | None = None,
    failure_attributes: dict[str, Any] | None = None,
    read_result: bool = False,
    rollout: bool = False,
    reward: bool = False,
    hooks: Hooks | None = None,
) -> Callable[..., Any]:
    """``handler`` wrapped in a span of ``group`` named ``span_name`` (the site's options:
    ``Site``), with ``hooks`` run before the gate. A model-call span (``gym.model.*``)
    also gets its route's constant GenAI attributes (``genai.ROUTE_ATTRIBUTES``). Never
    raises for telemetry reasons."""
    attributes = _freeze_attributes(static_attributes)
    route_attributes = ROUTE_ATTRIBUTES.get(span_name)
    if route_attributes is not None and group == _MODEL_CALL:
        attributes = {**route_attributes, **attributes}
    site = Site(
        group,
        span_name,
        attributes,
        success_attributes,
        failure_attributes,
        read_result=read_result,
        rollout=rollout,
        reward=reward,
    )
    return make_wrapper(site, handler, hooks)


#: ``succeeded`` on verify and env-step spans that completed, and on those that did not.
VERIFY_OK: Final[dict[str, bool]] = {semconv.VERIFY_SUCCEEDED: True}
VERIFY_FAILED: Final[dict[str, bool]] = {semconv.VERIFY_SUCCEEDED: False}


def wrap_rollout(
    handler: Callable[..., Any],
    static_attributes: Mapping[str, Any] | None,
    hooks: Hooks | None = None,
) -> Callable[..., Any]:
    """The ``gym.rollout`` wrapper (``endpoints.traced_rollout_endpoint``)."""
    return wrap(
        semconv.GROUP_ROLLOUT,
        semconv.SPAN_ROLLOUT,
        handler,
        static_attributes,
        read_result=True,
        rollout=True,
        hooks=hooks,
    )


def wrap_verify(
    span_name: str,
    handler: Callable[..., Any],
    static_attributes: Mapping[str, Any] | None,
    hooks: Hooks | None = None,
) -> Callable[..., Any]:
    """A ``verify``-group wrapper with ``succeeded`` (``gym.verify``, ``gym.env.step``)."""
    return wrap(
        semconv.GROUP_VERIFY,
        span_name,
        handler,
        static_attributes,
        success_attributes=VERIFY_OK,
        failure_attributes=VERIFY_FAILED,
        read_result=True,
        reward=True,
        hooks=hooks,
    )
