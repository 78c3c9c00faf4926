"""Instrumented Gym servers keep serving rollouts when no sidecar is listening."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gym.stack import GymStack, load_configs, post_json, run_body
from tests.support.ports import free_port

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]


def test_rollouts_work_without_a_sidecar(gym_python: Path, tmp_path: Path) -> None:
    nothing_there = free_port()  # no process listens here
    env = {
        "GYM_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"127.0.0.1:{nothing_there}",
        "GYM_TELEMETRY_SPAN_GROUPS": "all",
        "GYM_TELEMETRY_SIDECAR_ADMIN_URL": f"http://127.0.0.1:{nothing_there}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    names = ["policy_model", "example_single_tool_call", "example_single_tool_call_simple_agent"]
    stack = GymStack(gym_python, load_configs("stack.yaml"), names, env, tmp_path)
    with stack:
        url = stack.url("example_single_tool_call_simple_agent") + "/run"
        for i in range(5):
            status, body = post_json(url, run_body(i, 0), timeout_s=30)
            assert status == 200, body
            assert body["reward"] == 1.0
    # the exporter did try (and fail) to reach the sidecar: telemetry was really on
    logs = "".join(p.log_path.read_text() for p in stack.processes.values())
    assert f"127.0.0.1:{nothing_there}" in logs
