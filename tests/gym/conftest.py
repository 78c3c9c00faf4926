"""Fixtures of the real-Gym tier: the cached Gym environment with this tree's agent in it.

``gym_python`` builds (first time, a few minutes) or reuses the cached nemo-gym 0.7.0
environment (``scripts/gym_env.py``), then installs the agent from the current tree into
it as a real wheel, once per test session, and returns that environment's python.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Building the Gym environment from scratch takes minutes; later runs reuse it.
ENV_BUILD_TIMEOUT_S = 1800


@pytest.fixture(scope="session")
def gym_python() -> Path:
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gym_env.py"), "install-agent"],
        check=False,
        capture_output=True,
        text=True,
        timeout=ENV_BUILD_TIMEOUT_S,
    )
    if result.returncode != 0:
        pytest.fail(f"could not prepare the Gym environment:\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])
