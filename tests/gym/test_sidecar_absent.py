"""Instrumented Gym servers keep serving rollouts when no sidecar is listening."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testkit.gym_stack import GymStack, load_configs, post_json, run_body
from testkit.wait import wait_for
from tests.support.ports import free_port

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

RETRY_WINDOW_S = 4.0


def stack_logs(stack: GymStack) -> dict[str, str]:
    return {name: p.log_path.read_text() for name, p in stack.processes.items()}


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
        # The exporter did try (and fail) to reach the sidecar: telemetry was really on.
        # Waited for, not assumed to have happened within some time.
        assert wait_for(
            lambda: f"127.0.0.1:{nothing_there}" in "".join(stack_logs(stack).values()), 120
        ), stack_logs(stack)
        # Then time for the exporter's 1 s, 2 s backoff to retry at least twice more: a
        # flood of log lines would show (a slow machine only makes fewer retries).
        time.sleep(RETRY_WINDOW_S)
    logs = stack_logs(stack)
    # ... and its retries do not flood the Gym logs: one line per message per minute
    for name, text in logs.items():
        for message in ("Transient error", "Failed to export"):
            assert text.count(message) <= 1, (name, message, text[-3000:])
