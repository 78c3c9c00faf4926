"""Polling until a condition holds: the one waiting helper of the test suites.

Timeouts are generous on purpose (the machines running these tests are shared and
loaded); a predicate that holds returns at once, so a long timeout only costs time when
a test is failing anyway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 30.0


def wait_for(
    predicate: Callable[[], object], timeout_s: float = DEFAULT_TIMEOUT_S, interval_s: float = 0.05
) -> bool:
    """Poll ``predicate`` from a plain thread until it is truthy or ``timeout_s`` passes;
    return whether it held (checked once more at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


async def wait_for_async(
    predicate: Callable[[], object], timeout_s: float = DEFAULT_TIMEOUT_S, interval_s: float = 0.02
) -> bool:
    """Like :func:`wait_for`, sleeping on the running event loop between checks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval_s)
    return bool(predicate())
