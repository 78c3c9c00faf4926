"""Fixtures of the gateway tier: the gateway Collector build, plus the backends' fixtures.

``gateway_bin`` builds the project's gateway distribution of the Collector from the Go
module proxy the first time on a machine (``scripts/otelcol_build.py``; minutes, the
steps and time taken are printed) and reuses it after.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.otelcol import gateway_binary
from tests.backends.conftest import gym_python, jaeger_bin, prometheus_bin

__all__ = ["gateway_bin", "gym_python", "jaeger_bin", "prometheus_bin"]


@pytest.fixture(scope="session")
def gateway_bin(pytestconfig: pytest.Config) -> Path:
    terminal = pytestconfig.pluginmanager.get_plugin("terminalreporter")

    def report(line: str) -> None:
        if terminal is not None and line.startswith("go_peers[") and "$ " not in line:
            terminal.write_line(line)

    try:
        return gateway_binary(report)
    except RuntimeError as exc:
        pytest.fail(str(exc))
