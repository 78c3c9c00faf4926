"""issue 41: the live events' configuration (``GYM_TELEMETRY_LIVE_INTERVAL_S``,
``GYM_TELEMETRY_LAG_PROBE_INTERVAL_S``): defaults, off, bad values."""

from __future__ import annotations

import logging

import pytest
from gym_telemetry import _live


def test_defaults() -> None:
    assert _live.interval_s({}) == 2.0
    assert _live.lag_probe_interval_s({}) == 0.5


@pytest.mark.parametrize(("raw", "expected"), [("0", 0.0), ("0.25", 0.25), (" 5 ", 5.0)])
def test_values(raw: str, expected: float) -> None:
    assert _live.interval_s({"GYM_TELEMETRY_LIVE_INTERVAL_S": raw}) == expected
    assert _live.lag_probe_interval_s({"GYM_TELEMETRY_LAG_PROBE_INTERVAL_S": raw}) == expected


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_value_is_the_default_logged(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gym_telemetry._live"):
        assert _live.interval_s({"GYM_TELEMETRY_LIVE_INTERVAL_S": raw}) == 2.0
    assert "GYM_TELEMETRY_LIVE_INTERVAL_S" in caplog.text


def test_disabled_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYM_TELEMETRY_LIVE_INTERVAL_S", "0")
    assert _live.start(resource=None, exporter=object()) is False
    assert _live.stop(1.0) is True  # nothing to stop


def test_an_exporter_of_no_known_kind_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYM_TELEMETRY_LIVE_INTERVAL_S", "1")
    assert _live.start(resource=None, exporter=object()) is False
