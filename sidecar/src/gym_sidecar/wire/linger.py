"""Closing a server's connection so that its last answer reaches the client.

A connection the sidecar closes on its own (a GOAWAY after an HTTP/2 error or bound, a
400/408/431/503 on HTTP/1.1, an idle or draining connection) has usually been written
to last: the GOAWAY or the refusal says why. Closing the socket at once while the
client's data is still unread makes the kernel send a TCP reset instead of a FIN, and a
reset can overtake what was written: the client reads "connection reset by peer" and
cannot tell a limit from a crash (h2spec saw exactly that on 4.2/2, 4.2/3, 5.4.1/1 and
6.10/1 before). So a connection closes in three steps, as nginx's lingering close and
RFC 9113, 6.8 ask:

1. nothing more is read into the protocol (its owner discards what still arrives);
2. the write side is shut down once the buffered bytes are out (``write_eof``: a FIN
   after the last answer), while the read side keeps draining what the client sends;
3. the connection closes when the client closes its side, or after ``linger_s`` or
   :data:`LINGER_MAX_BYTES` drained at the latest (:class:`Lingering`; then it is
   aborted and ``limit_hits{close_linger_s}`` counts it: a client that keeps streaming
   after its refusal is cut off, as before).

A transport that cannot half-close (TLS) is closed at once. Loop-confined.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

LINGER_LIMIT = "close_linger_s"
"""The ``limits.`` key (and ``limit_hits`` label) of the linger bound."""
LINGER_MAX_BYTES = 4 * 1024 * 1024
"""What a lingering connection drains at most: what a client had in flight when it got
its answer (socket buffers; a header block or frame the refusal cut short, up to the
1 MiB SETTINGS_MAX_FRAME_SIZE the gRPC listener advertises)."""


class Lingering:
    """The connections of one listener that are closing after their last answer.

    :meth:`close` starts a connection's lingering close; its protocol must call
    :meth:`closed` from ``connection_lost`` and, while lingering, hand what
    ``data_received`` gets to :meth:`drained` (and nowhere else) and let
    ``eof_received`` return None (asyncio then closes the transport). ``on_expired`` is
    called (to count) for each connection still open ``linger_s`` after its close began,
    or past :data:`LINGER_MAX_BYTES` drained, which is then aborted.
    """

    def __init__(self, linger_s: float, on_expired: Callable[[], None]) -> None:
        self.linger_s = linger_s
        self._on_expired = on_expired
        self._open: dict[asyncio.Transport, asyncio.TimerHandle] = {}
        self._drained: dict[asyncio.Transport, int] = {}
        self._empty: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._open)

    def close(self, transport: asyncio.Transport) -> None:
        """Begin ``transport``'s lingering close (module doc). Idempotent."""
        if transport in self._open or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        with contextlib.suppress(OSError, RuntimeError):  # already broken: closed below
            transport.resume_reading()  # drain what the client still sends
        try:
            transport.write_eof()
        except (OSError, RuntimeError):
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        self._open[transport] = loop.call_later(self.linger_s, self._expire, transport)

    def drained(self, transport: asyncio.Transport | None, size: int) -> None:
        """``size`` bytes read and dropped on lingering ``transport``."""
        if transport is None or transport not in self._open:
            return
        total = self._drained.get(transport, 0) + size
        self._drained[transport] = total
        if total > LINGER_MAX_BYTES:
            self._expire(transport)

    def closed(self, transport: asyncio.Transport | None) -> None:
        """``transport`` is gone (its protocol's ``connection_lost``)."""
        if transport is None:
            return
        self._drained.pop(transport, None)
        timer = self._open.pop(transport, None)
        if timer is not None:
            timer.cancel()
        if not self._open and self._empty is not None:
            self._empty.set()

    def _expire(self, transport: asyncio.Transport) -> None:
        timer = self._open.pop(transport, None)
        self._drained.pop(transport, None)
        if timer is None:
            return
        timer.cancel()
        self._on_expired()
        transport.abort()
        if not self._open and self._empty is not None:
            self._empty.set()

    async def wait(self, timeout_s: float) -> None:
        """Until every lingering connection closed, ``timeout_s`` at most; then abort
        those left (a listener stopping)."""
        if self._open:
            self._empty = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._empty.wait(), timeout_s)
            self._empty = None
        for transport, timer in list(self._open.items()):
            timer.cancel()
            transport.abort()
        self._open.clear()
        self._drained.clear()
