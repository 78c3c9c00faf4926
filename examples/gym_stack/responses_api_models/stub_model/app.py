"""A deterministic Gym model server for offline rollouts (no LLM).

``StubModelServer`` is a real ``SimpleResponsesAPIModel``: it serves every route of
Gym's model base class. Its ``responses()`` answers like a tool-using model would:

- no ``function_call_output`` in the input yet and the request offers tools: one
  ``get_weather`` function call (arguments ``{"city": <stub_city>}``);
- a ``function_call_output`` in the input: one assistant text message quoting the
  tool's output;
- no tools offered (a judge prompt, a gymnasium turn): one assistant message whose
  text is ``stub_text``.

``fail_markers`` (none by default): a request whose input text contains one of them
gets HTTP 500, as an unavailable model would. The real-Gym tests make an LLM judge fail
on request this way (a marker in a task's expected answer, which only the judge's prompt
contains) and a policy call fail (a marker in the user message).

``chat_completions()`` answers with one fixed assistant message. Nothing here is random,
so a rollout through ``simple_agent`` and ``example_single_tool_call`` always earns
reward 1.0.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import HTTPException
from nemo_gym.base_responses_api_model import (
    BaseResponsesAPIModelConfig,
    Body,
    SimpleResponsesAPIModel,
)
from nemo_gym.openai_utils import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
)


class StubModelServerConfig(BaseResponsesAPIModelConfig):
    """Config of the stub: the city its function call asks about."""

    stub_city: str = "San Francisco"
    stub_text: str = "stub answer"
    fail_markers: list[str] = []


def _item_type(item: Any) -> str | None:
    value = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return value if isinstance(value, str) else None


def _input_text(items: Any) -> str:
    if isinstance(items, str):
        return items
    parts: list[str] = []
    for item in items if isinstance(items, list) else []:
        content = item.get("content") if isinstance(item, dict) else getattr(item, "content", None)
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for part in content:
                text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
                if isinstance(text, str):
                    parts.append(text)
    return "\n".join(parts)


def _message(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "annotations": [], "text": text}],
    }


def _item_output(item: Any) -> str:
    value = item.get("output") if isinstance(item, dict) else getattr(item, "output", "")
    return value if isinstance(value, str) else json.dumps(value, default=str)


class StubModelServer(SimpleResponsesAPIModel):
    """Model server whose answers are fixed: first a tool call, then a text message."""

    ray_enabled = False
    config: StubModelServerConfig

    async def responses(
        self,
        body: NeMoGymResponseCreateParamsNonStreaming = Body(),  # noqa: B008 - FastAPI's own idiom, as in Gym's base class
    ) -> NeMoGymResponse:
        if self.config.fail_markers:
            text = _input_text(body.input)
            for marker in self.config.fail_markers:
                if marker and marker in text:
                    raise HTTPException(status_code=500, detail=f"stub model fails on {marker!r}")
        items = body.input if isinstance(body.input, list) else []
        tool_outputs = [item for item in items if _item_type(item) == "function_call_output"]
        output: list[dict[str, Any]]
        if tool_outputs:
            output = [_message(f"Weather report: {_item_output(tool_outputs[-1])}")]
        elif not body.tools:
            output = [_message(self.config.stub_text)]
        else:
            output = [
                {
                    "id": f"fc_{uuid.uuid4().hex}",
                    "type": "function_call",
                    "call_id": f"call_{uuid.uuid4().hex}",
                    "name": "get_weather",
                    "arguments": json.dumps({"city": self.config.stub_city}),
                    "status": "completed",
                }
            ]
        return NeMoGymResponse.model_validate(
            {
                "id": f"resp_{uuid.uuid4().hex}",
                "object": "response",
                "created_at": time.time(),
                "model": "stub-model",
                "output": output,
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
            }
        )

    async def chat_completions(
        self,
        body: NeMoGymChatCompletionCreateParamsNonStreaming = Body(),  # noqa: B008 - FastAPI's own idiom, as in Gym's base class
    ) -> NeMoGymChatCompletion:
        return NeMoGymChatCompletion.model_validate(
            {
                "id": f"chatcmpl_{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": "stub-model",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": self.config.stub_text},
                    }
                ],
            }
        )


if __name__ == "__main__":
    StubModelServer.run_webserver()
