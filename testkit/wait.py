"""Polling until a condition holds: the one waiting helper of the test suites.

Timeouts are generous on purpose (the machines running these tests are shared and
loaded); a predicate that holds returns at once, so a long timeout only costs time when
a test is failing anyway.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable

DEFAULT_TIMEOUT_S = 30.0


class Waited:
    """What a wait saw: truthy when the predicate held, and on a timeout a ``repr`` that
    says which predicate, for how long, what it last returned and what ``describe()``
    reported then, so ``assert wait_for(...)`` fails with more than ``assert False``."""

    __slots__ = ("describe", "held", "last", "predicate", "seconds")

    def __init__(
        self,
        held: bool,
        predicate: Callable[[], object],
        last: object,
        seconds: float,
        describe: Callable[[], object] | None,
    ) -> None:
        self.held = held
        self.predicate = predicate
        self.last = last
        self.seconds = seconds
        self.describe = describe

    def __bool__(self) -> bool:
        return self.held

    def __repr__(self) -> str:
        if self.held:
            return f"<held after {self.seconds:.1f}s>"
        seen = ""
        if self.describe is not None:
            try:
                seen = f"; seen: {self.describe()}"
            except Exception as exc:  # a failing description must not hide the timeout
                seen = f"; describe() raised {exc!r}"
        return (
            f"<not held within {self.seconds:.1f}s: {_source(self.predicate)} "
            f"last returned {self.last!r}{seen}>"
        )


def _source(predicate: Callable[[], object]) -> str:
    try:
        text = inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)
    if "lambda" in text:  # the lambda itself, not the whole call around it
        text = text[text.index("lambda") :]
    return " ".join(text.split())[:200]


def wait_for(
    predicate: Callable[[], object],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.05,
    describe: Callable[[], object] | None = None,
) -> Waited:
    """Poll ``predicate`` from a plain thread until it is truthy or ``timeout_s`` passes;
    return whether it held (checked once more at the deadline) as a :class:`Waited`.
    ``describe`` (optional) tells what the test was waiting on, for the failure message."""
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if last := predicate():
            return Waited(True, predicate, last, time.monotonic() - started, describe)
        time.sleep(interval_s)
    last = predicate()
    return Waited(bool(last), predicate, last, time.monotonic() - started, describe)


async def wait_for_async(
    predicate: Callable[[], object],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.02,
    describe: Callable[[], object] | None = None,
) -> Waited:
    """Like :func:`wait_for`, sleeping on the running event loop between checks."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + timeout_s
    while loop.time() < deadline:
        if last := predicate():
            return Waited(True, predicate, last, loop.time() - started, describe)
        await asyncio.sleep(interval_s)
    last = predicate()
    return Waited(bool(last), predicate, last, loop.time() - started, describe)
