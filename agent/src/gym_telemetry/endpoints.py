"""Span wrappers for Gym's endpoint handlers (the API of ``nemo_gym.telemetry.endpoints``).

``traced_endpoint(group, span_name, handler, static_attributes=None)`` returns a handler
that behaves exactly like ``handler`` and, when ``group`` is enabled at call time,
records one span around each call.

Contract:

- ``functools.wraps``: the wrapper carries ``__wrapped__``, which FastAPI's
  ``inspect.signature`` follows, so the route keeps its body type, its validation and
  its OpenAPI schema. It also gets a ``__signature__`` with string annotations already
  evaluated, for FastAPI versions that would resolve them in the wrong module.
- Gate first: the group is tested at call time, before anything else, against the
  process-wide frozenset in ``span_groups.ENABLED``. A disabled group costs one
  attribute load and one set-membership test, then the handler is called as is; the
  gate allocates nothing (the call itself costs what any wrapper call costs).
- Enabled, the span is recorded through ``gym_telemetry.recording`` (a lean path over
  the SDK's own pipeline; ``Tracer.start_span`` when that is not possible).
- ``static_attributes`` is copied (and its values checked) once, at wrap time;
  mutating the caller's dict afterwards changes nothing.
- The rollout id comes from the rollout-correlation ContextVar (Gym's own when Gym is
  installed) and is put on the span as ``nemo.gym.rollout.id``. If the handler itself
  sets the id (Gym's agent ``/run`` does) it is read again when the handler returns.
- The span is made current while the handler runs, so the model calls and
  verifications a rollout triggers hang off it through W3C propagation.
- The wrapper never raises its own errors into the handler: a telemetry failure is
  swallowed, counted (``telemetry_errors()``) and logged rate-limited. The handler's
  own exceptions propagate unchanged (same object, same traceback); the span gets
  status ERROR, the exception as an event and ``error.type``.
- ``gym.verify``, ``gym.env.step`` and ``gym.rollout`` also read Gym's in-band failure
  markers on the value the handler *returned* (``gym_telemetry.outcomes``: a
  ``judge_failsafe`` row, an episode ``failure``, a relayed 5xx): such a call ends like
  a failure (status ERROR, ``error.type`` = the failure kind; ``succeeded=false``). The
  returned value itself is passed back untouched; reward is never read.
- A ``gym.rollout`` span started inside another *recorded* rollout span
  (``ENCLOSING_ROLLOUT``: one of this process, or one upstream whose hop carried the
  outer-rollout baggage marker) carries ``nemo.gym.rollout.nested=true``; the sidecar
  derives rollout metrics from the outermost only. A rollout id alone never makes a
  span nested.
- Async handlers (Gym's) get an async wrapper; plain functions get a sync wrapper.
- A ``model_call`` span whose handler returned a streamed response ends when the
  stream does, with a failure event in the stream or a disconnect read as ERROR
  (``gym_telemetry.streaming``).
- No metrics are recorded here; the sidecar derives them from the spans.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar, Token
from typing import Any, Final, TypeVar, cast

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.ratelimit import rate_limit
from opentelemetry import context as context_api
from opentelemetry.trace import Span, Status, StatusCode

from gym_telemetry import rollout_correlation, span_groups
from gym_telemetry.outcomes import failure_of
from gym_telemetry.recording import (
    LeanRecorder,
    LeanSpan,
    SdkRecorder,
    clean_value,
    recorder_for,
)
from gym_telemetry.streaming import is_stream
from gym_telemetry.streaming import watch as watch_stream

_log = logging.getLogger(__name__)

ROLLOUT_ID_ATTRIBUTE: Final = semconv.ROLLOUT_ID

_F = TypeVar("_F", bound=Callable[..., Any])

_ENABLED: Final = span_groups.ENABLED
_tracers = span_groups._tracers  # group -> tracer cache (cleared when the provider changes)
_tracer_for = span_groups.tracer_for
_current_rollout_id = rollout_correlation.current_rollout_id
_detach = context_api.detach
_MODEL_CALL: Final = semconv.GROUP_MODEL_CALL

#: True while code runs inside a *recorded* ``gym.rollout`` span: this process's (set by
#: the rollout wrapper only when its span is recording), or an upstream one (set by the
#: Gym integration's SERVER layer when the request's baggage carries the outer-rollout
#: marker, which ``propagation.inject`` writes only while this is true). A
#: ``gym.rollout`` span started while it is true is marked
#: ``nemo.gym.rollout.nested=true``, and the sidecar derives rollout metrics from the
#: outermost span only. A rollout id that merely arrived from upstream does not set it:
#: the caller may have recorded no rollout span (rollout group off, a plain client).
ENCLOSING_ROLLOUT: Final[ContextVar[bool]] = ContextVar(
    "gym_telemetry_enclosing_rollout", default=False
)
_NESTED: Final[dict[str, bool]] = {semconv.ROLLOUT_NESTED: True}


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
_failure_log = logging.getLogger(__name__ + ".failures")
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


class _Site:
    """Everything fixed at wrap time for one wrapped handler, and its recording path."""

    __slots__ = (
        "attributes",
        "failure_attributes",
        "group",
        "read_result",
        "recorder",
        "rollout",
        "span_name",
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
    ) -> None:
        self.group = group
        self.span_name = span_name
        self.attributes = attributes
        self.success_attributes = success_attributes
        self.failure_attributes = failure_attributes
        # Read Gym's in-band failure markers on the handler's return value (outcomes).
        self.read_result = read_result
        # A rollout site: marks nested rollouts and is itself an enclosing rollout.
        self.rollout = rollout
        self.tracer: object = None
        self.recorder: LeanRecorder | SdkRecorder | None = None

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

    def start(self) -> tuple[Span, object, bool]:
        """Start the span (static attributes + rollout id) and make it current.

        For a rollout site the returned token also holds the ``ENCLOSING_ROLLOUT`` reset
        (None when it was not changed).
        """
        recorder = self._recorder()
        rollout_id = _current_rollout_id()
        if rollout_id is None:
            attributes = self.attributes.copy()
        else:
            attributes = {**self.attributes, ROLLOUT_ID_ATTRIBUTE: str(rollout_id)}
        if not self.rollout:
            span, token = recorder.start(self.span_name, attributes)
            return span, token, rollout_id is not None
        if ENCLOSING_ROLLOUT.get():
            attributes.update(_NESTED)
            span, token = recorder.start(self.span_name, attributes)
            return span, (token, None), rollout_id is not None
        span, token = recorder.start(self.span_name, attributes)
        # Only a recorded span encloses: an unsampled one produces no duration point, so
        # a rollout inside it must stay the outermost (and keep its point).
        enclosing = ENCLOSING_ROLLOUT.set(True) if span.is_recording() else None
        return span, (token, enclosing), rollout_id is not None

    def finish(self, span: Span, token: object, had_rollout_id: bool, result: Any = None) -> None:
        """End the span after the handler returned ``result``.

        A result carrying one of Gym's in-band failure markers
        (:func:`gym_telemetry.outcomes.failure_of`) ends the span like a failure:
        status ERROR, ``error.type`` = the failure kind, the failure attributes.
        """
        if self.group == _MODEL_CALL and is_stream(result):
            # A streamed answer: the span ends with the body, not now (streaming module).
            self._end(span, token, had_rollout_id, self.success_attributes, result)
            return
        failure = None
        if self.read_result:
            try:
                failure = failure_of(result)
            except Exception as exc:  # never let reading the result break the handler
                _ERRORS.record("result markers", exc)
        if failure is None:
            self._end(span, token, had_rollout_id, self.success_attributes)
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
            self._end(span, token, had_rollout_id, self.failure_attributes)

    def fail(self, span: Span, token: object, had_rollout_id: bool, exc: BaseException) -> None:
        try:
            span.record_exception(exc, escaped=True)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attribute(semconv.ERROR_TYPE, type(exc).__qualname__)
        finally:  # even if describing the exception failed: detach and end
            self._end(span, token, had_rollout_id, self.failure_attributes)

    def _end(
        self,
        span: Span,
        token: object,
        had_rollout_id: bool,
        extra: dict[str, Any] | None,
        stream: Any = None,
    ) -> None:
        try:
            if self.rollout:
                pair = cast(tuple[object, Token[bool] | None], token)
                token = pair[0]
                if pair[1] is not None:
                    ENCLOSING_ROLLOUT.reset(pair[1])
            _detach(token)  # type: ignore[arg-type]
            if not had_rollout_id:
                # The handler may have set the id itself and left it set.
                rollout_id = _current_rollout_id()
                if rollout_id is not None:
                    span.set_attribute(ROLLOUT_ID_ATTRIBUTE, str(rollout_id))
            if extra:
                if type(span) is LeanSpan:
                    span._attrs.update(extra)  # pre-cleaned constants
                else:
                    span.set_attributes(extra)
        finally:
            if stream is None or not watch_stream(stream, span):
                span.end()


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


def _make_wrapper(site: _Site, handler: Callable[..., Any]) -> Callable[..., Any]:
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
                return await handler(*args, **kwargs)
            try:
                span, token, had_id = site.start()
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

        return _with_resolved_signature(async_wrapper, original)

    @functools.wraps(handler)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        if group not in enabled.groups:
            return handler(*args, **kwargs)
        try:
            span, token, had_id = site.start()
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

    return _with_resolved_signature(sync_wrapper, handler)


def _wrap(
    group: str,
    span_name: str,
    handler: Callable[..., Any],
    static_attributes: Mapping[str, Any] | None,
    *,
    success_attributes: dict[str, Any] | None = None,
    failure_attributes: dict[str, Any] | None = None,
    read_result: bool = False,
    rollout: bool = False,
) -> Callable[..., Any]:
    site = _Site(
        group,
        span_name,
        _freeze_attributes(static_attributes),
        success_attributes,
        failure_attributes,
        read_result=read_result,
        rollout=rollout,
    )
    return _make_wrapper(site, handler)


# --- public API -----------------------------------------------------------------------------


def traced_endpoint(
    group: str,
    span_name: str,
    handler: _F,
    static_attributes: dict[str, Any] | None = None,
) -> _F:
    """Wrap a FastAPI handler in a span-group-gated span.

    ``group`` is checked at call time (span groups are configured long after routes are
    registered). ``static_attributes`` is evaluated once, here. Returns the wrapper,
    which has the handler's signature (``functools.wraps``). Never raises for
    telemetry reasons, at wrap time or at call time: with an unknown group the wrapper
    simply never records.
    """
    if group not in span_groups.GROUPS:
        _log.warning("gym_telemetry: traced_endpoint(%r, %r): unknown span group", group, span_name)
    return cast(_F, _wrap(group, span_name, handler, static_attributes))


_VERIFY_OK: Final[dict[str, bool]] = {semconv.VERIFY_SUCCEEDED: True}
_VERIFY_FAILED: Final[dict[str, bool]] = {semconv.VERIFY_SUCCEEDED: False}


def traced_rollout_endpoint(handler: _F, static_attributes: dict[str, Any] | None = None) -> _F:
    """``traced_endpoint`` for the agent's ``/run``: span ``gym.rollout``, group ``rollout``.

    One ``/run`` is one rollout, so this is the span everything else in the rollout
    hangs off: the model calls and verifications it triggers become its descendants
    through W3C trace-context propagation. The sidecar derives
    ``gym.rollout.duration_ms`` from it; the agent records no metrics.

    A rollout fails when the handler raises, and also when it *returns* one of Gym's
    in-band failure markers (``gym_telemetry.outcomes``: an episode ``failure``, a
    masked or failure-classed row, a relayed response with status >= 500): status
    ERROR and ``error.type`` = the failure kind. A rollout span started inside another
    recorded rollout span (``ENCLOSING_ROLLOUT``) carries
    ``nemo.gym.rollout.nested=true``.
    """
    wrapped = _wrap(
        semconv.GROUP_ROLLOUT,
        semconv.SPAN_ROLLOUT,
        handler,
        static_attributes,
        read_result=True,
        rollout=True,
    )
    return cast(_F, wrapped)


def traced_verify_endpoint(handler: _F, static_attributes: dict[str, Any] | None = None) -> _F:
    """``traced_endpoint`` for ``/verify``: span ``gym.verify``, group ``verify``.

    ``succeeded`` records whether the verification call completed, not whether the task
    passed: a verifier that returns reward 0 succeeded (``succeeded=true``); one that
    raises did not (``succeeded=false``, status ERROR, the exception recorded,
    ``error.type`` set, the original exception re-raised unchanged). Neither did one
    whose exception Gym's ``judge_failsafe`` turned into a 200 row: a returned object
    with ``mask_sample: true`` or ``_ng_failure_class`` (``gym_telemetry.outcomes``)
    gives ``succeeded=false``, status ERROR, ``error.type`` = its ``failure_kind``.
    Reward and accuracy are experiment data and are never read or recorded here. The
    sidecar derives ``gym.verify.*`` from these spans.
    """
    wrapped = _wrap(
        semconv.GROUP_VERIFY,
        semconv.SPAN_VERIFY,
        handler,
        static_attributes,
        success_attributes=_VERIFY_OK,
        failure_attributes=_VERIFY_FAILED,
        read_result=True,
    )
    return cast(_F, wrapped)


def traced_env_step_endpoint(handler: _F, static_attributes: dict[str, Any] | None = None) -> _F:
    """A gymnasium server's ``/step``: span ``gym.env.step``, group ``verify``.

    A gymnasium resources server computes its reward in ``/step`` instead of
    ``/verify``, so its steps are in the same span group as verifications, with the
    same ``succeeded`` semantics (the call completed; reward is never read). The
    sidecar derives ``gym.env.step.*`` from these spans.
    """
    wrapped = _wrap(
        semconv.GROUP_VERIFY,
        semconv.SPAN_ENV_STEP,
        handler,
        static_attributes,
        success_attributes=_VERIFY_OK,
        failure_attributes=_VERIFY_FAILED,
        read_result=True,
    )
    return cast(_F, wrapped)


__all__ = [
    "ROLLOUT_ID_ATTRIBUTE",
    "telemetry_errors",
    "traced_endpoint",
    "traced_env_step_endpoint",
    "traced_rollout_endpoint",
    "traced_verify_endpoint",
]
