"""Gym's in-band failure markers: what ``failure_of`` reads, and what the wrappers make of it.

The shapes below are Gym 0.7.0's (``judge_failsafe``'s masked row as a ``JSONResponse``,
``BaseVerifyResponse`` fields, ``BaseEpisodeResponse``'s ``failure``/``result``, the
``legacy_agent`` relay's raw ``Response``), rebuilt here with pydantic and Starlette so
the agent's tests need no Gym; ``tests/gym/test_gym_semantics.py`` checks the same
against real Gym servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from fastapi.responses import JSONResponse
from gym_telemetry import outcomes, span_groups
from gym_telemetry.endpoints import (
    traced_env_step_endpoint,
    traced_rollout_endpoint,
    traced_verify_endpoint,
)
from gym_telemetry.outcomes import (
    MAX_BODY_BYTES,
    MAX_KIND_CHARS,
    MAX_REASON_CHARS,
    Failure,
    failure_of,
)
from opentelemetry.trace import StatusCode
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from tests.agent.conftest import Spans


class VerifyResponse(BaseModel):
    """Like Gym's ``BaseVerifyResponse`` (only the fields read here)."""

    model_config = ConfigDict(extra="allow")
    reward: float
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None


class EpisodeFailure(BaseModel):
    failure_reason: str
    terminal: bool
    failure_kind: str | None = None
    stage: str | None = None


class EpisodeResponse(BaseModel):
    episode_id: dict[str, Any]
    result: VerifyResponse | None = None
    failure: EpisodeFailure | None = None


def _failsafe_row() -> JSONResponse:
    """What ``judge_failsafe`` returns for a judge that raised."""
    return JSONResponse(
        {
            "response": {"output": []},
            "reward": 0.0,
            "mask_sample": True,
            "failure_kind": "judge_failed",
            "failure_reason": "JudgeError: 500",
            "instance_config": {"mask_sample": True},
            "_ng_failure_class": "judge_failed",
        }
    )


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (VerifyResponse(reward=0.0), None),  # a wrong answer is not a failure
        (VerifyResponse(reward=1.0, failure_kind="judge_unparseable"), None),  # measured
        (
            VerifyResponse(reward=0.0, mask_sample=True, failure_kind="session_lost"),
            Failure("session_lost", None),
        ),
        (VerifyResponse(reward=0.0, mask_sample=True), Failure("_OTHER", None)),
        (
            VerifyResponse.model_validate({"reward": 0.0, "_ng_failure_class": "judge_failed"}),
            Failure("judge_failed", None),
        ),
        (_failsafe_row(), Failure("judge_failed", "JudgeError: 500")),
        ({"mask_sample": True, "failure_kind": "judge_failed"}, Failure("judge_failed", None)),
        ({"mask_sample": False, "reward": 1.0}, None),
        (
            EpisodeResponse(
                episode_id={},
                failure=EpisodeFailure(failure_reason="boom", terminal=False, stage="agent"),
            ),
            Failure("environment_server_failed", "boom", "agent"),
        ),
        (
            EpisodeResponse(
                episode_id={},
                failure=EpisodeFailure(failure_reason="t", terminal=True, failure_kind="x:y"),
            ),
            Failure("x:y", "t", None),
        ),
        (
            EpisodeResponse(
                episode_id={},
                result=VerifyResponse(reward=0.0, mask_sample=True, failure_kind="judge_failed"),
            ),
            Failure("judge_failed", None),
        ),
        (EpisodeResponse(episode_id={}, result=VerifyResponse(reward=1.0)), None),
        (Response(b"upstream broke", status_code=502), Failure("502", None)),
        (JSONResponse({"reward": 1.0, "mask_sample": False}), None),
        (
            Response(b'{"mask_sample":true,"failure_kind":"k"}', media_type="application/json"),
            Failure("k", None),
        ),
        (Response(b'not json "mask_sample":true', media_type="application/json"), None),
        (Response(b'{"mask_sample": true}'), None),  # spaced JSON is not searched
        # a relayed 200 carrying a masked row (the legacy_agent relay's plain Response)
        (
            Response(b'{"reward":0.0,"mask_sample":true,"_ng_failure_class":"judge_failed"}'),
            Failure("judge_failed", None),
        ),
        (Response(b'{"x": {"mask_sample":true}, "mask_sample":false}'), None),  # top level only
        (Response(b"x" * (4 * 1024 * 1024 + 1) + b'"mask_sample":true'), None),  # too large
        (None, None),
        ("text", None),
        ([{"mask_sample": True}], None),
    ],
)
def test_failure_of_reads_gyms_markers(result: Any, expected: Failure | None) -> None:
    assert failure_of(result) == expected


