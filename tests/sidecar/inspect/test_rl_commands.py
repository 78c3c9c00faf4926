"""The RL figures in the terminal (issue 41): ``gym-sidecar envs``, and reward, turns and
tokens in ``gym-sidecar rollouts`` and ``stats``, run as processes over a store written
the way the sidecar writes it (the web view tests' store: trace requests plus the derived
metrics the derive stage exported for them). Hostile names print as escaped text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gym_sidecar.store.config import DB_FILE_NAME

from tests.sidecar.webui.data import derived_metrics, gym_trace, request, write, write_points

S = 1_000_000_000
WEATHER = "nemo-gym/weather_agent"
MATH = "nemo-gym/math_agent"
HOSTILE = "nemo-gym/evil\x1b[2J[bold]agent"


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rl-inspect")
    start = time.time_ns() - 120 * S
    payloads = []
    for i, reward in enumerate((1.0, 0.0, 1.0)):
        tid, specs = gym_trace(
            f"w{i}",
            start + i * S,
            agent=WEATHER,
            reward=reward,
            turns=2,
            tokens=(34, 13),
            model_call=("policy-7b", 13, 5),
        )
        payloads.append(request(tid, specs))
    tid, specs = gym_trace("m0", start + 5 * S, agent=MATH, reward=0.25, turns=7, tokens=(900, 90))
    payloads.append(request(tid, specs))
    tid, specs = gym_trace("h0", start + 6 * S, agent=HOSTILE, reward=0.5, turns=1)
    payloads.append(request(tid, specs))
    path = directory / DB_FILE_NAME
    write(path, payloads)
    write_points(path, derived_metrics(payloads))
    return directory


def run(store_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    return subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", *args, "--store-dir", str(store_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def line_of(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert len(lines) == 1, (needle, text)
    return lines[0]


def cells(line: str) -> list[str]:
    """A table row's cells (rich's box drawing between them)."""
    return [c.strip() for c in line.strip().strip("│").split("│")]


def test_envs_prints_each_environment(store_dir: Path) -> None:
    done = run(store_dir, "envs")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    weather = cells(line_of(out, "weather_agent"))
    # n, fail, ok %, reward mean, p10, p50, p90, turns mean, p50, p90, tokens in, out
    assert weather[1:14] == [
        *("3", "0", "100.0%"),
        *("0.6667", "0", "1", "1"),
        *("2", "2", "2"),
        *("34", "13"),
        "98.0",
    ]
    assert weather[-1] == "weather"  # the resources server its rollouts reached
    math = cells(line_of(out, "math_agent"))
    assert math[1:5] == ["1", "0", "100.0%", "0.25"]
    assert math[11:13] == ["900", "90"]
    # the model calls and the verifiers' rewards, from the derived points
    model = cells(line_of(out, "policy-7b"))
    assert model[2:6] == ["3", "0", "39", "15"]  # calls, failed, tokens in, tokens out
    verifier = cells(line_of(out, "nemo-gym/weather "))
    assert verifier[1:3] == ["5", "0.55"]  # rewards 1, 0, 1, 0.25, 0.5: mean 0.55


def test_rollouts_show_reward_turns_and_tokens(store_dir: Path) -> None:
    done = run(store_dir, "rollouts")
    assert done.returncode == 0, done.stderr
    w1 = line_of(done.stdout, "w1 ")
    assert " 0 " in w1 and " 2 " in w1 and "34/13" in w1
    m0 = line_of(done.stdout, "m0 ")
    assert "0.25" in m0 and " 7 " in m0 and "900/90" in m0
    h0 = line_of(done.stdout, "h0 ")
    assert "evil\\x1b[2J[bold]agent" in h0  # the service, its control shown, not sent


def test_stats_adds_the_rollout_figures_and_model_calls(store_dir: Path) -> None:
    done = run(store_dir, "stats")
    assert done.returncode == 0, done.stderr
    fleet = cells(line_of(done.stdout, " all "))
    assert fleet[1:5] == ["5", "0", "100.0%", "0.55"]  # the reward mean of all five
    assert "policy-7b" in done.stdout


def test_hostile_names_are_escaped(store_dir: Path) -> None:
    for args in (("envs",), ("rollouts",), ("stats",)):
        out = run(store_dir, *args).stdout
        assert "\x1b" not in out, args
    assert "evil\\x1b[2J[bold]agent" in run(store_dir, "envs").stdout  # shown, no markup


def test_envs_on_an_empty_window(store_dir: Path) -> None:
    done = run(store_dir, "envs", "--since", "1s")
    assert done.returncode == 1
    assert "no rollouts in this window" in done.stdout
