"""One HTTP/1.1 request and its response, as an ASGI ``http`` exchange.

:class:`RequestCycle` is what uvicorn's ``RequestResponseCycle`` did for the sidecar's
listeners, written again here so that serving them imports neither uvicorn nor click
(importing ``uvicorn.protocols.http.httptools_impl`` costs 4.8 MiB resident; see
:mod:`gym_sidecar.wire.http1`). The same contract, kept on purpose:

- ``receive()`` returns the request body as it arrives (``http.request`` with
  ``more_body``), then, once the response is complete or the client is gone, blocks
  until then and returns ``http.disconnect``. The first ``receive()`` of a request that
  carried ``Expect: 100-continue`` writes ``100 Continue`` (an app that answers first,
  413 on ``Content-Length``, never asks for the body).
- ``send()`` takes ``http.response.start`` then ``http.response.body`` messages. A
  response without ``Content-Length`` is sent chunked (not to HEAD, 204 or 304); HEAD
  gets the head and no body; a body longer or shorter than its ``Content-Length``, a
  header name or value with control characters, or messages out of order raise
  ``RuntimeError`` in the app. ``Connection: close`` from the app, an HTTP/1.0 request
  or a request saying ``Connection: close`` close the connection after the response.
  After a disconnect ``send()`` does nothing.
- An app that raises is logged (rate-limited, with its traceback) and answered 500 if
  it had not started its response, else the connection is closed: the client never
  sees a traceback. An app that returns without a response gets a 500 written for it;
  one that returns halfway through one has its connection closed.
- A request still running when the listener's stop gives up waiting is cancelled and
  answered **503** with ``Retry-After: 1`` if its response had not started (uvicorn
  answered 500 and logged the cancellation as an app error; OTLP clients retry 503,
  not 500), and its connection is closed.

Differences from uvicorn, each cheaper and invisible on the wire except where said:
the response head is written together with the first body bytes (one ``write``, one
segment, instead of two); the body a client sent in one socket read reaches the app as
the very bytes object the parser made (uvicorn copied it twice, into a ``bytearray``
and out of it); no ``Date`` or ``Server`` header (uvicorn sent none here either: its
header refresher is its main loop, which the sidecar never ran); the scope has no
``state`` (no lifespan); and ``X-Forwarded-For`` / ``X-Forwarded-Proto`` from loopback
no longer rewrite ``client`` and ``scheme`` (uvicorn's ``proxy_headers``, on by
default, never chosen: the client address feeds the enrichment's Docker peer lookups,
which a header must not steer).

Loop-confined: everything runs on the listener's event loop.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from gym_telemetry_semconv.ratelimit import rate_limit

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Any]

#: An app that raises does so per request while its bug lasts: one line per 10 s.
_failure_log = rate_limit(logging.getLogger(__name__ + ".failures"), 10.0)

# What uvicorn refuses in response headers (RFC 9110 tokens; no CR, LF or NUL in values).
_BAD_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_BAD_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


def refusal(status: bytes, message: bytes, extra: bytes = b"") -> bytes:
    """A whole ``text/plain`` response that closes the connection."""
    return (
        b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
        b"%scontent-length: %d\r\n\r\n%s" % (status, extra, len(message), message)
    )


_SHUTTING_DOWN = refusal(
    b"503 Service Unavailable", b"server shutting down; retry later", b"retry-after: 1\r\n"
)
_STATUS_LINES: dict[int, bytes] = {}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_SERVER_ERROR = b"Internal Server Error"


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason>\\r\\n`` (an unknown status gets an empty reason)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = http.HTTPStatus(status).phrase.encode()
        except ValueError:
            phrase = b""
        line = b"HTTP/1.1 %d %s\r\n" % (status, phrase)
        if 100 <= status < 600:
            _STATUS_LINES[status] = line
    return line


class Connection(Protocol):
    """What a cycle needs of its connection (:class:`~.protocol.HttpProtocol`)."""

    transport: asyncio.Transport

    def wants_body(self, cycle: RequestCycle) -> None:
        """The app of ``cycle`` asks for its body: read on if reading was paused for it."""

    def write_ready(self) -> asyncio.Future[None] | None:
        """A future to await while the transport's write buffer is full, else None."""

    def response_complete(self, cycle: RequestCycle) -> None:
        """``cycle``'s response is sent in full: start the next request or wait for one."""

    def linger_close(self) -> None:
        """Close after the last response reached the client (no reset; see
        :mod:`gym_sidecar.wire.linger`)."""


