"""OpenTelemetry GenAI attributes of a model call, read from the objects Gym holds (issue 41).

A Gym model server answers each dialect with an object before it serializes it: a
``NeMoGymResponse`` (Responses), a ``NeMoGymChatCompletion`` (Chat Completions), an
Anthropic message dict (Messages); a streamed answer is the same object as a dict, handed
to the SSE synthesizer. :func:`response_attributes` reads, from any of those:

- ``gen_ai.response.model``: ``model`` (all three);
- ``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens``: ``usage.input_tokens``
  / ``usage.output_tokens`` (Responses, Messages), ``usage.prompt_tokens`` /
  ``usage.completion_tokens`` (Chat Completions);
- ``gen_ai.response.finish_reasons``: each choice's ``finish_reason`` (Chat
  Completions), ``[stop_reason]`` (Messages), ``[incomplete_details.reason]`` when the
  response is incomplete, else ``[status]`` (Responses).

The dialect is told by the object's ``object`` (``response``, ``chat.completion``) or
``type`` (``message``) field. The Responses API has no finish reason of its own; its
``status`` (``completed``) or the reason it is incomplete (``max_output_tokens``) is
reported as is, as instrumentations report a provider's own stop reasons. Fields that are
absent or of the wrong type are left out; an object of no known dialect gives nothing.
:data:`ROUTE_ATTRIBUTES` are the per-route constants (``gen_ai.operation.name``,
``openai.api.type``), set at wrap time. Never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_telemetry.answers import fields

#: Longest string kept from a model answer (model names, finish reasons).
MAX_TEXT_CHARS: Final = 256
#: Most finish reasons kept (one per generation received).
MAX_FINISH_REASONS: Final = 16

#: Constant attributes of each model-call span, by span name (added at wrap time).
ROUTE_ATTRIBUTES: Final[Mapping[str, Mapping[str, str]]] = {
    semconv.SPAN_MODEL_RESPONSES: {
        semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT,
        semconv.OPENAI_API_TYPE: semconv.OPENAI_API_TYPE_RESPONSES,
    },
    semconv.SPAN_MODEL_CHAT: {
        semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT,
        semconv.OPENAI_API_TYPE: semconv.OPENAI_API_TYPE_CHAT_COMPLETIONS,
    },
    semconv.SPAN_MODEL_MESSAGES: {
        semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT,
    },
}
MODEL_SPANS: Final = frozenset(ROUTE_ATTRIBUTES)


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT_CHARS] if type(value) is str and value else None


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _usage(out: dict[str, Any], usage: Any, input_key: str, output_key: str) -> None:
    view = fields(usage) if usage is not None else None
    if view is None:
        return
    tokens_in = _count(view.get(input_key))
    if tokens_in is not None:
        out[semconv.GEN_AI_USAGE_INPUT_TOKENS] = tokens_in
    tokens_out = _count(view.get(output_key))
    if tokens_out is not None:
        out[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = tokens_out


def _responses_finish(view: Mapping[str, Any]) -> tuple[str, ...]:
    status = _text(view.get("status"))
    details = view.get("incomplete_details")
    if details is not None:
        details_view = fields(details)
        reason = _text(details_view.get("reason")) if details_view is not None else None
        if reason is not None:
            return (reason,)
    return (status,) if status is not None else ()


def _chat_finish(view: Mapping[str, Any]) -> tuple[str, ...]:
    choices = view.get("choices")
    if type(choices) is not list:
        return ()
    reasons = []
    for choice in choices[:MAX_FINISH_REASONS]:
        choice_view = fields(choice)
        reason = _text(choice_view.get("finish_reason")) if choice_view is not None else None
        if reason is not None:
            reasons.append(reason)
    return tuple(reasons)


def response_attributes(answer: Any) -> dict[str, Any]:
    """The GenAI attributes of a model answer object (module doc); empty when none."""
    out: dict[str, Any] = {}
    try:
        view = fields(answer)
        if view is None:
            return out
        kind = view.get("object")
        if kind == "response":
            _usage(out, view.get("usage"), "input_tokens", "output_tokens")
            reasons = _responses_finish(view)
        elif kind == "chat.completion":
            _usage(out, view.get("usage"), "prompt_tokens", "completion_tokens")
            reasons = _chat_finish(view)
        elif view.get("type") == "message":
            _usage(out, view.get("usage"), "input_tokens", "output_tokens")
            stop = _text(view.get("stop_reason"))
            reasons = (stop,) if stop is not None else ()
        else:
            return out
        model = _text(view.get("model"))
        if model is not None:
            out[semconv.GEN_AI_RESPONSE_MODEL] = model
        if reasons:
            out[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
    except Exception:  # a strange object: what was read so far stands
        pass
    return out


def request_model(body: Any) -> str | None:
    """The ``model`` a model call's parsed request body (a dict or a pydantic model) asks
    for, or None."""
    try:
        view = fields(body)
        return _text(view.get("model")) if view is not None else None
    except Exception:  # a strange body: no model read
        return None


__all__ = [
    "MODEL_SPANS",
    "ROUTE_ATTRIBUTES",
    "request_model",
    "response_attributes",
]
