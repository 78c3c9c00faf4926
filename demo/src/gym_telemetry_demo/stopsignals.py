"""SIGINT, SIGTERM and SIGHUP stop a program the way Ctrl-C does: its ``finally`` blocks
run and every child it started is stopped.

Python turns only SIGINT into an exception (KeyboardInterrupt); SIGTERM (a process
manager, ``timeout``, ``kill``) and SIGHUP (a closed terminal) kill it where it stands,
so no cleanup runs and its children, each in a session of its own
(:mod:`gym_telemetry_demo.procs`), are left running without a parent.

:func:`stop_on_signals` (a context manager, main thread only) installs one handler for
the three. The first signal raises :class:`Stopped` -- a KeyboardInterrupt carrying the
signal number, so every ``except KeyboardInterrupt`` and ``finally`` on the way treats
it as a Ctrl-C -- in the main thread, wherever it is. Later signals are noted and raise
nothing: a second Ctrl-C, or a process manager's repeated SIGTERM, must not cut the stop
short (the children's grace periods bound it instead).

:func:`deferred` holds a signal back for the length of a block that must not be cut in
two (starting a child and keeping its ``Popen``; stopping the children): a signal that
arrives inside it raises :class:`Stopped` when the block ends, unless the block is
already leaving with an exception. Without :func:`stop_on_signals` it does nothing.

:func:`run_main` is the whole recipe for a program's entry point (the benchmarks use it).

:func:`exit_with` ends the program: a code ``128 + N`` for a stop signal ``N`` (what
:attr:`Stopped.exit_code` gives) is turned back into death by signal ``N``, the
convention for a program stopped by a signal (a shell then prints 130, 143, 129; a
calling shell script stops on Ctrl-C instead of carrying on).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Final, NoReturn

#: The signals that stop the program as Ctrl-C does.
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The program was told to stop by signal :attr:`signo` (SIGINT, SIGTERM, SIGHUP)."""

    def __init__(self, signo: int) -> None:
        super().__init__(signal.Signals(signo).name)
        self.signo = signo

    @property
    def exit_code(self) -> int:
        """128 + the signal number: the shell's status for a process it killed."""
        return 128 + self.signo


class _State:
    """The process-wide state of the handler (signal handlers are process-wide too)."""

    def __init__(self) -> None:
        self.installed = False
        self.received: int | None = None  # the first stop signal
        self.raised = False  # Stopped was raised for it
        self.defer_depth = 0

    def handle(self, signo: int, _frame: FrameType | None) -> None:
        if self.received is not None:
            return  # already stopping: see the module doc
        self.received = signo
        if self.defer_depth == 0:
            self.raised = True
            raise Stopped(signo)


_STATE = _State()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Install the handler for :data:`STOP_SIGNALS` for the length of the block, then
    put the previous handlers back. Main thread only (``signal.signal``'s rule)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("stop_on_signals() must run in the main thread")
    previous = {sig: signal.signal(sig, _STATE.handle) for sig in STOP_SIGNALS}
    _STATE.installed, _STATE.received, _STATE.raised = True, None, False
    try:
        yield
    finally:
        _STATE.defer_depth += 1  # a signal while restoring is noted (received()), not raised
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _STATE.installed = False
        _STATE.defer_depth -= 1


def received() -> int | None:
    """The first stop signal received by the last :func:`stop_on_signals` (also after
    its block), else None."""
    return _STATE.received


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold stop signals back for the block (see the module doc). Nests; main thread
    only when it matters (a handler runs only there); elsewhere it does nothing."""
    if not _STATE.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _STATE.defer_depth += 1
    leaving_normally = False
    try:
        yield
        leaving_normally = True
    finally:
        _STATE.defer_depth -= 1
        if (
            leaving_normally
            and _STATE.defer_depth == 0
            and _STATE.received is not None
            and not _STATE.raised
        ):
            _STATE.raised = True
            raise Stopped(_STATE.received)


def exit_with(code: int) -> NoReturn:
    """Exit with ``code``; a code ``128 + N`` for a stop signal ``N`` becomes death by
    ``N`` (after flushing stdout and stderr: a death by signal flushes nothing)."""
    signo = code - 128
    if signo in STOP_SIGNALS:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        signal.signal(signo, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signo])
        os.kill(os.getpid(), signo)
    sys.exit(code)


def run_main(main: Callable[[], int | None]) -> NoReturn:
    """``sys.exit(main())`` for a program that starts child processes: ``main`` runs with
    :func:`stop_on_signals`, so SIGTERM and SIGHUP unwind it as Ctrl-C does (its
    ``finally`` blocks and context managers stop its children); then :func:`exit_with`:
    after a stop signal, death by that signal."""
    with stop_on_signals():
        try:
            code = main() or 0
        except Stopped as stop:
            code = stop.exit_code
    signo = received()
    exit_with(code if signo is None else 128 + signo)
