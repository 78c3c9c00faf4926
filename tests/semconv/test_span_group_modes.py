"""The spec grammar and the default modes (gym_telemetry_semconv.span_groups)."""

from __future__ import annotations

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import Mode

ON, METRICS, OFF = Mode.ON, Mode.METRICS, Mode.OFF


def test_default_spec_forwards_the_default_preset_and_derives_verify_and_model_calls() -> None:
    modes = semconv.resolve_modes(semconv.DEFAULT_SPEC)
    assert modes == {
        "job": ON,
        "server": ON,
        "http_client": ON,
        "rollout": ON,
        "verify": METRICS,
        "agent": OFF,
        "model_call": METRICS,
        "sandbox": OFF,
    }
    assert semconv.enabled_groups(modes) == semconv.PRESETS["default"] | {"verify", "model_call"}
    assert semconv.forwarded_groups(modes) == semconv.PRESETS["default"]


def test_every_group_that_feeds_a_metric_is_derived_unless_turned_off() -> None:
    for spec in ("default", "job", "", "sandbox,agent", "per_rollout"):
        modes = semconv.resolve_modes(spec)
        for group in semconv.DERIVED_GROUPS:
            assert modes[group] in (ON, METRICS), (spec, group)


def test_selected_groups_are_forwarded() -> None:
    modes = semconv.resolve_modes("default,verify")
    assert modes["verify"] is ON and modes["rollout"] is ON


def test_removal_and_none_turn_groups_off() -> None:
    assert semconv.resolve_modes("default,-verify")["verify"] is OFF
    assert semconv.resolve_modes("all,-rollout")["rollout"] is OFF
    none = semconv.resolve_modes("none")
    assert set(none.values()) == {OFF}
    assert semconv.resolve_modes("none,verify")["verify"] is ON


def test_explicit_modes_win() -> None:
    modes = semconv.resolve_modes("default", {"verify": OFF, "server": METRICS})
    assert modes["verify"] is OFF and modes["server"] is METRICS
    assert semconv.resolve_modes("all", {"verify": METRICS})["verify"] is METRICS


def test_parse_spec_reports_unknown_names_and_is_case_insensitive() -> None:
    parsed = semconv.parse_spec("Default, verfy -SANDBOX")
    assert parsed.selected == semconv.PRESETS["default"]
    assert parsed.removed == {"sandbox"}
    assert parsed.unknown == ("verfy",)
    assert not parsed.none
