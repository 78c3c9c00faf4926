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
- Enabled, the span is recorded through ``gym_telemetry._lean`` (a lean path over
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
  returned value itself is passed back untouched.
- The reward is its own attribute: ``gym.verify``, ``gym.env.step`` and ``gym.rollout``
  carry ``nemo.gym.reward`` (a double) when the returned object (a pydantic model or a
  dict, never a response body) has a numeric ``reward`` (``gym_telemetry.answers``). It
  never changes ``succeeded`` or the span's status: a reward of 0 is a completed call.
- ``gym.rollout`` also carries ``nemo.gym.rollout.turns`` (the model calls its hops made,
  ``gym_telemetry.inflight``) and, when the ``/run`` answer carries the usage Gym summed,
  ``nemo.gym.rollout.input_tokens`` / ``output_tokens``; a ``model_call`` span carries
  the OpenTelemetry GenAI attributes (``gym_telemetry.genai``). While a recorded
  ``gym.rollout`` span runs, its rollout is in flight (``gym_telemetry.inflight``): the
  live events announce it (``gym_telemetry._live``).
- A ``gym.rollout`` span started inside another *recorded* rollout span
  (``rollout_correlation.ENCLOSING_ROLLOUT``: one of this process, or one upstream
  whose hop carried the outer-rollout baggage marker) carries
  ``nemo.gym.rollout.nested=true``; the sidecar derives rollout metrics from the
  outermost only. A rollout id alone never makes a
  span nested.
- Async handlers (Gym's) get an async wrapper; plain functions get a sync wrapper.
- A ``model_call`` span whose handler returned a streamed response ends when the
  stream does, with a failure event in the stream or a disconnect read as ERROR
  (``gym_telemetry.streaming``).
- No metrics are recorded here; the sidecar derives them from the spans.

This module is the API; the wrapper itself (one sync/async pair for every wrapped
handler in the agent) is built by the private ``gym_telemetry._engine``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import gym_telemetry_semconv as semconv

from gym_telemetry import _engine

ROLLOUT_ID_ATTRIBUTE: Final = semconv.ROLLOUT_ID

_F = TypeVar("_F", bound=Callable[..., Any])


def telemetry_errors() -> int:
    """How many telemetry failures the wrappers have swallowed in this process."""
    return _engine.telemetry_errors()


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
    _engine.check_group(group, span_name)
    return cast(_F, _engine.wrap(group, span_name, handler, static_attributes))


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
    recorded rollout span (``rollout_correlation.ENCLOSING_ROLLOUT``) carries
    ``nemo.gym.rollout.nested=true``.
    """
    return cast(_F, _engine.wrap_rollout(handler, static_attributes))


def traced_verify_endpoint(handler: _F, static_attributes: dict[str, Any] | None = None) -> _F:
    """``traced_endpoint`` for ``/verify``: span ``gym.verify``, group ``verify``.

    ``succeeded`` records whether the verification call completed, not whether the task
    passed: a verifier that returns reward 0 succeeded (``succeeded=true``); one that
    raises did not (``succeeded=false``, status ERROR, the exception recorded,
    ``error.type`` set, the original exception re-raised unchanged). Neither did one
    whose exception Gym's ``judge_failsafe`` turned into a 200 row: a returned object
    with ``mask_sample: true`` or ``_ng_failure_class`` (``gym_telemetry.outcomes``)
    gives ``succeeded=false``, status ERROR, ``error.type`` = its ``failure_kind``.
    The returned object's numeric ``reward`` is recorded as ``nemo.gym.reward`` (its own
    attribute: it never changes ``succeeded``); a verifier that raised, or a failure row
    Gym returned as bytes, has none. The sidecar derives ``gym.verify.*`` from these
    spans.
    """
    return cast(_F, _engine.wrap_verify(semconv.SPAN_VERIFY, handler, static_attributes))


def traced_env_step_endpoint(handler: _F, static_attributes: dict[str, Any] | None = None) -> _F:
    """A gymnasium server's ``/step``: span ``gym.env.step``, group ``verify``.

    A gymnasium resources server computes its reward in ``/step`` instead of
    ``/verify``, so its steps are in the same span group as verifications, with the
    same ``succeeded`` semantics (the call completed) and the step's reward as
    ``nemo.gym.reward``. The sidecar derives ``gym.env.step.*`` from these spans.
    """
    return cast(_F, _engine.wrap_verify(semconv.SPAN_ENV_STEP, handler, static_attributes))


__all__ = [
    "ROLLOUT_ID_ATTRIBUTE",
    "telemetry_errors",
    "traced_endpoint",
    "traced_env_step_endpoint",
    "traced_rollout_endpoint",
    "traced_verify_endpoint",
]
