"""Session-wide: SIGTERM and SIGHUP interrupt the test run as Ctrl-C does.

Python dies where it stands on SIGTERM (``timeout``, a CI runner cancelling a job) and
SIGHUP (a closed terminal), so pytest's fixture teardown would not run and the servers
the tests started (sidecars, sinks, collectors, Gym servers, dockerd) would be left
running. Raising KeyboardInterrupt instead lets pytest stop the session and tear down
every active fixture, exactly as after Ctrl-C (pytest exits 2). Children started through
``gym_telemetry_demo.procs.spawn`` also die with pytest on Linux if it is SIGKILLed.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest

_INTERRUPTING = (signal.SIGTERM, signal.SIGHUP)


def _interrupt(signo: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signo).name)


def pytest_configure(config: pytest.Config) -> None:
    for sig in _INTERRUPTING:
        signal.signal(sig, _interrupt)
