"""The RL view's Prometheus rules (``deploy/prometheus/rules/``), checked by the real
Prometheus: ``promtool check rules``, their unit tests with ``promtool test rules``
(``deploy/prometheus/tests/``), and the rules loaded by a running Prometheus (the compose
stack's config) evaluating a real sidecar's exposition: two stalled rollouts give
``gym:rollout_stalled:sum`` 2 and a pending ``GymRolloutsStalled`` for their server.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from gym_telemetry_demo.sidecar import SidecarProcess

from testkit.live_events import heartbeat, logs_request, resource, start
from testkit.otlp_samples import http_post
from testkit.wait import wait_for
from tests.support.prometheus import COMPOSE_CONFIG, PrometheusServer

pytestmark = [pytest.mark.backends, pytest.mark.timeout(900)]

RULES_DIR = COMPOSE_CONFIG.parent / "rules"
TESTS_DIR = COMPOSE_CONFIG.parent / "tests"
WAIT_S = 120.0


def promtool(prometheus_bin: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(prometheus_bin.with_name("promtool")), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_rules_pass_promtool_check(prometheus_bin: Path) -> None:
    files = sorted(str(p) for p in RULES_DIR.glob("*.yml"))
    assert files
    result = promtool(prometheus_bin, "check", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout + result.stderr


def test_the_rules_unit_tests_pass_promtool(prometheus_bin: Path) -> None:
    files = sorted(str(p) for p in TESTS_DIR.glob("*.yml"))
    assert files
    result = promtool(prometheus_bin, "test", "rules", *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_a_running_prometheus_evaluates_them_on_a_sidecar(
    prometheus_bin: Path, tmp_path: Path
) -> None:
    config = {"rollouts": {"stall_after_s": 0.5, "check_interval_s": 0.2, "lost_after_s": 900}}
    with SidecarProcess(config=config, log_dir=tmp_path) as sc:
        t0 = time.time_ns()
        events = [start(1, t0, rollout_id="a"), start(2, t0, rollout_id="b"), heartbeat(2)]
        body = logs_request(resource("simple_agent"), events).SerializeToString()
        assert http_post(sc.http_url, "logs", body).status_code == 200
        target = sc.admin_url.removeprefix("http://")
        with PrometheusServer(tmp_path / "prometheus", [target], prometheus_bin) as prom:
            groups = prom.api("rules")["groups"]
            assert {g["name"] for g in groups} == {"gym-rl.recording", "gym-rl.alerts"}
            assert {r["health"] for g in groups for r in g["rules"]} <= {"ok", "unknown"}

            def stalled() -> list[Any]:
                return prom.query("gym:rollout_stalled:sum")

            assert wait_for(
                lambda: (
                    [(s["metric"], s["value"][1]) for s in stalled()]
                    == [
                        (
                            {
                                "__name__": "gym:rollout_stalled:sum",
                                "nemo_gym_server_name": "simple_agent",
                            },
                            "2",
                        )
                    ]
                ),
                WAIT_S,
                1.0,
            ), stalled()

            def alerts() -> list[tuple[str, str, str]]:
                found = prom.api("alerts")["alerts"]
                return [
                    (
                        a["labels"]["alertname"],
                        a["labels"].get("nemo_gym_server_name", ""),
                        a["state"],
                    )
                    for a in found
                ]

            # pending at once; firing after its 2 minutes (a slow run may see that first)
            assert wait_for(
                lambda: (
                    {
                        ("GymRolloutsStalled", "simple_agent", "pending"),
                        ("GymRolloutsStalled", "simple_agent", "firing"),
                    }
                    & set(alerts())
                ),
                WAIT_S,
                1.0,
            ), alerts()