class RequestCycle:
    """One request's ASGI ``receive``/``send`` pair and its state. The connection feeds
    it with :meth:`feed_body`, :meth:`end_body` and :meth:`disconnect`."""

    __slots__ = (
        "_body",
        "_buffered",
        "_ended",
        "_head",
        "_remaining",
        "_waiter",
        "chunked",
        "conn",
        "disconnected",
        "expect_continue",
        "keep_alive",
        "more_body",
        "response_complete",
        "response_started",
        "scope",
    )

    def __init__(
        self, conn: Connection, scope: Scope, *, keep_alive: bool, expect_continue: bool
    ) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.disconnected = False
        self.more_body = True  # the request body has not ended yet
        self.response_started = False
        self.response_complete = False
        self.chunked: bool | None = None  # response framing, once known
        self._body: bytes | list[bytes] = b""  # received, not yet handed to the app
        self._buffered = 0  # its size
        self._ended = False  # the app was handed the end of the body
        self._head = b""  # response head, written with the first body bytes
        self._remaining = 0  # response bytes still owed to its Content-Length
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the connection ------------------------------------------------------------
    def feed_body(self, chunk: bytes) -> int:
        """Add ``chunk`` of the request body; returns the bytes now held for the app."""
        body = self._body
        if not body:
            self._body = chunk  # the common case: one chunk, handed on without a copy
        elif isinstance(body, bytes):
            self._body = [body, chunk]
        else:
            body.append(chunk)
        self._buffered += len(chunk)
        self._wake()
        return self._buffered

    def end_body(self) -> None:
        self.more_body = False
        self._wake()

    def disconnect(self) -> None:
        """The client is gone (or will send no more): ``receive`` says so, ``send`` is a
        no-op from now on."""
        if not self.response_complete:
            self.disconnected = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- the app ----------------------------------------------------------------------------
    async def run(self, app: App) -> None:
        """Run ``app`` for this request (the connection's task for it)."""
        try:
            result = await app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            # The listener stops and its grace period is over: tell the client to retry
            # (OTLP clients retry 503; uvicorn answered 500, which they do not retry).
            if not self.response_started and not self.disconnected:
                self.conn.transport.write(_SHUTTING_DOWN)
                self.conn.linger_close()
            else:
                self.conn.transport.close()
            raise
        except Exception:  # boundary: an app's bug must not reach the client or the loop
            _failure_log.exception(
                "exception in ASGI application (%s %r)", self.scope["method"], self.scope["path"]
            )
            if not self.response_started:
                await self._send_500()
            else:
                self.conn.transport.close()
        else:
            if result is not None:
                _failure_log.error("ASGI app returned %r instead of None", type(result))
                self.conn.transport.close()
            elif not self.response_started and not self.disconnected:
                _failure_log.error("ASGI app returned without starting a response")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                _failure_log.error("ASGI app returned without completing its response")
                self.conn.transport.close()

    async def _send_500(self) -> None:
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", b"%d" % len(_SERVER_ERROR)),
                    (b"connection", b"close"),
                ],
            }
        )
        await self.send({"type": "http.response.body", "body": _SERVER_ERROR})

    async def receive(self) -> Message:
        if self.expect_continue:
            self.expect_continue = False
            if not self.conn.transport.is_closing():
                self.conn.transport.write(_CONTINUE)
        if not self.disconnected and not self.response_complete:
            self.conn.wants_body(self)
            if self._ended or (self.more_body and not self._body):
                self._waiter = waiter = asyncio.get_running_loop().create_future()
                await waiter
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        body = self._body
        self._body = b""
        self._buffered = 0
        if not isinstance(body, bytes):
            body = b"".join(body)
        if not self.more_body:
            self._ended = True
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: Message) -> None:
        if not self.disconnected:
            ready = self.conn.write_ready()
            if ready is not None:
                await ready
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']!r}")
            self.response_started = True
            self.expect_continue = False
            self._head = self._response_head(message["status"], message.get("headers", ()))
            return
        if self.response_complete:
            raise RuntimeError(f"{message['type']!r} sent after the response was complete")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"expected http.response.body, got {message['type']!r}")
        body: bytes = message.get("body", b"")
        more_body = message.get("more_body", False)
        head, self._head = self._head, b""
        if self.scope["method"] == "HEAD":
            self._remaining = 0
            out = head
        elif self.chunked:
            out = head + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"")
            if not more_body:
                out += b"0\r\n\r\n"
        else:
            if len(body) > self._remaining:
                raise RuntimeError("response body longer than its Content-Length")
            self._remaining -= len(body)
            out = head + body if head else body
        if out:
            self.conn.transport.write(out)
        if not more_body:
            if self._remaining:
                raise RuntimeError("response body shorter than its Content-Length")
            self.response_complete = True
            self._wake()
            if not self.keep_alive:
                self.conn.linger_close()
            self.conn.response_complete(self)

    def _response_head(self, status: int, headers: Any) -> bytes:
        parts = [status_line(status)]
        has_close = False
        for raw_name, value in headers:
            if _BAD_NAME.search(raw_name):
                raise RuntimeError(f"invalid response header name {raw_name!r}")
            if _BAD_VALUE.search(value):
                raise RuntimeError(f"invalid response header value for {raw_name!r}")
            name = raw_name.lower()
            if name == b"content-length" and self.chunked is None:
                self._remaining = int(value.decode())
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self._remaining = 0
                self.chunked = True
            elif name == b"connection" and b"close" in (
                token.strip().lower() for token in value.split(b",")
            ):
                self.keep_alive = False
                has_close = True
            parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_close:
            parts.append(b"connection: close\r\n")
        if self.chunked is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)
