"""A Gym server stopped with SIGTERM (as Kubernetes and ``docker stop`` stop it) exports
the spans it still holds.

uvicorn handles SIGTERM with a graceful shutdown and then re-raises the signal, so the
process dies by it and ``atexit`` hooks (the SDK's and the agent's flush) never run. The
batch processor's schedule delay is set to 60 s here, so nothing is exported on the
timer: every span that reaches the sink was flushed at the stop.
"""

from __future__ import annotations

from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest

from testkit.gym_stack import GymStack, load_configs, post_json, run_body
from testkit.sink import RecordingSink

pytestmark = [pytest.mark.gym, pytest.mark.timeout(600)]

NAMES = ["policy_model", "example_single_tool_call", "example_single_tool_call_simple_agent"]
ROLLOUTS = 3


@pytest.mark.parametrize("flush", [True, False], ids=["stop-flush", "stop-flush-off"])
def test_sigterm_flushes_the_last_spans(gym_python: Path, tmp_path: Path, flush: bool) -> None:
    with RecordingSink() as sink:
        env = {
            "GYM_TELEMETRY": "1",
            "GYM_TELEMETRY_STOP_FLUSH_TIMEOUT_S": "2" if flush else "0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "GYM_TELEMETRY_SPAN_GROUPS": "per_rollout",
            "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
        }
        stack = GymStack(gym_python, load_configs("stack.yaml"), NAMES, env, tmp_path)
        with stack:
            url = stack.url("example_single_tool_call_simple_agent") + "/run"
            for i in range(ROLLOUTS):
                status, body = post_json(url, run_body(i, 0))
                assert status == 200, body
            assert sink.span_count == 0  # nothing left on the timer
        # GymStack.stop sent SIGTERM and waited for every process to exit
        for process in stack.processes.values():
            assert process.proc is not None
            assert process.proc.returncode is not None
        names = [s.span.name for s in sink.spans()]
        if not flush:
            # switched off, the spans die with the process: the flush is what delivers them
            assert names == []
            return
        assert names.count(semconv.SPAN_ROLLOUT) == ROLLOUTS, names
        assert names.count(semconv.SPAN_VERIFY) == ROLLOUTS, names
        assert names.count("gym.model.responses") == 2 * ROLLOUTS, names
