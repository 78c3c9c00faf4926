"""Real NeMo Gym servers as processes: the launcher lives in the demo member.

:mod:`gym_telemetry_demo.gym_servers` starts Gym servers the way Gym's launcher does (it
moved there from this module so that ``make demo`` uses the same code as the real-Gym
tests). This module keeps the names the tests import.
"""

from __future__ import annotations

from pathlib import Path

from gym_telemetry_demo.gym_servers import (
    EXAMPLE_TASK,
    GymProcess,
    examples_dir,
    load_configs,
    post_json,
    repo_root,
    run_body,
    server_location,
    site_packages,
)
from gym_telemetry_demo.gym_servers import GymServers as GymStack

REPO = repo_root(Path(__file__).resolve().parents[2])
EXAMPLES = examples_dir(REPO)
CONFIGS = EXAMPLES / "configs"

__all__ = [
    "CONFIGS",
    "EXAMPLES",
    "EXAMPLE_TASK",
    "REPO",
    "GymProcess",
    "GymStack",
    "load_configs",
    "post_json",
    "run_body",
    "server_location",
    "site_packages",
]
