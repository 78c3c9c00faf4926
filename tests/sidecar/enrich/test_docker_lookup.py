"""Docker lookup failures: every one counted, one warning per minute."""

from __future__ import annotations

import logging

import pytest
from gym_sidecar.enrich import docker_lookup
from gym_sidecar.enrich.config import DockerConfig
from gym_sidecar.enrich.docker_lookup import DockerLookup
from gym_sidecar.selfmetrics import SelfMetrics

from tests.support.ratelimit import hand_clock


def test_lookup_failures_are_counted_each_time_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = hand_clock(docker_lookup._failure_log.name, monkeypatch)
    lookup = DockerLookup(DockerConfig(), SelfMetrics())
    refused = ConnectionRefusedError("daemon down")
    with caplog.at_level(logging.WARNING, logger=docker_lookup.__name__):
        for i in range(5):
            lookup._warn(("ip", f"10.0.0.{i}"), refused)
        clock.now += 59.9
        lookup._warn(("ip", "10.0.0.5"), refused)
        clock.now += 0.2
        lookup._warn(("id", "c0ffee"), refused)
    assert lookup.errors == 7
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "Docker lookup of ip 10.0.0.0 failed (1 failures so far): daemon down"
    assert messages[1] == (
        "Docker lookup of id c0ffee failed (7 failures so far): daemon down"
        " [5 similar messages suppressed]"
    )
    assert len(messages) == 2
