"""``make demo`` end to end: scripts/demo.sh with a small rollout count.

Runs exactly what README command 1 runs (bootstrap, the cached Gym environment with this
tree's agent, a sidecar with the local store, five real Gym servers, rollouts, the
report, a clean stop) and checks what it printed, then reads the same store again with
``gym-sidecar rollouts --failed``. Needs the cached Gym env (built on first use).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.demo import demo_env, run_demo

pytestmark = [pytest.mark.gym, pytest.mark.timeout(2400)]

ROLLOUTS = 12
FAILING = 2


def _rows(text: str, title: str) -> list[list[str]]:
    """The cells of the table printed under ``title``; a row that rich wrapped over
    several lines (the first cell empty on the lines after its first) is one row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if line.startswith("│"):
            cells = [cell.strip() for cell in line.strip("│").split("│")]
            if rows and not cells[0]:
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
            else:
                rows.append(cells)
    return rows


def test_make_demo_prints_rollouts_a_failed_verification_a_waterfall_and_stats(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "store"
    env = demo_env()
    # the default demo needs no Go (only `--jaeger` builds Jaeger): any `go` it ran would
    # be this one, which fails
    no_go = tmp_path / "no-go"
    no_go.mkdir()
    (no_go / "go").write_text("#!/bin/sh\necho 'make demo must not need Go' >&2\nexit 97\n")
    (no_go / "go").chmod(0o755)
    env["PATH"] = f"{no_go}{os.pathsep}{env.get('PATH', '')}"
    env.pop("GO", None)
    result = run_demo(
        rollouts=ROLLOUTS,
        failing=FAILING,
        concurrency=4,
        store_dir=store_dir,
        workdir=tmp_path / "work",
        env=env,
        timeout_s=2300,
    )
    out = result.stdout
    assert result.returncode == 0, out[-6000:] + result.stderr[-4000:]
    assert f"ok 200: {ROLLOUTS - FAILING}" in out  # every ok rollout answered 200
    assert f"failing 500: {FAILING}" in out

    recent = _rows(out, "Recent rollouts")
    assert len(recent) == min(ROLLOUTS, 12)
    assert all(row[4] in ("ok", "failed") for row in recent)
    assert all("policy_model" in row[9] for row in recent)  # one trace crosses 3 servers
    # reward, turns, tokens: the stub model's usage, two model calls per rollout
    assert {tuple(row[5:8]) for row in recent if row[4] == "ok"} == {("1", "2", "34/13")}

    failed = _rows(out, "Failed rollouts")
    assert len(failed) == FAILING
    assert all(row[4] == "failed" and "failing_weather" in row[9] for row in failed)
    assert {tuple(row[5:8]) for row in failed} == {("-", "2", "-")}  # /run raised

    envs = {row[0]: row for row in _rows(out, "Environments")}
    ok_env = envs["example_single_tool_call_simple_agent"]
    assert ok_env[1:5] == [str(ROLLOUTS - FAILING), "0", "100.0%", "1"]  # n, fail, ok %, reward
    assert ok_env[8:12] == ["2", "2", "2", "34"]  # turns mean, p50, p90; tokens in
    failing_env = envs["failing_weather_simple_agent"]
    assert failing_env[1:5] == [str(FAILING), str(FAILING), "0.0%", "-"]
    model_calls = _rows(out, "Model calls")
    assert [row[2] for row in model_calls] == [str(2 * ROLLOUTS)]  # every call, counted once

    waterfall = out.split("gym-sidecar trace ", 1)[1]
    for name in ("POST /run", "gym.rollout", "POST /seed_session", "gym.verify"):
        assert name in waterfall
    assert "⇢ policy_model" in waterfall

    stats = out.split("gym-sidecar stats", 1)[1]
    ok = ROLLOUTS - FAILING
    assert stats.count(f"({ok}/{ROLLOUTS})") == 2  # spans and gym.verify.count agree
    # how to see the same in Jaeger, then a clean stop: the sidecar exited 0 and every
    # Gym server finished gracefully on SIGTERM (not killed after the stop timeout)
    hint = " ".join(out.split())
    assert "docker compose up" in hint and "http://localhost:16686" in hint
    # it ends by printing the web view's URL (and a failed rollout's page there)
    assert re.search(r"^  http://127\.0\.0\.1:\d+/$", out.split("Web view", 1)[1], re.M)
    assert re.search(r"^  http://127\.0\.0\.1:\d+/trace/[0-9a-f]{32}$", out, re.M)
    assert re.search(r"^  http://127\.0\.0\.1:\d+/envs$", out, re.M)
    assert re.search(r"^  http://127\.0\.0\.1:\d+/live$", out, re.M)
    assert "stopped cleanly" in out
    gym_logs = sorted((tmp_path / "work" / "gym").glob("*.log"))
    assert len(gym_logs) == 5
    for log in gym_logs:
        assert "Finished server process" in log.read_text(), log.name

    # the store outlives the demo: the CLI reads the same rollouts back
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "gym_sidecar.cli",
            "rollouts",
            "--failed",
            "--store-dir",
            str(store_dir),
        ],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=60,
        check=False,
    )
    assert again.returncode == 0
    assert sorted(r[0] for r in _rows(again.stdout, "Recent rollouts")) == sorted(
        r[0] for r in failed
    )