def test_failure_of_never_raises() -> None:
    class Hostile:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(name)

    assert failure_of(Hostile()) is None


def _row_of_size(size: int) -> bytes:
    """A compact masked verify row of exactly ``size`` bytes (valid JSON)."""
    head, tail = b'{"mask_sample":true,"failure_kind":"k","pad":"', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_response_bodies_are_read_up_to_the_limit_and_not_past_it() -> None:
    assert len(_row_of_size(MAX_BODY_BYTES)) == MAX_BODY_BYTES
    assert failure_of(Response(_row_of_size(MAX_BODY_BYTES))) == Failure("k", None)
    assert failure_of(Response(_row_of_size(MAX_BODY_BYTES + 1))) is None


def test_long_kinds_reasons_and_stages_are_clipped() -> None:
    """``error.type`` is a metric label: a runaway string is clipped, never kept whole."""
    long = "k" * (MAX_KIND_CHARS + 50)
    reason = "r" * (MAX_REASON_CHARS + 50)
    masked = {"mask_sample": True, "failure_kind": long, "failure_reason": reason}
    assert failure_of(masked) == Failure(long[:MAX_KIND_CHARS], reason[:MAX_REASON_CHARS])
    assert failure_of({"_ng_failure_class": long}) == Failure(long[:MAX_KIND_CHARS], None)
    episode = {"failure": {"failure_kind": long, "failure_reason": reason, "stage": long}}
    assert failure_of(episode) == Failure(
        long[:MAX_KIND_CHARS], reason[:MAX_REASON_CHARS], long[:MAX_KIND_CHARS]
    )


class _SlottedMapping(Mapping[str, Any]):
    """A read-only mapping without an instance ``__dict__``."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class _Plain:
    """A plain object (no pydantic): its fields are its ``__dict__``."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def test_other_mappings_and_plain_objects_are_read_too() -> None:
    assert failure_of(_SlottedMapping({"mask_sample": True, "failure_kind": "k"})) == Failure(
        "k", None
    )
    assert failure_of(_Plain(mask_sample=True)) == Failure("_OTHER", None)
    # a field wins over a model's extras; extras are read only when the field is absent
    both = _Plain(_ng_failure_class="field", __pydantic_extra__={})
    assert failure_of(both) == Failure("field", None)


def test_an_episodes_result_is_read_one_level_deep_extras_included() -> None:
    judge = VerifyResponse.model_validate({"reward": 0.0, "_ng_failure_class": "judge_failed"})
    assert failure_of({"episode_id": {}, "result": judge}) == Failure("judge_failed", None)
    # a row inside the result's own result is not Gym's shape: not read
    deeper = {"result": {"result": {"mask_sample": True, "failure_kind": "k"}}}
    assert failure_of(deeper) is None


def test_failsafe_row_is_a_failed_verification(spans: Spans) -> None:
    span_groups.set_enabled({"verify"})

    async def verify() -> JSONResponse:
        return _failsafe_row()

    async def wrong() -> VerifyResponse:
        return VerifyResponse(reward=0.0)

    returned = asyncio.run(traced_verify_endpoint(verify)())
    assert returned.status_code == 200  # the handler's answer is untouched
    asyncio.run(traced_verify_endpoint(wrong)())
    failed, ok = spans.named("gym.verify")
    assert failed.attributes["succeeded"] is False  # type: ignore[index]
    assert failed.attributes["error.type"] == "judge_failed"  # type: ignore[index]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "judge_failed: JudgeError: 500"
    assert ok.attributes["succeeded"] is True  # type: ignore[index]
    # the reward is read from the returned object only: the failsafe's raw row (bytes)
    # gives none (its body is not parsed again); the wrong answer's 0.0 is recorded
    assert ok.attributes["nemo.gym.reward"] == 0.0  # type: ignore[index]
    assert "nemo.gym.reward" not in (failed.attributes or {})


