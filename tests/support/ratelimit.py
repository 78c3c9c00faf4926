"""Drive a logger's ``RateLimitFilter`` by hand: a fresh state and a clock the test moves.

The filters are process-wide (one per logger), so a test that counts log lines resets the
one it reads; the clock never sleeps, so no test depends on the machine's speed.
"""

from __future__ import annotations

import logging

import pytest
from gym_telemetry_semconv.ratelimit import RateLimitFilter


class Clock:
    """A hand-driven clock: no sleeping, no dependence on the machine's speed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hand_clock(logger_name: str, monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Give the rate-limit filter on ``logger_name`` an empty state and a hand clock
    (restored after the test); fails if the logger has no such filter."""
    logger = logging.getLogger(logger_name)
    (limiter,) = [f for f in logger.filters if isinstance(f, RateLimitFilter)]
    clock = Clock()
    monkeypatch.setattr(limiter, "_clock", clock)
    monkeypatch.setattr(limiter, "_last", {})
    monkeypatch.setattr(limiter, "_suppressed", {})
    return clock
