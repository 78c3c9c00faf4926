"""``scripts/demo.sh --hang`` end to end: after its rollouts, one rollout whose model call
hangs is reported stalled (by the sidecar's live view and ``gym_rollout_stalled``), then
lost once the demo killed its agent server, and the demo still ends cleanly. Needs the
cached Gym env (built on first use)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.demo import demo_env, run_demo

pytestmark = [pytest.mark.gym, pytest.mark.timeout(2400)]


def test_demo_hang_shows_a_stalled_rollout_then_lost(tmp_path: Path) -> None:
    result = run_demo(
        rollouts=4,
        failing=1,
        concurrency=2,
        store_dir=tmp_path / "store",
        workdir=tmp_path / "work",
        env=demo_env(),
        timeout_s=2300,
        extra_args=["--hang"],
    )
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-4000:]
    hang = out.split("--hang: one rollout whose model call hangs", 1)[1]
    stalled = re.search(
        r"rollout (\S+) stalled after ([0-9.]+) s \(stall_after_s=5\), waiting at "
        r"POST /v1/responses → policy_model",
        hang,
    )
    assert stalled, hang
    assert float(stalled.group(2)) >= 5.0  # never before stall_after_s
    assert re.search(r"^  http://127\.0\.0\.1:\d+/live$", hang, re.M)
    agent = "example_single_tool_call_simple_agent"
    assert f"gym_rollout_stalled{{nemo_gym_server_name='{agent}'}} = 1.0" in hang
    assert f"killed {agent} (SIGKILL)" in hang
    assert f"rollout {stalled.group(1)} lost (silent)" in hang
    assert f"gym_rollout_lost_total{{nemo_gym_server_name='{agent}'}} = 1.0" in hang
    assert "stopped cleanly" in out