def test_rollout_returning_a_failure_fails_its_span(spans: Spans) -> None:
    span_groups.set_enabled({"rollout"})

    async def relay() -> Response:
        return Response(b"boom", status_code=500)

    def episode() -> EpisodeResponse:
        failure = EpisodeFailure(failure_reason="seed failed", terminal=False, stage="seed")
        return EpisodeResponse(episode_id={}, failure=failure)

    assert asyncio.run(traced_rollout_endpoint(relay)()).status_code == 500
    assert traced_rollout_endpoint(episode)().failure is not None
    relayed, failed = spans.named("gym.rollout")
    assert relayed.status.status_code is StatusCode.ERROR
    assert relayed.attributes["error.type"] == "500"  # type: ignore[index]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "environment_server_failed"  # type: ignore[index]
    assert failed.attributes["nemo.gym.failure.stage"] == "seed"  # type: ignore[index]


def test_env_step_span_is_in_the_verify_group(spans: Spans) -> None:
    span_groups.set_enabled({"verify"})

    async def step() -> dict[str, Any]:
        return {"observation": None, "reward": -1.0, "terminated": True}

    asyncio.run(traced_env_step_endpoint(step, {"nemo.gym.server.name": "blackjack"})())
    span = spans.one("gym.env.step")
    assert span.instrumentation_scope.name == "gym_telemetry.verify"  # type: ignore[union-attr]
    assert span.attributes["succeeded"] is True  # type: ignore[index]
    assert span.attributes["nemo.gym.reward"] == -1.0  # type: ignore[index]
    assert span.attributes["nemo.gym.server.name"] == "blackjack"  # type: ignore[index]
    span_groups.set_enabled(set())
    asyncio.run(traced_env_step_endpoint(step)())
    assert len(spans.named("gym.env.step")) == 1


def test_nested_rollout_is_marked_and_the_outer_is_not(spans: Spans) -> None:
    span_groups.set_enabled({"rollout"})

    async def inner() -> str:
        return "inner"

    wrapped_inner = traced_rollout_endpoint(inner)

    async def outer() -> str:
        return await wrapped_inner()

    asyncio.run(traced_rollout_endpoint(outer)())
    asyncio.run(wrapped_inner())  # after the outer one ended: outermost again
    first_inner, outer_span, second_inner = sorted(
        spans.named("gym.rollout"), key=lambda s: s.end_time or 0
    )
    assert first_inner.attributes["nemo.gym.rollout.nested"] is True  # type: ignore[index]
    assert "nemo.gym.rollout.nested" not in (outer_span.attributes or {})
    assert "nemo.gym.rollout.nested" not in (second_inner.attributes or {})


# --- the per-type reading plans against the general reading --------------------------------


def _general(result: Any) -> Failure | None:
    """``failure_of`` without its per-type plans and its no-marker shortcut: the rules of
    the module doc applied to every result the long way."""
    if result is None or isinstance(result, outcomes._SCALARS):
        return None
    view = outcomes._view(result)
    if view is None:
        return None
    if view is not result:
        status = view.get("status_code")
        if type(status) is int:
            if status >= 500:
                return Failure(str(status), None)
            return outcomes._from_response(view.get("body"))
    return outcomes._from_view(result, view)


class GymVerifyResponse(BaseModel):
    """Like Gym 0.7.0's ``BaseVerifyResponse``: no extra fields kept (the default)."""

    reward: float
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None


class ForbidExtras(GymVerifyResponse):
    model_config = ConfigDict(extra="forbid")


class AllowsExtras(GymVerifyResponse):
    model_config = ConfigDict(extra="allow")


class Episode(BaseModel):
    episode_id: dict[str, Any] = {}
    result: Any = None
    failure: EpisodeFailure | None = None


