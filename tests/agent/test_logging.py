"""Where the agent uses the shared rate-limited filter (``gym_telemetry_semconv.ratelimit``)."""

from __future__ import annotations

import logging

import pytest
from gym_telemetry import _engine
from gym_telemetry._export.processor import EXPORT_LOGGERS, rate_limit_export_logs
from gym_telemetry_semconv.ratelimit import RateLimitFilter

from tests.support.ratelimit import hand_clock


def test_export_loggers_are_rate_limited() -> None:
    rate_limit_export_logs()
    rate_limit_export_logs()
    for name in EXPORT_LOGGERS:
        filters = logging.getLogger(name).filters
        assert sum(isinstance(f, RateLimitFilter) for f in filters) == 1


def test_endpoint_failures_are_counted_each_time_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = hand_clock(_engine._failure_log.name, monkeypatch)
    counter = _engine._ErrorCounter()
    with caplog.at_level(logging.WARNING, logger="gym_telemetry.endpoints"):
        for _ in range(5):
            counter.record("start", RuntimeError("tracer broke"))
        clock.now += 61.0
        counter.record("end", RuntimeError("tracer broke"))
    assert counter.count == 6
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert "telemetry failure in start" in messages[0]
    assert "telemetry failure in end" in messages[1]
    assert messages[1].endswith("[4 similar messages suppressed]")
