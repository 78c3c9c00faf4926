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

The first turn calls the first tool the request offers: ``get_weather`` (any tool with
a ``city`` parameter) gets ``{"city": <stub_city>}``; any other tool gets its first
parameter set to the last user message (``litmus_agent``'s code tool then runs that
message as a cell).

``SLEEP:<seconds>`` in the input text (or a chat message) makes the call wait that long
first (a slow model, for the cancellation and streaming tests). ``WAIT_FILE:<path>``
makes it wait until that file exists (a model call that hangs until a test releases it;
checked every 50 ms, at most ``max_wait_file_s``, 600 s by default, then it answers).

Every answer reports token usage, a fixed pair per kind of answer from the config:
``usage_tool_call`` (a function/tool call; default ``[13, 5]``) and ``usage_text`` (a text
message; default ``[21, 8]``), as ``[input, output]`` tokens (``usage.input_tokens`` /
``output_tokens`` on ``/v1/responses`` and, through Gym's mapping, ``/v1/messages``;
``prompt_tokens`` / ``completion_tokens`` on ``/v1/chat/completions``). The answers' model
is ``served_model`` (default ``stub-model``), whatever the request asked for.

``chat_completions()`` answers with one fixed assistant message; when the request offers
tools and no tool result is in the messages yet, it calls the first tool offered with
``{"command": <chat_command>}`` (default ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``,
which makes mini-swe-agent submit at once). ``fail_markers`` apply to it too. Nothing
here is random, so a rollout through ``simple_agent`` and ``example_single_tool_call``
always earns reward 1.0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
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
    chat_command: str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    usage_tool_call: tuple[int, int] = (13, 5)
    usage_text: tuple[int, int] = (21, 8)
    served_model: str = "stub-model"
    max_wait_file_s: float = 600.0


_SLEEP = re.compile(r"SLEEP:([0-9]+(?:\.[0-9]+)?)")
_WAIT_FILE = re.compile(r"WAIT_FILE:(\S+)")


async def _maybe_sleep(text: str, max_wait_s: float = 600.0) -> None:
    match = _SLEEP.search(text)
    if match is not None:
        await asyncio.sleep(float(match.group(1)))
    match = _WAIT_FILE.search(text)
    if match is not None:
        waited = 0.0
        # a stat per 50 ms on a test stub's loop: os.path.exists blocking is fine here
        while waited < max_wait_s and not os.path.exists(match.group(1)):  # noqa: ASYNC240
            await asyncio.sleep(0.05)
            waited += 0.05


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
        text = _input_text(body.input)
        await _maybe_sleep(text, self.config.max_wait_file_s)
        self._maybe_fail(text)
        items = body.input if isinstance(body.input, list) else []
        tool_outputs = [item for item in items if _item_type(item) == "function_call_output"]
        output: list[dict[str, Any]]
        usage = self.config.usage_text
        if tool_outputs:
            output = [_message(f"Weather report: {_item_output(tool_outputs[-1])}")]
        elif not body.tools:
            output = [_message(self.config.stub_text)]
        else:
            usage = self.config.usage_tool_call
            output = [
                {
                    "id": f"fc_{uuid.uuid4().hex}",
                    "type": "function_call",
                    "call_id": f"call_{uuid.uuid4().hex}",
                    "name": _tool_field(body.tools[0], "name") or "get_weather",
                    "arguments": json.dumps(self._tool_arguments(body.tools[0], items)),
                    "status": "completed",
                }
            ]
        return NeMoGymResponse.model_validate(
            {
                "id": f"resp_{uuid.uuid4().hex}",
                "object": "response",
                "created_at": time.time(),
                "model": self.config.served_model,
                "status": "completed",
                "output": output,
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
                "usage": _responses_usage(usage),
            }
        )

    def _tool_arguments(self, tool: Any, items: list[Any]) -> dict[str, Any]:
        parameters = _tool_field(tool, "parameters") or {}
        names = list((parameters.get("properties") or {}) if isinstance(parameters, dict) else {})
        if not names or "city" in names:
            return {"city": self.config.stub_city}
        users = [item for item in items if _role(item) == "user"]
        return {names[0]: _input_text(users[-1:])}

    def _maybe_fail(self, text: str) -> None:
        for marker in self.config.fail_markers:
            if marker and marker in text:
                raise HTTPException(status_code=500, detail=f"stub model fails on {marker!r}")

    async def chat_completions(
        self,
        body: NeMoGymChatCompletionCreateParamsNonStreaming = Body(),  # noqa: B008 - FastAPI's own idiom, as in Gym's base class
    ) -> NeMoGymChatCompletion:
        messages = list(body.messages)
        text = _input_text(messages)
        await _maybe_sleep(text, self.config.max_wait_file_s)
        self._maybe_fail(text)
        tools = list(body.tools or [])
        answered = any(_role(message) == "tool" for message in messages)
        message: dict[str, Any] = {"role": "assistant", "content": self.config.stub_text}
        finish_reason = "stop"
        usage = self.config.usage_text
        if tools and not answered:
            usage = self.config.usage_tool_call
            function = tools[0].get("function", {}) if isinstance(tools[0], dict) else {}
            message = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{uuid.uuid4().hex}",
                        "type": "function",
                        "function": {
                            "name": function.get("name", "bash"),
                            "arguments": json.dumps({"command": self.config.chat_command}),
                        },
                    }
                ],
            }
            finish_reason = "tool_calls"
        return NeMoGymChatCompletion.model_validate(
            {
                "id": f"chatcmpl_{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.config.served_model,
                "choices": [{"index": 0, "finish_reason": finish_reason, "message": message}],
                "usage": {
                    "prompt_tokens": usage[0],
                    "completion_tokens": usage[1],
                    "total_tokens": usage[0] + usage[1],
                },
            }
        )


def _responses_usage(usage: tuple[int, int]) -> dict[str, Any]:
    tokens_in, tokens_out = usage
    return {
        "input_tokens": tokens_in,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": tokens_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens_in + tokens_out,
    }


def _tool_field(tool: Any, key: str) -> Any:
    return tool.get(key) if isinstance(tool, dict) else getattr(tool, key, None)


def _role(message: Any) -> str | None:
    value = message.get("role") if isinstance(message, dict) else getattr(message, "role", None)
    return value if isinstance(value, str) else None


if __name__ == "__main__":
    StubModelServer.run_webserver()
