"""Session-wide: SIGTERM and SIGHUP interrupt the test run as Ctrl-C does.

Python dies where it stands on SIGTERM (``timeout``, a CI runner cancelling a job) and
SIGHUP (a closed terminal), so pytest's fixture teardown would not run and the servers
the tests started (sidecars, sinks, collectors, Gym servers, dockerd) would be left
running. Raising KeyboardInterrupt instead lets pytest stop the session and tear down
every active fixture, exactly as after Ctrl-C (pytest exits 2). Children started through
``gym_telemetry_demo.procs.spawn`` also die with pytest on Linux if it is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType

import pytest

_INTERRUPTING = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signo: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signo).name)


def pytest_configure(config: pytest.Config) -> None:
    for sig in _INTERRUPTING:
        signal.signal(sig, _interrupt)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``GYM_TEST_NATIVE=required`` (make test), the native scanner must still be in
    the environment when the session ends.

    Tests start sidecars as subprocesses of this environment's Python; were something in
    the run (a ``uv sync`` without ``--group native``, as the demo's bootstrap once did)
    to remove the module, every sidecar started after it would quietly run the
    pure-Python scanner while the run claims the native one. This turns that into a
    failed run.
    """
    if os.environ.get("GYM_TEST_NATIVE") != "required" or session.config.option.collectonly:
        return
    probe = subprocess.run(
        [sys.executable, "-c", "import gym_sidecar_native"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines()
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                "GYM_TEST_NATIVE=required, but gym_sidecar_native no longer imports at the "
                "end of the run (something removed it from the environment mid-session): "
                + (lines[-1] if lines else f"exit status {probe.returncode}"),
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
