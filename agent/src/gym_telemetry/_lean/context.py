"""The current context and span contexts without the API's Python layers.

Every span the agent records reads the current ``Context``, makes a new one current and
later restores the old one; its ``SpanContext`` and its parent's are built and read
field by field. Through the public API that is a chain of Python calls per step
(``context.get_current`` -> the runtime context's ``get_current`` -> ``ContextVar.get``;
``SpanContext(...)`` runs a Python ``__new__``; each of ``trace_id``, ``span_id``,
``trace_flags``, ``trace_state``, ``is_valid`` is a Python property). This module binds
the same steps to the objects underneath once, after checking them:

- ``get_current`` / ``attach`` / ``reset``: the ``ContextVar`` of the API's default
  runtime context (``opentelemetry.context._RUNTIME_CONTEXT._current_context``, the
  ``contextvars`` implementation) read, set and reset directly: the same variable the
  API's ``get_current`` / ``attach`` / ``detach`` use, so both views always agree.
  ``reset`` raises where ``ContextVar.reset`` does (a token of another context, or used
  twice); callers catch it, as the API's ``detach`` does.
- ``with_span(span, base)``: ``set_value(<current-span key>, span, base)``: the same
  immutable ``Context`` with one key added.
- ``span_context(trace_id, span_id, is_remote, flags, state)``: a valid ``SpanContext``
  made as ``SpanContext.__new__`` makes it (a 6-tuple subclass whose last field is
  ``is_valid``), for ids known to be valid.
- ``TUPLE_LAYOUT``: whether a ``SpanContext`` can be read by unpacking it as that
  tuple (``trace_id, span_id, is_remote, trace_flags, trace_state, is_valid``): the
  recorder and the encoder read their fields that way only when it is True.

Each binding is checked once at import against the installed API (another runtime
context selected with ``OTEL_PYTHON_CONTEXT``, a ``SpanContext`` that is not that
tuple); where the check fails, the public API function is used instead, so the
behaviour is the same either way and only the cost differs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import Any, Final

from opentelemetry import context as context_api
from opentelemetry.context.context import Context
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from gym_telemetry._lean.sdk_hooks import SPAN_KEY

_log = logging.getLogger(__name__)
_tuple_new = tuple.__new__
_dict_setitem = dict.__setitem__


def _runtime_var() -> ContextVar[Context] | None:
    """The ContextVar behind the API's runtime context, if it is the contextvars one and
    behaves as such; else None."""
    try:
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

        runtime = getattr(context_api, "_RUNTIME_CONTEXT", None)
        if type(runtime) is not ContextVarsRuntimeContext:
            return None
        var = getattr(runtime, "_current_context", None)
        if not isinstance(var, ContextVar):
            return None
        probe = Context({"gym_telemetry.probe": True})
        token = context_api.attach(probe)
        try:
            same = var.get() is probe and context_api.get_current() is probe
        finally:
            context_api.detach(token)
        if not same or var.get() is probe:
            return None
        token = var.set(probe)
        try:
            same = context_api.get_current() is probe
        finally:
            var.reset(token)
        return var if same else None
    except Exception as exc:  # any surprise: the API's own functions
        _log.info("gym_telemetry: runtime context not reachable directly (%r)", exc)
        return None


def _api_with_span(span: object, base: Context) -> Context:
    return context_api.set_value(SPAN_KEY, span, base)


def _fast_with_span(span: object, base: Context) -> Context:
    new = Context(base)
    _dict_setitem(new, SPAN_KEY, span)
    return new


def _api_span_context(
    trace_id: int, span_id: int, is_remote: bool, flags: TraceFlags, state: TraceState
) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote, flags, state)


def _fast_span_context(
    trace_id: int, span_id: int, is_remote: bool, flags: TraceFlags, state: TraceState
) -> SpanContext:
    span_context: SpanContext = _tuple_new(
        SpanContext, (trace_id, span_id, is_remote, flags, state, True)
    )
    return span_context


def _properties(span_context: SpanContext) -> tuple[Any, ...]:
    return (
        span_context.trace_id,
        span_context.span_id,
        span_context.is_remote,
        span_context.trace_flags,
        span_context.trace_state,
        span_context.is_valid,
    )


def _tuple_layout_ok() -> bool:
    """Whether ``SpanContext`` is the 6-tuple ``_fast_span_context`` builds and
    ``fields`` unpacks (its properties read the same fields)."""
    try:
        state = TraceState([("k", "v")])
        flags = TraceFlags(1)
        for remote in (True, False):
            stock = SpanContext(0xABC, 0xDEF, remote, flags, state)
            fast = _fast_span_context(0xABC, 0xDEF, remote, flags, state)
            if not isinstance(stock, tuple) or len(stock) != 6:
                return False
            if tuple(stock) != tuple(fast) or type(fast) is not SpanContext:
                return False
            if tuple(stock) != _properties(stock) or _properties(fast) != _properties(stock):
                return False
            if stock != fast or repr(stock) != repr(fast):
                return False
        return True
    except Exception as exc:  # any surprise: the API's own constructor
        _log.info("gym_telemetry: SpanContext layout changed (%r); public API used", exc)
        return False


_VAR: Final = _runtime_var()
#: Whether a ``SpanContext`` is the 6-tuple (module doc).
TUPLE_LAYOUT: Final = _tuple_layout_ok()

get_current: Callable[[], Context]
attach: Callable[[Context], Token[Context]]
reset: Callable[[Any], None]
with_span: Callable[[object, Context], Context]
if _VAR is not None:
    get_current = _VAR.get
    attach = _VAR.set
    reset = _VAR.reset
    with_span = _fast_with_span
else:
    get_current = context_api.get_current
    attach = context_api.attach
    reset = context_api.detach
    with_span = _api_with_span

span_context: Callable[[int, int, bool, TraceFlags, TraceState], SpanContext]
span_context = _fast_span_context if TUPLE_LAYOUT else _api_span_context


def detach(token: Any) -> None:
    """Restore the context ``token`` replaced; a failure is logged, never raised (the
    API's ``detach``)."""
    try:
        reset(token)
    except Exception:  # as the API's detach: a context bug must not reach the caller
        _log.exception("Failed to detach context")
