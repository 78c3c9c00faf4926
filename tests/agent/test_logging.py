"""The one rate-limited logging filter (``gym_telemetry._logging``) and where it is used."""

from __future__ import annotations

import logging

import pytest
from gym_telemetry import _logging, endpoints
from gym_telemetry._export.processor import EXPORT_LOGGERS, rate_limit_export_logs
from gym_telemetry._logging import RateLimitFilter, rate_limit


class Clock:
    """A hand-driven clock: no sleeping, no dependence on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(name: str, msg: str = "Transient error %s") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, ("UNAVAILABLE",), None)


def test_one_record_per_logger_and_template_per_interval() -> None:
    clock = Clock()
    f = RateLimitFilter(interval_s=60.0, clock=clock)
    assert f.filter(_record("a"))
    assert not f.filter(_record("a"))
    assert not f.filter(_record("a"))
    assert f.filter(_record("b"))  # another logger is its own stream
    assert f.filter(_record("a", "Failed to export %s"))  # another template too
    clock.now += 59.9
    assert not f.filter(_record("a"))
    clock.now += 0.2
    rec = _record("a")
    assert f.filter(rec)
    assert rec.getMessage() == "Transient error UNAVAILABLE [3 similar messages suppressed]"
    rec = _record("b")
    clock.now += 60.0
    assert f.filter(rec)
    assert "suppressed" not in rec.getMessage()  # nothing was suppressed on "b"


def test_streams_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_logging, "MAX_STREAMS", 4)
    f = RateLimitFilter(clock=Clock())
    for i in range(10):
        assert f.filter(_record("a", f"message {i}"))
    assert len(f._last) <= 4
    assert f.filter(_record("a", "message 0"))  # forgotten, so it passes again


def test_rate_limit_installs_one_filter(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.agent.test_logging.once")
    rate_limit(logger)
    rate_limit(logger.name)
    assert sum(isinstance(f, RateLimitFilter) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for _ in range(5):
            logger.warning("sidecar down: %s", "UNAVAILABLE")
    assert [r.getMessage() for r in caplog.records] == ["sidecar down: UNAVAILABLE"]


def test_export_loggers_are_rate_limited() -> None:
    rate_limit_export_logs()
    rate_limit_export_logs()
    for name in EXPORT_LOGGERS:
        filters = logging.getLogger(name).filters
        assert sum(isinstance(f, RateLimitFilter) for f in filters) == 1


def test_endpoint_failures_are_counted_each_time_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (limiter,) = [f for f in endpoints._failure_log.filters if isinstance(f, RateLimitFilter)]
    clock = Clock()
    monkeypatch.setattr(limiter, "_clock", clock)
    monkeypatch.setattr(limiter, "_last", {})
    monkeypatch.setattr(limiter, "_suppressed", {})
    counter = endpoints._ErrorCounter()
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
