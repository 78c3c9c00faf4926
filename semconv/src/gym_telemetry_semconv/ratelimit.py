"""Rate-limited logging: the one filter the agent and the sidecar use for lines that repeat.

A log line that fires per failed batch or per failed request (the sidecar or the backend
is down, a telemetry bug hits every call) must not flood the log. ``RateLimitFilter``
lets one record per (logger name, message template) through every ``interval_s``; the
next record of that stream that passes says how many were suppressed in between.
Records are keyed by their template (``record.msg``), not the formatted text, so
``"failed: %s"`` with different arguments is one stream.

``rate_limit(logger, interval_s)`` installs one filter on a logger, idempotently. A
logger's filters run only for records at an enabled level, so a filtered stream costs
nothing more than the logging call when its level is off. A filter applies to every
line of its logger: a module whose other lines must not be limited logs its repeating
ones on a child logger of its own (``logging.getLogger(__name__ + ".failures")``).

The filter drops lines, never counts: a call site whose failures matter counts them
itself (a self-metric, a counter in the message) before logging.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

DEFAULT_INTERVAL_S: Final = 60.0
MAX_STREAMS: Final = 256
"""Streams remembered per filter; past this the oldest is forgotten (templates are code
constants in practice, so the bound only guards against a logger fed arbitrary text)."""


class RateLimitFilter(logging.Filter):
    """One record per (logger, message template) per ``interval_s``. Thread-safe.

    A record that passes after others were suppressed gets ``[N similar messages
    suppressed]`` appended to its message. ``clock`` is ``time.monotonic`` unless a test
    injects another.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            if last is None and len(self._last) >= MAX_STREAMS:
                oldest = next(iter(self._last))
                del self._last[oldest]
                self._suppressed.pop(oldest, None)
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            record.msg = f"{record.msg} [{suppressed} similar messages suppressed]"
        return True


def rate_limit(
    logger: logging.Logger | str, interval_s: float = DEFAULT_INTERVAL_S
) -> logging.Logger:
    """Install one ``RateLimitFilter`` on ``logger`` (a logger or its name) and return the
    logger; a logger that already has one keeps it (and its interval)."""
    target = logging.getLogger(logger) if isinstance(logger, str) else logger
    if not any(isinstance(f, RateLimitFilter) for f in target.filters):
        target.addFilter(RateLimitFilter(interval_s))
    return target
