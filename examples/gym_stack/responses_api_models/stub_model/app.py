"""A deterministic Gym model server for offline rollouts (no LLM).

``StubModelServer`` is a real ``SimpleResponsesAPIModel``: it serves every route of
Gym's model base class. Its ``responses()`` answers like a tool-using model would:

- no ``function_call_output`` in the input yet: one ``get_weather`` function call
  (arguments ``{"city": <stub_city>}``);
- otherwise: one assistant text message quoting the tool's output.

``chat_completions()`` answers with one fixed assistant message. Nothing here is random,
so a rollout through ``simple_agent`` and ``example_single_tool_call`` always earns
reward 1.0.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

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


def _item_type(item: Any) -> str | None:
    value = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return value if isinstance(value, str) else None


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
        items = body.input if isinstance(body.input, list) else []
        tool_outputs = [item for item in items if _item_type(item) == "function_call_output"]
        if tool_outputs:
            output: list[dict[str, Any]] = [
                {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "annotations": [],
                            "text": f"Weather report: {_item_output(tool_outputs[-1])}",
                        }
                    ],
                }
            ]
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
                        "message": {"role": "assistant", "content": "stub answer"},
                    }
                ],
            }
        )


if __name__ == "__main__":
    StubModelServer.run_webserver()
