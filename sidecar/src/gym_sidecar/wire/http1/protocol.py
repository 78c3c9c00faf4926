"""HTTP/1.1 connections on asyncio and httptools, serving one ASGI app.

:class:`HttpProtocol` parses requests with httptools (llhttp, the C parser uvicorn
uses) and hands each to a :class:`~gym_sidecar.wire.http1.cycle.RequestCycle` run as
its own task. It replaces uvicorn's ``HttpToolsProtocol`` and the subclass that added
the sidecar's limits to it: importing ``uvicorn.protocols.http.httptools_impl`` cost
4.8 MiB resident (uvicorn.config, click, uvicorn's logging and middleware; httptools
itself 0.2 MiB), which is what this module and :mod:`.cycle` save. What uvicorn did is
written again here, on purpose the same:

- keep-alive (HTTP/1.1 unless ``Connection: close``; HTTP/1.0 closes after the
  response) and pipelining: a request whose head is complete while an earlier one is
  still being answered waits, in order, and reading pauses until the earlier response
  is complete;
- bounded read-ahead: reading pauses while more than :data:`HIGH_WATER_BYTES` of a
  request body wait for the app, and resumes when the app asks for them (``receive``);
  one socket read (256 KiB) is parsed whole, so that is the most a connection holds
  past either pause;
- a request httptools cannot parse (a bad request line, header or chunk, a URL that is
  not ASCII) is answered 400 ``Invalid HTTP request received.`` and the connection
  closed; an ``Upgrade`` request is served as a plain request (nothing is upgraded) and
  the rest of the socket read it came in is ignored;
- data after a request that said ``Connection: close`` is ignored (llhttp's
  ``lenient_data_after_close``, as uvicorn set it).

And the limits the subclass added
(:class:`~gym_sidecar.wire.http1.connection_limits.ConnectionLimits`, one per listener;
each refusal counted in ``limit_hits``):

- more than ``max_connections`` open connections: the new one is answered 503 with
  ``Connection: close`` and closed at once, before anything is read;
- no request in progress for ``idle_timeout_s`` (a fresh connection, keep-alive between
  requests, or the rest of a body nobody reads after an early answer such as 413):
  closed. Only the first byte of a request stops this clock; bytes that begin none
  (stray CRLFs, a discarded body) do not;
- headers not complete ``header_timeout_s`` after the request's first byte: 408, closed;
- request line plus headers over ``max_header_bytes``: 431, closed. Only header bytes
  count: the URL and each complete header as the parser reports them, and every socket
  read fed while one request's headers were incomplete from its start to its end (all
  of it header bytes). The read a request begins in is counted by the callbacks alone,
  since it may also carry a previous request or its body; so httptools, which buffers a
  header line until it is complete, never holds more than one socket read past it.

One difference from uvicorn, on purpose: a client that half-closes its side after
sending complete requests gets their answers, then the connection closes (uvicorn closed
at once, and those answers were lost); a request still incomplete at the half-close
is dropped (its app sees ``http.disconnect``).

Loop-confined: every method runs on the listener's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.parse
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools

from gym_sidecar.wire.http1.connection_limits import (
    HEADER_BYTES,
    HEADER_TIMEOUT,
    IDLE_TIMEOUT,
    ConnectionLimits,
)
from gym_sidecar.wire.http1.cycle import App, RequestCycle, refusal

logger = logging.getLogger(__name__)

HIGH_WATER_BYTES = 64 * 1024
"""Request body bytes held for the app before reading pauses (uvicorn's value)."""

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_EARLY_S = 0.001
"""A timer firing this close before its deadline counts as on time."""
_MALFORMED = b"Invalid HTTP request received."


class _Refused(Exception):
    """Raised in a parser callback after a refusal: httptools stops parsing at once."""


class ServerState:
    """One listener's open connections and running requests (its tasks), so that it can
    stop them; :meth:`drained` resolves once both are empty."""

    def __init__(self) -> None:
        self.connections: set[HttpProtocol] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.shutting_down = False
        self._drained: asyncio.Future[None] | None = None

    def add_task(self, task: asyncio.Task[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._check()

    def remove(self, conn: HttpProtocol) -> None:
        self.connections.discard(conn)
        self._check()

    def drained(self) -> asyncio.Future[None]:
        """Done once no connection is open and no request runs."""
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
            self._check()
        return self._drained

    def _check(self) -> None:
        waiter = self._drained
        if waiter is not None and not self.connections and not self.tasks and not waiter.done():
            waiter.set_result(None)


class HttpProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection serving ``app`` (see the module docstring)."""

    __slots__ = (
        "_admitted",
        "_began_in_read",
        "_client",
        "_close_when_done",
        "_deadline",
        "_eof",
        "_expect_continue",
        "_head_bytes",
        "_head_fed",
        "_headers",
        "_in_head",
        "_on_deadline",
        "_queue",
        "_read_paused",
        "_reading",
        "_refused",
        "_running",
        "_server",
        "_timer",
        "_timer_at",
        "_url",
        "_write_ready",
        "app",
        "limits",
        "loop",
        "parser",
        "state",
        "transport",
    )

    def __init__(
        self,
        app: App,
        limits: ConnectionLimits,
        state: ServerState,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.app = app
        self.limits = limits
        self.state = state
        self.loop = loop
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self._server: tuple[str, int] | None = None
        self._client: tuple[str, int] | None = None
        self._admitted = False
        self._refused = False  # answered and closing: nothing more is parsed
        self._eof = False  # the client half-closed
        self._close_when_done = False  # the listener is stopping
        # One deadline at a time (idle or headers), on one lazily moved timer.
        self._deadline = 0.0
        self._on_deadline: Callable[[], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._read_paused = False
        self._write_ready: asyncio.Future[None] | None = None
        # The request being parsed.
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_continue = False
        self._in_head = False  # a request has begun and its headers are not complete
        self._head_bytes = 0  # exact: URL and complete headers reported by the parser
        self._head_fed = 0  # lower bound of the header bytes fed (see data_received)
        self._began_in_read = False  # a request began in the read being fed
        # Requests: the one whose body is being read (the last whose head completed),
        # the one being answered, and those waiting behind it (pipelining).
        self._reading: RequestCycle | None = None
        self._running: RequestCycle | None = None
        self._queue: deque[RequestCycle] = deque()

    # -- connection -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        limits = self.limits
        if limits.open_connections >= limits.max_connections:
            limits.hit(limits.max_connections_key)
            transport.write(
                refusal(
                    b"503 Service Unavailable",
                    b"too many open connections; retry later",
                    b"retry-after: 1\r\n",
                )
            )
            self._refused = True
            limits.lingering.close(transport)
            return
        limits.open_connections += 1
        self._admitted = True
        self.state.connections.add(self)
        sock: socket.socket | None = transport.get_extra_info("socket")
        if sock is not None:
            self._server = _address(sock.getsockname())
            try:
                self._client = _address(sock.getpeername())
            except OSError:  # already reset by the peer
                self._client = None
        self._arm(limits.idle_timeout_s, self._idle_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.limits.lingering.closed(self.transport)
        if not self._admitted:
            return
        self._admitted = False
        self.limits.open_connections -= 1
        self._disarm()
        self._stop_timer()
        for cycle in (self._running, *self._queue, self._reading):
            if cycle is not None:
                cycle.disconnect()
        self._queue.clear()
        self.resume_writing()
        self.state.remove(self)

    def eof_received(self) -> bool | None:
        self._eof = True
        if self._refused:
            return None  # lingering: the client closed, so does asyncio
        if self._in_head:  # a request that can never be complete
            self._in_head = False
            self._disarm()
        reading = self._reading
        if reading is not None and reading.more_body and not reading.response_complete:
            reading.disconnect()  # its body can never be complete
            if self._queue and self._queue[-1] is reading:
                self._queue.pop()
        running = self._running
        if running is not None and not running.disconnected and not running.response_complete:
            return True  # keep the write side: answer, then close (response_complete)
        return None  # asyncio closes the transport

    def data_received(self, data: bytes) -> None:
        if self._refused:
            self.limits.lingering.drained(self.transport, len(data))
            return
        self._began_in_read = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            logger.debug("served an Upgrade request without upgrading; rest of the read ignored")
        except httptools.HttpParserError as exc:
            if not self._refused:
                self._malformed(exc)
            return
        if not self._in_head or self._closing():
            return
        # httptools buffers a header line until it is complete: bound what it holds.
        if self._began_in_read:
            # This read may also hold a previous request or its body: count only what
            # the callbacks saw of this request's head (the rest is under one read).
            self._head_fed = self._head_bytes
        else:
            # Headers incomplete before and after this read: all of it is header bytes.
            self._head_fed += len(data)
            if self._head_fed > self.limits.max_header_bytes:
                self._refuse_head_too_large()

    def pause_writing(self) -> None:
        if self._write_ready is None:
            self._write_ready = self.loop.create_future()

    def resume_writing(self) -> None:
        ready, self._write_ready = self._write_ready, None
        if ready is not None and not ready.done():
            ready.set_result(None)

    def shutdown(self) -> None:
        """The listener stops: close now if no request is being answered, else after the
        last one received (whose response says ``Connection: close``)."""
        self._close_when_done = True
        if self._refused:
            return  # lingering already; it ends by itself
        if self._running is None:
            self.transport.close()
            return
        last = self._queue[-1] if self._queue else self._running
        last.keep_alive = False

    # -- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._expect_continue = False
        self._in_head = True
        self._began_in_read = True
        self._head_bytes = 0
        self._head_fed = 0
        self._arm(self.limits.header_timeout_s, self._header_expired)

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head_too_large()
            raise _Refused  # httptools stops here; data_received sees the refusal
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head_too_large()
            raise _Refused  # httptools stops here; data_received sees the refusal
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        parser = self.parser
        version = parser.get_http_version()
        url = httptools.parse_url(self._url)
        raw_path: bytes = url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self._server,
            "client": self._client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
        }
        keep_alive = version != "1.0" and parser.should_keep_alive() and not self._close_when_done
        cycle = RequestCycle(
            self, scope, keep_alive=keep_alive, expect_continue=self._expect_continue
        )
        self._reading = cycle
        if self._running is None:
            self._start(cycle)
        else:  # pipelined: answered in order once the earlier responses are complete
            self._queue.append(cycle)
            self._pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self._reading
        assert cycle is not None
        if cycle.response_complete or cycle.disconnected:
            return  # answered before its body was read (413, 429): the rest is dropped
        if cycle.feed_body(body) > HIGH_WATER_BYTES:
            self._pause_reading()

    def on_message_complete(self) -> None:
        cycle = self._reading
        assert cycle is not None
        cycle.end_body()

    # -- requests -------------------------------------------------------------------------
    def _start(self, cycle: RequestCycle) -> None:
        self._running = cycle
        self.state.add_task(self.loop.create_task(cycle.run(self.app)))

    def wants_body(self, cycle: RequestCycle) -> None:
        if cycle is self._reading:
            self._resume_reading()

    def write_ready(self) -> asyncio.Future[None] | None:
        return self._write_ready

    def response_complete(self, cycle: RequestCycle) -> None:
        if cycle is not self._running:
            return
        self._running = None
        if self._closing():
            return
        self._resume_reading()
        if self._queue:
            self._start(self._queue.popleft())
        elif self._eof or self._close_when_done:
            self.transport.close()
        elif not self._in_head:
            self._arm(self.limits.idle_timeout_s, self._idle_expired)

    def _pause_reading(self) -> None:
        if not self._read_paused and not self._eof:
            self._read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused:
            self._read_paused = False
            if not self._eof:
                self.transport.resume_reading()

    # -- limits ---------------------------------------------------------------------------
    def _refuse_head_too_large(self) -> None:
        limit = self.limits.max_header_bytes
        self._refuse(
            HEADER_BYTES,
            b"431 Request Header Fields Too Large",
            b"request line and headers exceed %d bytes" % limit,
        )

    def _header_expired(self) -> None:
        if self._in_head and not self._closing():
            self._refuse(
                HEADER_TIMEOUT,
                b"408 Request Timeout",
                f"headers not received within {self.limits.header_timeout_s}s".encode(),
            )

    def _idle_expired(self) -> None:
        if not self._in_head and self._running is None and not self._closing():
            self.limits.hit(IDLE_TIMEOUT)
            self.transport.close()

    def _malformed(self, exc: Exception) -> None:
        self.limits.malformed()
        logger.debug("invalid HTTP request from %s: %r", self._client, exc)
        self._answer_and_close(refusal(b"400 Bad Request", _MALFORMED))

    def _refuse(self, limit: str, status: bytes, message: bytes) -> None:
        """Answer ``status`` and close; nothing more of this connection is parsed."""
        self.limits.hit(limit)
        self._answer_and_close(refusal(status, message))

    def _answer_and_close(self, response: bytes) -> None:
        self.transport.write(response)
        self.linger_close()

    def linger_close(self) -> None:
        """Close once what was written (the last response) reached the client: nothing
        more is parsed, the write side shuts down after it, and the connection drains
        what the client still sends until it closes, ``limits.close_linger_s`` at most
        (:mod:`gym_sidecar.wire.linger`). Closing at once with the client's bytes unread
        would send a TCP reset, which can destroy the response before it is read."""
        self._refused = True
        self._in_head = False
        self._disarm()
        self.limits.lingering.close(self.transport)

    def _closing(self) -> bool:
        """Closed, closing, or lingering: nothing more to do on this connection."""
        return self._refused or self.transport.is_closing()

    # A connection meets a deadline per request (headers) and between requests (idle).
    # Scheduling and cancelling a timer for each would cost two asyncio timers per
    # request; instead one timer stays scheduled and is moved only when a deadline comes
    # *earlier* than it: when it fires before the current deadline (which moved later
    # since), it sleeps on until then. Back-to-back requests thus schedule a timer about
    # once per header timeout, not twice per request.
    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` ``delay`` seconds from now, unless re-armed or disarmed."""
        deadline = self.loop.time() + delay
        self._deadline = deadline
        self._on_deadline = callback
        if self._timer is None or self._timer_at > deadline:
            self._stop_timer()
            self._timer = self.loop.call_at(deadline, self._timer_fired)
            self._timer_at = deadline

    def _disarm(self) -> None:
        self._on_deadline = None  # the timer, if it fires, finds nothing due

    def _timer_fired(self) -> None:
        self._timer = None
        callback = self._on_deadline
        if callback is None or self._closing():
            return
        if self._deadline - self.loop.time() > _EARLY_S:  # the deadline moved later
            self._timer = self.loop.call_at(self._deadline, self._timer_fired)
            self._timer_at = self._deadline
            return
        self._on_deadline = None
        callback()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _address(info: Any) -> tuple[str, int] | None:
    """``(host, port)`` of a socket address (IPv6's 4-tuple cut to two)."""
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None