class Relayed(BaseModel):
    """A model shaped like a response: ``status_code`` and ``body`` fields."""

    status_code: int
    body: bytes = b""


class Guarded(GymVerifyResponse):
    """A model whose attribute reads go through its own ``__getattribute__``."""

    def __getattribute__(self, name: str) -> Any:
        return super().__getattribute__(name)


_masked = {"mask_sample": True, "failure_kind": "judge_failed", "failure_reason": "r"}


@pytest.mark.parametrize(
    "result",
    [
        GymVerifyResponse(reward=1.0),
        GymVerifyResponse(reward=0.0, failure_kind="judge_unparseable"),
        GymVerifyResponse(reward=0.0, mask_sample=True),
        GymVerifyResponse(reward=0.0, mask_sample=True, failure_kind="k", failure_reason="why"),
        GymVerifyResponse.model_validate({"reward": 0.0, "_ng_failure_class": "ignored"}),
        ForbidExtras(reward=1.0),
        ForbidExtras(reward=0.0, mask_sample=True),
        AllowsExtras.model_validate({"reward": 0.0, "_ng_failure_class": "judge_failed"}),
        AllowsExtras.model_validate({"reward": 0.0, "failure": {"failure_kind": "x"}}),
        AllowsExtras(reward=1.0),
        Guarded(reward=0.0, mask_sample=True),
        Guarded(reward=1.0),
        Episode(),
        Episode(result=GymVerifyResponse(reward=0.0, mask_sample=True, failure_kind="k")),
        Episode(result=GymVerifyResponse(reward=1.0)),
        Episode(result=_masked),
        Episode(result="text"),
        Episode(result=3),
        Episode(failure=EpisodeFailure(failure_reason="boom", terminal=True, stage="seed")),
        Relayed(status_code=502),
        Relayed(status_code=200, body=b'{"mask_sample":true,"failure_kind":"k"}'),
        Relayed(status_code=200, body=b"{}"),
        {"reward": 1.0},
        {"reward": 1.0, "mask_sample": False, "failure_kind": "k"},
        _masked,
        {"_ng_failure_class": "judge_failed"},
        {"_ng_failure_class": ""},
        {"failure": None, "result": None},
        {"failure": "a string, not a failure object", "mask_sample": True},
        {"failure": "a string, not a failure object"},
        {"result": _masked},
        {"result": [_masked]},
        {"result": {"result": _masked}},
        _Plain(mask_sample=True),
        _Plain(reward=1.0),
        _Plain(_ng_failure_class="field", __pydantic_extra__={}),
        _Plain(__pydantic_extra__={"_ng_failure_class": "extra"}),
        _SlottedMapping({"mask_sample": True, "failure_kind": "k"}),
        _SlottedMapping({"reward": 1.0}),
        _failsafe_row(),
        JSONResponse({"reward": 1.0}),
        Response(b"upstream broke", status_code=503),
        None,
        True,
        1.5,
        "text",
        b"bytes",
        [_masked],
        (_masked,),
        object(),
    ],
    ids=lambda r: type(r).__name__,
)
def test_failure_of_reads_every_type_as_the_general_rules_do(result: Any) -> None:
    for _ in range(2):  # the type's plan made, then remembered
        assert failure_of(result) == _general(result)


def test_a_models_plan_follows_its_fields_not_its_values() -> None:
    """Instances of one class read with the plan made for the first one."""
    assert failure_of(GymVerifyResponse(reward=1.0)) is None
    masked = GymVerifyResponse(reward=0.0, mask_sample=True, failure_kind="k")
    assert failure_of(masked) == Failure("k", None)
    assert failure_of(Episode()) is None
    nested = Episode(result=GymVerifyResponse(reward=0.0, mask_sample=True))
    assert failure_of(nested) == Failure("_OTHER", None)


def test_the_plans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outcomes, "MAX_TYPES", 5)
    for i in range(20):
        cls = type(f"Model{i}", (GymVerifyResponse,), {})
        assert failure_of(cls(reward=0.0, mask_sample=True)) == Failure("_OTHER", None)
    assert len(outcomes._plans) <= 5
