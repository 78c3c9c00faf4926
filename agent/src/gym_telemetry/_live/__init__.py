"""The live events (private): what is running now, told to the sidecar (issue 41).

- ``encoding``: the events as an OTLP ``ExportLogsServiceRequest``, written as bytes;
- ``lag``: the event-loop lag probe;
- ``reporter``: the daemon thread that sends the events every interval.

The names and the contract are in ``gym_telemetry_semconv.live``. This module holds the
process's one reporter and probe: ``start`` (from ``init_telemetry``), ``stop`` (from
``shutdown_telemetry``), ``start_lag_probe`` (on a server's running loop: the Gym
integration calls it from uvicorn's startup), ``stats``. Configuration, read by
``start``: ``GYM_TELEMETRY_LIVE_INTERVAL_S`` (default 2 s; ``0``: no live events) and
``GYM_TELEMETRY_LAG_PROBE_INTERVAL_S`` (default 0.5 s; ``0``: no probe); a bad value is
the default, logged. None of these raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
from collections.abc import Mapping
from typing import Any, Final

from gym_telemetry_semconv import live

from gym_telemetry import environment_variables as env_vars
from gym_telemetry._lean.log_transport import sender_for
from gym_telemetry._live.lag import LagProbe
from gym_telemetry._live.reporter import LiveReporter

_log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S: Final = live.DEFAULT_INTERVAL_S
DEFAULT_LAG_PROBE_INTERVAL_S: Final = live.DEFAULT_LAG_PROBE_INTERVAL_S


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        _log.warning("gym_telemetry: %s=%r is not a number; using %s", name, raw, default)
        return default
    if math.isnan(value) or value < 0:
        _log.warning("gym_telemetry: %s=%r is not >= 0; using %s", name, raw, default)
        return default
    return value


def interval_s(environ: Mapping[str, str] | None = None) -> float:
    """``GYM_TELEMETRY_LIVE_INTERVAL_S`` (module doc)."""
    env = os.environ if environ is None else environ
    return _seconds(env, env_vars.GYM_TELEMETRY_LIVE_INTERVAL_S, DEFAULT_INTERVAL_S)


def lag_probe_interval_s(environ: Mapping[str, str] | None = None) -> float:
    """``GYM_TELEMETRY_LAG_PROBE_INTERVAL_S`` (module doc)."""
    env = os.environ if environ is None else environ
    return _seconds(env, env_vars.GYM_TELEMETRY_LAG_PROBE_INTERVAL_S, DEFAULT_LAG_PROBE_INTERVAL_S)


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reporter: LiveReporter | None = None
        #: The latest reporter, running or stopped (its counters stay readable).
        self.last: LiveReporter | None = None
        self.probe: LagProbe | None = None


_STATE: Final = _State()


def start(resource: Any, exporter: Any) -> bool:
    """Start the reporter for a process whose spans ``exporter`` sends, with ``resource``
    (the spans'). False when disabled, already running, or the exporter is of a kind the
    events cannot follow (logged)."""
    try:
        with _STATE.lock:
            if _STATE.reporter is not None:
                return False
            every_s = interval_s()
            if every_s <= 0:
                return False
            send = sender_for(exporter)
            if send is None:
                _log.info("gym_telemetry: no live events: the span exporter is not OTLP")
                return False
            probe_s = lag_probe_interval_s()
            probe = _STATE.probe
            if probe is None and probe_s > 0:
                probe = _STATE.probe = LagProbe(probe_s)
            reporter = LiveReporter(resource, send, every_s, probe)
            reporter.start()
            _STATE.reporter = _STATE.last = reporter
        # started from inside a running loop: measure that one (none running here: the
        # server's startup starts the probe)
        with contextlib.suppress(RuntimeError):
            start_lag_probe(asyncio.get_running_loop())
        return True
    except Exception as exc:  # boundary: telemetry setup goes on without live events
        _log.warning("gym_telemetry: live events not started: %r", exc)
        return False


def start_lag_probe(loop: asyncio.AbstractEventLoop) -> bool:
    """Measure ``loop``'s lag (call from that loop's thread). False when the probe is
    disabled, not configured yet, or already measuring a loop."""
    try:
        probe = _STATE.probe
        return probe is not None and probe.start(loop)
    except Exception as exc:  # the server runs without the probe
        _log.debug("gym_telemetry: lag probe not started: %r", exc)
        return False


def stop(timeout_s: float) -> bool:
    """Stop the reporter, sending ``gym.agent.stop`` within ``timeout_s``; True when it
    was delivered (or there was nothing to stop). Safe to call twice."""
    with _STATE.lock:
        reporter, _STATE.reporter = _STATE.reporter, None
    if reporter is None:
        return True
    try:
        return reporter.stop(timeout_s)
    except Exception as exc:  # boundary: shutdown goes on
        _log.warning("gym_telemetry: live events not stopped cleanly: %r", exc)
        return False


def stats() -> dict[str, int]:
    """The latest reporter's counters (zeros before any started)."""
    reporter = _STATE.last
    if reporter is None:
        return {"requests_sent": 0, "events_sent": 0, "requests_failed": 0, "encode_failures": 0}
    return reporter.stats.as_dict()


__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_LAG_PROBE_INTERVAL_S",
    "interval_s",
    "lag_probe_interval_s",
    "start",
    "start_lag_probe",
    "stats",
    "stop",
]
