"""The ``rollouts`` section: defaults, the environment, the file, errors with their key
paths, and ``check-config`` printing it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from gym_sidecar.config import ConfigError, load_config
from gym_sidecar.live.config import DEFAULT_LOST_AFTER_S, DEFAULT_STALL_AFTER_S


def test_defaults() -> None:
    cfg = load_config(environ={}).rollouts
    assert cfg.enabled and not cfg.forward_events
    assert (cfg.stall_after_s, cfg.lost_after_s) == (DEFAULT_STALL_AFTER_S, DEFAULT_LOST_AFTER_S)
    assert (cfg.stall_after_s, cfg.lost_after_s) == (300.0, 30.0)
    assert (cfg.max_rollouts, cfg.max_instances, cfg.recent_lost) == (100_000, 10_000, 100)


def test_environment_over_file(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("rollouts: {stall_after_s: 60, lost_after_s: 20, forward_events: true}\n")
    cfg = load_config(
        path,
        environ={
            "GYM_SIDECAR_ROLLOUTS__STALL_AFTER_S": "7.5",
            "GYM_SIDECAR_ROLLOUTS__MAX_ROLLOUTS": "50",
        },
    ).rollouts
    assert (cfg.stall_after_s, cfg.lost_after_s, cfg.max_rollouts) == (7.5, 20.0, 50)
    assert cfg.forward_events


def test_every_bad_value_is_reported_with_its_key_path() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            environ={
                "GYM_SIDECAR_ROLLOUTS__STALL_AFTER_S": "0",
                "GYM_SIDECAR_ROLLOUTS__LOST_AFTER_S": "soon",
                "GYM_SIDECAR_ROLLOUTS__MAX_INSTANCES": "0",
                "GYM_SIDECAR_ROLLOUTS__RECENT_LOST": "100000",
                "GYM_SIDECAR_ROLLOUTS__STALL_AFTER": "5",
            }
        )
    text = str(err.value)
    for key in (
        "rollouts.stall_after_s",
        "rollouts.lost_after_s",
        "rollouts.max_instances",
        "rollouts.recent_lost",
        "rollouts.stall_after",
    ):
        assert key in text, (key, text)


def test_check_config_prints_the_section(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("rollouts: {stall_after_s: 45}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    env["GYM_SIDECAR_ROLLOUTS__LOST_AFTER_S"] = "12"
    result = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    section = yaml.safe_load(result.stdout)["rollouts"]
    assert (section["stall_after_s"], section["lost_after_s"]) == (45.0, 12.0)
