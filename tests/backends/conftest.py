"""Fixtures of the real-backends tier: the cached Jaeger build and the Gym environment.

``jaeger_bin`` builds Jaeger v2 from the Go module proxy the first time on a machine
(``scripts/jaeger_build.py``; minutes, the time taken is printed) and reuses it after.
``prometheus_bin`` finds Debian's ``prometheus``, installing the package when absent (as
root, the way CI machines run). ``gym_python`` is the real-Gym tier's fixture.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gym.conftest import gym_python
from tests.support.jaeger import jaeger_binary
from tests.support.prometheus import prometheus_binary

__all__ = ["gym_python", "jaeger_bin", "prometheus_bin"]


@pytest.fixture(scope="session")
def jaeger_bin(pytestconfig: pytest.Config) -> Path:
    # the first build's steps and duration are shown even under output capture
    terminal = pytestconfig.pluginmanager.get_plugin("terminalreporter")

    def report(line: str) -> None:
        if terminal is not None and line.startswith("jaeger_build: ") and "$ " not in line:
            terminal.write_line(line)

    try:
        return jaeger_binary(report)
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    try:
        return prometheus_binary()
    except RuntimeError as exc:
        pytest.fail(str(exc))
