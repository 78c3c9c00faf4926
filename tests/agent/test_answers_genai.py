"""issue 41: the RL figures read from the objects Gym's handlers return (``answers``,
``genai``), on pydantic models shaped like Gym's and on the dicts of a streamed answer."""

from __future__ import annotations

import math
from typing import Any

from gym_telemetry.answers import reward_of, usage_of
from gym_telemetry.genai import ROUTE_ATTRIBUTES, request_model, response_attributes
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int = 0


class ModelResponse(BaseModel):
    id: str = "resp_1"
    object: str = "response"
    model: str = "served-model"
    status: str | None = "completed"
    incomplete_details: dict[str, Any] | None = None
    usage: Usage | None = None


class VerifyResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    reward: float
    response: ModelResponse | None = None


class Episode(BaseModel):
    result: VerifyResponse | None = None
    failure: dict[str, Any] | None = None


def test_reward_of_numbers_only() -> None:
    assert reward_of(VerifyResponse(reward=0.0)) == 0.0
    assert reward_of({"reward": 1}) == 1.0
    assert type(reward_of({"reward": 1})) is float
    assert reward_of({"reward": -0.5}) == -0.5
    for bad in (True, "1.0", None, math.nan, math.inf, [1.0]):
        assert reward_of({"reward": bad}) is None, bad
    assert reward_of({"no": "reward"}) is None
    assert reward_of(None) is None and reward_of("text") is None and reward_of(3) is None


def test_reward_of_an_episode_reads_its_result() -> None:
    assert reward_of(Episode(result=VerifyResponse(reward=0.25))) == 0.25
    assert reward_of({"result": {"reward": 0.75}}) == 0.75
    assert reward_of(Episode(failure={"failure_kind": "x"})) is None


def test_reward_of_a_raw_response_is_not_read() -> None:
    # judge_failsafe's row and a relay's passthrough are bytes: not parsed again
    assert reward_of(JSONResponse({"reward": 1.0})) is None


def test_usage_of_a_run_answer() -> None:
    answer = VerifyResponse(
        reward=1.0, response=ModelResponse(usage=Usage(input_tokens=7, output_tokens=3))
    )
    assert usage_of(answer) == (7, 3)
    assert usage_of({"response": {"usage": {"input_tokens": 2, "output_tokens": 0}}}) == (2, 0)
    assert usage_of(Episode(result=answer)) == (7, 3)
    assert usage_of(VerifyResponse(reward=1.0, response=ModelResponse())) is None
    assert usage_of({"response": {"usage": {"input_tokens": True, "output_tokens": 1}}}) is None
    assert usage_of({"response": {"usage": {"input_tokens": -1, "output_tokens": 1}}}) is None
    assert usage_of(JSONResponse({"response": {}})) is None


class Choice(BaseModel):
    index: int
    finish_reason: str


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class ChatCompletion(BaseModel):
    object: str = "chat.completion"
    model: str = "chat-served"
    choices: list[Choice]
    usage: ChatUsage | None = None


def test_responses_dialect() -> None:
    answer = ModelResponse(usage=Usage(input_tokens=11, output_tokens=5))
    assert response_attributes(answer) == {
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.response.model": "served-model",
        "gen_ai.response.finish_reasons": ("completed",),
    }
    incomplete = answer.model_dump()
    incomplete.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    assert response_attributes(incomplete)["gen_ai.response.finish_reasons"] == (
        "max_output_tokens",
    )


def test_chat_completions_dialect() -> None:
    answer = ChatCompletion(
        choices=[
            Choice(index=0, finish_reason="tool_calls"),
            Choice(index=1, finish_reason="stop"),
        ],
        usage=ChatUsage(prompt_tokens=4, completion_tokens=9),
    )
    assert response_attributes(answer) == {
        "gen_ai.usage.input_tokens": 4,
        "gen_ai.usage.output_tokens": 9,
        "gen_ai.response.model": "chat-served",
        "gen_ai.response.finish_reasons": ("tool_calls", "stop"),
    }
    # a streamed answer is the same object as a dict; no usage, no usage attributes
    streamed = answer.model_dump()
    streamed["usage"] = None
    assert response_attributes(streamed) == {
        "gen_ai.response.model": "chat-served",
        "gen_ai.response.finish_reasons": ("tool_calls", "stop"),
    }


def test_messages_dialect() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-ish",
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    assert response_attributes(message) == {
        "gen_ai.usage.input_tokens": 3,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.response.model": "claude-ish",
        "gen_ai.response.finish_reasons": ("tool_use",),
    }


def test_unknown_shapes_give_nothing() -> None:
    for answer in (None, b"{}", {"object": "list"}, {"type": "error"}, JSONResponse({})):
        assert response_attributes(answer) == {}
    bad_types = {"object": "response", "model": 3, "usage": {"input_tokens": "1"}}
    assert response_attributes(bad_types) == {}


def test_request_model_and_route_constants() -> None:
    assert request_model({"model": "m", "input": "x"}) == "m"
    assert request_model(ModelResponse()) == "served-model"
    assert request_model({"model": ""}) is None and request_model(None) is None
    operations = {route["gen_ai.operation.name"] for route in ROUTE_ATTRIBUTES.values()}
    assert operations == {"chat"}
    assert ROUTE_ATTRIBUTES["gym.model.responses"]["openai.api.type"] == "responses"
    assert ROUTE_ATTRIBUTES["gym.model.chat_completions"]["openai.api.type"] == "chat_completions"
    assert "openai.api.type" not in ROUTE_ATTRIBUTES["gym.model.messages"]
