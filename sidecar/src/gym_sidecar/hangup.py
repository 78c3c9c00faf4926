"""Telling a closed terminal's SIGHUP from an operator's ``kill -HUP``.

``gym-sidecar run`` reloads its span-group config on SIGHUP, as daemons do (nginx,
Prometheus, HAProxy): an operator sends it to a process with no terminal. The same
signal is what a process run in a terminal gets when that terminal closes (the kernel
sends it to the session leader, and a shell passes it on to its jobs); there, reloading
and serving on would leave a sidecar running with no terminal and nobody to stop it.

By the time that SIGHUP is handled, the kernel has already detached the terminal from
every process of the session, so ``/dev/tty`` can no longer be opened: that tells the two
apart. :class:`TerminalHangup` records at startup whether the process had a controlling
terminal and whether SIGHUP was ignored (``nohup``: the user asked to survive the
terminal); :meth:`TerminalHangup.hung_up` then says whether a SIGHUP means "the terminal
is gone, stop" rather than "reload". Linux and the BSDs behave alike here; where
``/dev/tty`` does not exist, nothing is ever a hangup (SIGHUP reloads).
"""

from __future__ import annotations

import os
import signal

_TTY = "/dev/tty"


def has_controlling_terminal() -> bool:
    """Whether this process has a controlling terminal that is still there."""
    try:
        fd = os.open(_TTY, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:  # ENXIO: none, or hung up; ENOENT: no /dev/tty on this system
        return False
    os.close(fd)
    return True


class TerminalHangup:
    """Built before the SIGHUP handler is installed (it reads the inherited disposition)."""

    def __init__(self) -> None:
        self.had_terminal = has_controlling_terminal()
        self.nohup = signal.getsignal(signal.SIGHUP) == signal.SIG_IGN

    def hung_up(self) -> bool:
        """Whether a SIGHUP received now comes from the controlling terminal going away:
        there was one at startup, it is gone, and SIGHUP was not ignored (``nohup``)."""
        return self.had_terminal and not self.nohup and not has_controlling_terminal()
