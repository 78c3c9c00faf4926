"""Docker lookup failures: every one counted, one warning per minute."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

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


def test_without_the_docker_extra_the_source_is_skipped_with_a_clear_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    socket_path = tmp_path / "docker.sock"
    socket_path.touch()  # the socket check passes; only the SDK is missing
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "docker" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    lookup = DockerLookup(DockerConfig(base_url=f"unix://{socket_path}"), SelfMetrics())
    with caplog.at_level(logging.WARNING, logger=docker_lookup.__name__):
        lookup.start()
    assert not lookup.enabled
    assert lookup._executor is None
    assert [r.getMessage() for r in caplog.records] == [
        "Docker enrichment skipped: the docker SDK is not installed "
        "(install gym-telemetry-sidecar[docker])"
    ]
