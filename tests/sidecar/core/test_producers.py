"""``core.producers``: who produced a span, its group and its kind, from scope and name."""

from __future__ import annotations

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core import producers
from gym_sidecar.core.producers import Kind, Producer, scope_role, span_role
from gym_telemetry_semconv import gym_dialect

LENS = gym_dialect.SCOPE_LENS_HELPERS


@pytest.mark.parametrize("group", semconv.ALL_GROUPS)
def test_the_agents_scopes_name_their_group(group: str) -> None:
    role = scope_role(semconv.scope_name(group))
    assert (role.producer, role.group, role.by_name) == (Producer.AGENT, group, False)


@pytest.mark.parametrize(
    ("scope", "name", "kind"),
    [
        (semconv.scope_name(semconv.GROUP_ROLLOUT), semconv.SPAN_ROLLOUT, Kind.ROLLOUT),
        (semconv.scope_name(semconv.GROUP_VERIFY), semconv.SPAN_VERIFY, Kind.VERIFY),
        (semconv.scope_name(semconv.GROUP_VERIFY), semconv.SPAN_ENV_STEP, Kind.ENV_STEP),
        (semconv.scope_name(semconv.GROUP_SERVER), "POST /run", Kind.SERVER),
        (semconv.scope_name(semconv.GROUP_SERVER), "tools/call get_weather", Kind.SERVER),
        (semconv.scope_name(semconv.GROUP_MODEL_CALL), semconv.SPAN_MODEL_CHAT, Kind.MODEL_CALL),
        (semconv.scope_name(semconv.GROUP_SANDBOX), "gym.sandbox.exec", Kind.SANDBOX),
        # a name of another group's kind in an agent scope: the scope decides
        (semconv.scope_name(semconv.GROUP_ROLLOUT), semconv.SPAN_VERIFY, Kind.OTHER),
    ],
)
def test_the_agents_span_kinds(scope: str, name: str, kind: Kind) -> None:
    role = span_role(scope, name)
    assert role.kind is kind and role.producer is Producer.AGENT
    assert role.group == semconv.group_of_scope(scope)


@pytest.mark.parametrize(
    ("name", "group", "kind"),
    [
        (semconv.SPAN_ROLLOUT, semconv.GROUP_ROLLOUT, Kind.ROLLOUT),
        (semconv.SPAN_VERIFY, semconv.GROUP_VERIFY, Kind.VERIFY),
        (semconv.SPAN_AGENT_RESPONSES, semconv.GROUP_AGENT, Kind.AGENT_RESPONSES),
        (semconv.SPAN_MODEL_RESPONSES, semconv.GROUP_MODEL_CALL, Kind.MODEL_CALL),
        (semconv.SPAN_MODEL_CHAT, semconv.GROUP_MODEL_CALL, Kind.MODEL_CALL),
        (semconv.SPAN_MODEL_MESSAGES, semconv.GROUP_MODEL_CALL, Kind.MODEL_CALL),
        (gym_dialect.SPAN_JOB, semconv.GROUP_JOB, Kind.JOB),
        ("gym.sandbox.start", semconv.GROUP_SANDBOX, Kind.SANDBOX),
        ("gym.sandbox.stop", semconv.GROUP_SANDBOX, Kind.SANDBOX),
        # NeMo-RL's or Megatron's spans share Lens's scope: not Gym's, in no group
        ("nemo_rl.train_step", None, Kind.OTHER),
        ("", None, Kind.OTHER),
    ],
)
def test_gym_own_spans_are_told_by_name(name: str, group: str | None, kind: Kind) -> None:
    role = span_role(LENS, name)
    assert (role.producer, role.group, role.kind) == (Producer.GYM, group, kind)


def test_gym_own_scopes() -> None:
    lens = scope_role(LENS)
    assert (lens.producer, lens.group, lens.by_name) == (Producer.GYM, None, True)
    client = scope_role(gym_dialect.SCOPE_GYM_CLIENT)
    assert (client.producer, client.group) == (Producer.GYM, semconv.GROUP_HTTP_CLIENT)
    assert span_role(gym_dialect.SCOPE_GYM_CLIENT, "HTTP POST").kind is Kind.HTTP_CLIENT
    assert frozenset({LENS}) == producers.SPLIT_SCOPES
    assert {
        semconv.scope_name(semconv.GROUP_ROLLOUT),
        semconv.scope_name(semconv.GROUP_VERIFY),
        LENS,
    } == producers.ROW_SCOPES


def test_everything_else_is_another_producer_in_no_group() -> None:
    for scope in ("fastapi", "opentelemetry.instrumentation.fastapi", "gym_telemetry.nope", ""):
        role = scope_role(scope)
        assert (role.producer, role.group, role.by_name) == (Producer.OTHER, None, False)
        assert span_role(scope, semconv.SPAN_ROLLOUT).kind is Kind.OTHER


def test_row_kinds_are_the_derived_ones() -> None:
    assert {Kind.ROLLOUT, Kind.VERIFY, Kind.ENV_STEP} == producers.ROW_KINDS


def test_answers_are_memoised_and_bounded() -> None:
    assert scope_role(LENS) is scope_role(LENS)
    assert span_role(LENS, semconv.SPAN_VERIFY) is span_role(LENS, semconv.SPAN_VERIFY)
    for i in range(2 * 1024):  # a client inventing scopes does not grow the cache past it
        scope_role(f"made.up.{i}")
    assert len(producers._ROLES) <= 1024
    role = scope_role(LENS)
    for i in range(1000):
        role.span(f"made-up-{i}")
    assert len(role._roles) <= 256
