"""A throw-away venv for the declared-range tests (tests/agent/test_sdk_range.py):
``uv venv`` + ``uv pip install`` of the given packages (from the registry or uv's cache),
with the environment to run its python in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet


def floor(spec: SpecifierSet) -> str:
    """The ``>=`` bound of ``spec``."""
    (low,) = [s.version for s in spec if s.operator == ">="]
    return low


def find_uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")
    if found is None:
        cached = Path.home() / ".cache" / "gym-telemetry" / "uv" / "bin" / "uv"
        found = str(cached) if cached.exists() else None
    if found is None:
        pytest.fail("uv is needed to test the SDK range (scripts/bootstrap.sh installs it)")
    return found


def install_venv(
    venv: Path, packages: list[str], *, venv_timeout: float, install_timeout: float
) -> tuple[str, dict[str, str]]:
    """Create ``venv`` and install ``packages`` (paths and pins) into it; returns its
    python and the environment (``VIRTUAL_ENV`` set, no ``PYTHONPATH``) to run it in."""
    uv = find_uv()
    env = {**os.environ, "UV_LINK_MODE": "copy", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)

    def run(*cmd: str, timeout: float) -> None:
        done = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]

    run(uv, "venv", "--python", sys.executable, str(venv), timeout=venv_timeout)
    python = str(venv / "bin" / "python")
    run(uv, "pip", "install", "--python", python, *packages, timeout=install_timeout)
    return python, env
