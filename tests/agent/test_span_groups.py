"""Span groups: the spec parser, the enabled set, per-group tracers."""

from __future__ import annotations

import logging
import threading

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import span_groups

from tests.agent.conftest import Spans


def test_presets_and_groups_mix() -> None:
    groups, unknown = span_groups.parse_spec("default,sandbox")
    assert groups == {"job", "server", "http_client", "rollout", "sandbox"}
    assert unknown == []
    assert span_groups.parse_spec("per_rollout")[0] == semconv.PRESETS["per_rollout"]
    assert span_groups.parse_spec(" ALL ")[0] == frozenset(semconv.ALL_GROUPS)
    assert span_groups.parse_spec("verify rollout")[0] == {"verify", "rollout"}
    assert span_groups.parse_spec(["verify", "default"])[0] == semconv.PRESETS["default"] | {
        "verify"
    }


def test_empty_none_and_removal() -> None:
    assert span_groups.parse_spec("") == (frozenset(), [])
    assert span_groups.parse_spec("none") == (frozenset(), [])
    assert span_groups.parse_spec(None) == (frozenset(), [])
    assert span_groups.parse_spec("all,-sandbox,-default")[0] == {
        "verify",
        "agent",
        "model_call",
    }


def test_unknown_names_are_reported_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gym_telemetry.span_groups"):
        groups, unknown = span_groups.parse_spec("default,sandbx,,Verify,bogus_preset")
    assert groups == semconv.PRESETS["default"] | {"verify"}
    assert unknown == ["sandbx", "bogus_preset"]
    assert "sandbx" in caplog.text and "bogus_preset" in caplog.text


def test_set_enabled_swaps_a_frozenset_and_drops_unknown_groups() -> None:
    span_groups.set_enabled(["verify", "nope"])
    current = span_groups.enabled_groups()
    assert isinstance(current, frozenset)
    assert current == {"verify"}
    span_groups.set_enabled(set())
    assert current == {"verify"}  # the old set was replaced, not mutated
    assert span_groups.enabled_groups() == frozenset()
    assert not span_groups.is_enabled("verify")


def test_enabled_for_spec_logs_the_unknown_names_it_ignores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gym_telemetry.span_groups"):
        groups = span_groups.enabled_for_spec("default,sandbx")
    assert groups == span_groups.enabled_for_spec("default")
    assert "sandbx" in caplog.text and "ignored" in caplog.text


def test_set_enabled_logs_each_change_once_in_words(caplog: pytest.LogCaptureFixture) -> None:
    """Operators read these two lines when a fleet switch lands: the unknown names, and
    the new set (sorted, comma-joined, ``none`` when empty), only when it changed."""
    span_groups.set_enabled(set())
    with caplog.at_level(logging.INFO, logger="gym_telemetry.span_groups"):
        caplog.clear()
        span_groups.set_enabled(["verify", "rollout", "nope"])
        assert [r.getMessage() for r in caplog.records] == [
            "gym_telemetry: ignoring unknown span group(s) ['nope']",
            "gym_telemetry: span groups enabled: rollout,verify",
        ]
        caplog.clear()
        span_groups.set_enabled(["rollout", "verify"])  # the same set: nothing to say
        assert caplog.records == []
        span_groups.set_enabled([])
        assert [r.getMessage() for r in caplog.records] == [
            "gym_telemetry: span groups enabled: none"
        ]


def test_configure_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env_vars.GYM_TELEMETRY_SPAN_GROUPS, raising=False)
    # issue 15.1: with no configuration, verify spans are created (metrics mode) too;
    # issue 41: model-call spans too.
    assert span_groups.configure_from_env() == semconv.PRESETS["default"] | {
        "verify",
        "model_call",
    }
    monkeypatch.setenv(env_vars.GYM_TELEMETRY_SPAN_GROUPS, "per_rollout,sandbox")
    span_groups.configure_from_env()
    assert span_groups.enabled_groups() == semconv.PRESETS["per_rollout"] | {"sandbox"}
    assert (
        span_groups.configure_from_env({env_vars.GYM_TELEMETRY_SPAN_GROUPS: "none"}) == frozenset()
    )
    no_verify = {env_vars.GYM_TELEMETRY_SPAN_GROUPS: "default,-verify,-model_call"}
    assert span_groups.configure_from_env(no_verify) == semconv.PRESETS["default"]
    only_job = {env_vars.GYM_TELEMETRY_SPAN_GROUPS: "job"}
    assert span_groups.configure_from_env(only_job) == {
        "job",
        "rollout",
        "verify",
        "model_call",
        "http_client",
    }
    assert env_vars.GYM_TELEMETRY_SPAN_GROUPS == "GYM_TELEMETRY_SPAN_GROUPS"


def test_swaps_from_another_thread_are_seen_whole() -> None:
    a, b = frozenset({"verify"}), frozenset(semconv.ALL_GROUPS)
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            span_groups.set_enabled(a)
            span_groups.set_enabled(b)

    logging.getLogger("gym_telemetry.span_groups").setLevel(logging.WARNING)
    thread = threading.Thread(target=flip)
    thread.start()
    try:
        seen = {span_groups.enabled_groups() for _ in range(20000)}
    finally:
        stop.set()
        thread.join()
    assert seen <= {a, b}


def test_each_group_has_its_own_tracer_scope(spans: Spans) -> None:
    for group in semconv.ALL_GROUPS:
        tracer = span_groups.tracer_for(group)
        assert tracer is span_groups.tracer_for(group)
        tracer.start_span("probe-" + group).end()
    scopes = {s.name: s.instrumentation_scope.name for s in spans.all()}  # type: ignore[union-attr]
    assert scopes == {"probe-" + g: semconv.scope_name(g) for g in semconv.ALL_GROUPS}
