"""A Gym model server's answers, read as objects before Gym serializes them (issue 41).

Gym's model routes (``SimpleResponsesAPIModel``'s ``/v1/responses``,
``/v1/chat/completions``, ``/v1/messages`` dispatchers) turn the answer object into bytes
before returning: ``_orjson_dispatch_response(content)`` for a plain answer,
``self._stream_served_response(response, events)`` for a streamed one. Their wrapper
(the ``model_call`` span) sees only the bytes, and reading usage from them would parse
the body a second time. So the Gym integration wraps both (``patch``, right after
``nemo_gym.base_responses_api_model`` loads) to hand the object to
:func:`note_answer` first: with group ``model_call`` enabled, the GenAI attributes of the
answer (``genai.response_attributes``: response model, usage, finish reasons) go on the
model-call span -- the current span while the handler runs, or, for a chat completion
Gym answers from inside its stream (generation longer than its keep-alive interval),
the span whose stream is being sent (``streaming.STREAM_SPAN``). Then Gym's own code
runs unchanged, with the same arguments. A model server that overrides these steps
answers without the attributes (nothing is parsed instead). Never raises into Gym.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry import trace

from gym_telemetry import span_groups
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.genai import MODEL_SPANS, response_attributes
from gym_telemetry.streaming import STREAM_SPAN

_log = logging.getLogger(__name__)

#: Attribute marking a function this module put in place (patching is idempotent).
PATCHED: Final = "_gym_telemetry_model_calls"
_ENABLED: Final = span_groups.ENABLED
_GROUP: Final = semconv.GROUP_MODEL_CALL


def _model_span() -> Any:
    span = trace.get_current_span()
    if getattr(span, "name", None) in MODEL_SPANS and span.is_recording():
        return span
    return STREAM_SPAN.get()


def note_answer(answer: Any) -> None:
    """Put ``answer``'s GenAI attributes on the model-call span (module doc)."""
    if _GROUP not in _ENABLED.groups:
        return
    try:
        span = _model_span()
        if span is None:
            return
        attributes = response_attributes(answer)
        if attributes:
            if type(span) is LeanSpan:
                span.add_clean(attributes)  # response_attributes' values are clean
            else:
                span.set_attributes(attributes)
    except Exception:  # best effort: the answer goes out either way
        _log.debug("gym_telemetry: could not read a model answer", exc_info=True)


def _dispatch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _orjson_dispatch_response(content: Any, *args: Any, **kwargs: Any) -> Any:
        note_answer(content)
        return original(content, *args, **kwargs)

    setattr(_orjson_dispatch_response, PATCHED, True)
    return _orjson_dispatch_response


def _stream(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _stream_served_response(self: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        note_answer(response)
        return await original(self, response, *args, **kwargs)

    setattr(_stream_served_response, PATCHED, True)
    return _stream_served_response


def patch(module: ModuleType) -> None:
    """Wrap ``nemo_gym.base_responses_api_model``'s two serialization steps (module doc);
    a step that is missing is left alone. Idempotent."""
    dispatch = getattr(module, "_orjson_dispatch_response", None)
    if callable(dispatch) and not getattr(dispatch, PATCHED, False):
        module._orjson_dispatch_response = _dispatch(dispatch)  # type: ignore[attr-defined]
    model_cls = getattr(module, "SimpleResponsesAPIModel", None)
    stream = getattr(model_cls, "_stream_served_response", None)
    if stream is not None and not getattr(stream, PATCHED, False):
        model_cls._stream_served_response = _stream(stream)  # type: ignore[union-attr]


__all__ = ["note_answer", "patch"]
