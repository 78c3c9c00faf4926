"""The one rate-limited logging filter both programs share (``gym_telemetry_semconv.ratelimit``).

Where each program uses it is tested beside that code (``tests/agent/test_logging.py``,
the sidecar's export, webhook, metrics and enrich tests)."""

from __future__ import annotations

import logging

import pytest
from gym_telemetry_semconv import ratelimit
from gym_telemetry_semconv.ratelimit import RateLimitFilter, rate_limit

from tests.support.ratelimit import Clock


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
    monkeypatch.setattr(ratelimit, "MAX_STREAMS", 4)
    f = RateLimitFilter(clock=Clock())
    for i in range(10):
        assert f.filter(_record("a", f"message {i}"))
    assert len(f._last) <= 4
    assert f.filter(_record("a", "message 0"))  # forgotten, so it passes again


def test_rate_limit_installs_one_filter(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.semconv.test_ratelimit.once")
    assert rate_limit(logger, 10.0) is logger
    assert rate_limit(logger.name) is logger
    assert sum(isinstance(f, RateLimitFilter) for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=logger.name):
        for _ in range(5):
            logger.warning("sidecar down: %s", "UNAVAILABLE")
    assert [r.getMessage() for r in caplog.records] == ["sidecar down: UNAVAILABLE"]
    (limiter,) = [f for f in logger.filters if isinstance(f, RateLimitFilter)]
    assert limiter.interval_s == 10.0  # the first call's interval is kept
