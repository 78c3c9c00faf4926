"""The event-loop lag probe: how late a server's asyncio loop runs its callbacks.

``LagProbe.start(loop)`` schedules a timer callback on the loop every ``interval_s``
(default 0.5 s, ``GYM_TELEMETRY_LAG_PROBE_INTERVAL_S``; ``0`` disables the probe). Each run
measures how much later than scheduled it ran (``loop.time()``, monotonic): that is what
every other callback and request waited on the busy loop, in ms. Samples are added to a
histogram over ``gym_telemetry_semconv.live.EVENT_LOOP_LAG_BOUNDS_MS`` (count, sum, max,
counts per bucket; bucket ``i`` holds ``(bounds[i-1], bounds[i]]``), which the heartbeat
takes and resets (``take``) from the reporter's thread.

Cost on the loop: one timer callback per interval (a subtraction, a ``bisect``, a lock
held for a few stores). One probe per process: the first loop it starts on (Gym runs one
server per process); ``stop`` cancels it. Never raises into the loop.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from typing import Any, Final, NamedTuple

from gym_telemetry_semconv import live

_log = logging.getLogger(__name__)

BOUNDS_MS: Final = live.EVENT_LOOP_LAG_BOUNDS_MS


class LagStats(NamedTuple):
    """Lag samples since the previous ``take``."""

    samples: int
    sum_ms: float
    max_ms: float
    bucket_counts: tuple[int, ...]


class LagProbe:
    """The probe (module doc). ``start`` and ``stop`` from the loop's thread; ``take``
    from any thread."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self._count = 0
        self._sum_ms = 0.0
        self._max_ms = 0.0
        self._buckets = [0] * (len(BOUNDS_MS) + 1)

    @property
    def running(self) -> bool:
        return self._loop is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Start measuring ``loop`` (from its own thread). False when already running or
        disabled."""
        if self._loop is not None or self.interval_s <= 0:
            return False
        self._loop = loop
        self._schedule(loop)
        return True

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        expected = loop.time() + self.interval_s
        self._handle = loop.call_at(expected, self._tick, expected)

    def _tick(self, expected: float) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            self.add((loop.time() - expected) * 1000.0)
            self._schedule(loop)
        except Exception:  # the probe stops; the loop goes on
            _log.debug("gym_telemetry: event-loop lag probe failed", exc_info=True)
            self._loop = None

    def add(self, lag_ms: float) -> None:
        """Add one sample (ms; negative ones count as 0)."""
        lag_ms = max(0.0, lag_ms)
        index = bisect.bisect_left(BOUNDS_MS, lag_ms)
        with self._lock:
            self._count += 1
            self._sum_ms += lag_ms
            self._max_ms = max(self._max_ms, lag_ms)
            self._buckets[index] += 1

    def take(self) -> LagStats:
        """The samples since the previous ``take``, and a fresh start."""
        with self._lock:
            stats = LagStats(self._count, self._sum_ms, self._max_ms, tuple(self._buckets))
            self._reset()
        return stats

    def stop(self) -> None:
        """Stop scheduling, from any thread: the pending callback finds the probe stopped
        (and is cancelled right away when this runs on the loop's own thread)."""
        handle, loop = self._handle, self._loop
        self._handle = self._loop = None
        if handle is None or loop is None:
            return
        try:
            if asyncio.get_running_loop() is loop:
                handle.cancel()
        except RuntimeError:  # not on a loop's thread: the callback stops itself
            pass


def attributes(stats: LagStats) -> dict[str, Any]:
    """The heartbeat's lag attributes (``live.LAG_*``) of ``stats``."""
    return {
        live.LAG_COUNT: stats.samples,
        live.LAG_SUM: float(stats.sum_ms),
        live.LAG_MAX: float(stats.max_ms),
        live.LAG_BUCKET_COUNTS: stats.bucket_counts,
    }


__all__ = ["BOUNDS_MS", "LagProbe", "LagStats", "attributes"]
