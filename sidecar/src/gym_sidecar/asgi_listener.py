"""Serve an ASGI app with uvicorn inside the sidecar's own event loop.

uvicorn's ``Server.serve()`` would install its own signal handlers and run its own
main loop; the sidecar owns signals and lifecycle, so :class:`AsgiListener` binds the
socket itself (clear error, port 0 allowed), calls ``startup(sockets=...)`` and later
``shutdown()``. Lifespan events are off: the sidecar starts its components itself.

Connections are served by :class:`GuardedHttpToolsProtocol`, uvicorn's httptools protocol
with the limits uvicorn lacks (httptools has no header-size limit, and uvicorn arms its
keep-alive timer only after a first response, so a connection that never sends a
request, or sends its headers slowly, is held for ever). Per listener
(:class:`ConnectionLimits`):

- more than ``max_connections`` open connections: the new one is answered 503 with
  ``Connection: close`` and closed at once, before anything is read;
- no request in progress for ``idle_timeout_s`` (a fresh connection, or keep-alive
  between requests): closed;
- headers not complete ``header_timeout_s`` after the request's first byte: 408, closed;
- request line plus headers over ``max_header_bytes``: 431, closed. Only header bytes
  count: the URL and each complete header as the parser reports them, and every socket
  read fed while one request's headers were incomplete from its start to its end (all of
  it header bytes). The read a request begins in is counted by the callbacks alone, since
  it may also carry a previous request or its body; so httptools, which buffers a header
  line until it is complete, never holds more than one socket read (256 KiB) past it.

Each of these is counted in ``limit_hits{limit=<limits. key>}``. h11 is not used: it
would bound headers too but is several times slower than httptools per request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gym_sidecar.config import LimitsConfig
from gym_sidecar.hostport import bound_address, split_host_port
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)


def bind_tcp(listen: str) -> socket.socket:
    """A listening-ready TCP socket bound to ``HOST:PORT`` (IPv4, IPv6 or a host name)."""
    host, port = split_host_port(listen)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, socktype, proto, _, address = infos[0]
    sock = socket.socket(family, socktype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {listen}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


@dataclass
class ConnectionLimits:
    """One listener's connection limits, the ``limits.`` keys they are counted under,
    and its open-connection count (loop-confined, no locking)."""

    metrics: SelfMetrics
    max_connections: int
    max_header_bytes: int
    header_timeout_s: float
    idle_timeout_s: float
    max_connections_key: str
    """``limit_hits`` label when ``max_connections`` bites (one key per listener)."""
    open_connections: int = field(default=0, init=False)

    @classmethod
    def from_config(
        cls, limits: LimitsConfig, metrics: SelfMetrics, max_connections_key: str
    ) -> ConnectionLimits:
        """The shared header/idle limits plus the listener's own ``max_connections_key``
        (``http_max_connections`` or ``admin_max_connections``)."""
        return cls(
            metrics=metrics,
            max_connections=int(getattr(limits, max_connections_key)),
            max_header_bytes=limits.http_max_header_bytes,
            header_timeout_s=limits.http_header_timeout_s,
            idle_timeout_s=limits.http_idle_timeout_s,
            max_connections_key=max_connections_key,
        )

    def hit(self, limit: str) -> None:
        self.metrics.limit_hits.labels(limit).inc()


_HEADER_BYTES = "http_max_header_bytes"
_HEADER_TIMEOUT = "http_header_timeout_s"
_IDLE_TIMEOUT = "http_idle_timeout_s"


def _refusal(status: bytes, message: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"connection: close\r\n"
        + extra
        + b"content-length: "
        + str(len(message)).encode()
        + b"\r\n\r\n"
        + message
    )


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus connection, header and idle limits (see the
    module docstring). Subclassed per listener by :func:`guarded_protocol`, which sets
    ``limits``. Relies on uvicorn's protocol callbacks (``on_message_begin``,
    ``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``,
    ``on_message_complete``, ``timeout_keep_alive_handler``); tests/sidecar's
    test_listener_limits.py exercises each limit over real sockets."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]
        self._admitted = False
        self._in_head = False  # a request has begun and its headers are not complete
        self._head_bytes = 0  # exact: URL and complete headers reported by the parser
        self._head_fed = 0  # lower bound of the header bytes fed (see data_received)
        self._began_in_read = False  # a request began in the read being fed
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self.limits
        if limits.open_connections >= limits.max_connections:
            limits.hit(limits.max_connections_key)
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(
                _refusal(
                    b"503 Service Unavailable",
                    b"too many open connections; retry later",
                    b"retry-after: 1\r\n",
                )
            )
            transport.close()
            return
        limits.open_connections += 1
        self._admitted = True
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm(limits.idle_timeout_s, self._idle_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self.limits.open_connections -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._began_in_read = False
        super().data_received(data)
        if not self._in_head or self._refused or self.transport.is_closing():
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

    # -- parser callbacks -----------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._in_head = True
        self._began_in_read = True
        self._head_bytes = 0
        self._head_fed = 0
        self._arm(self.limits.header_timeout_s, self._header_expired)

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        if not self._refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        if not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        if not self._refused:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.limits.hit(_IDLE_TIMEOUT)
        super().timeout_keep_alive_handler()

    # -- limits ---------------------------------------------------------------------------
    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.limits.max_header_bytes and not self._refused:
            self._refuse_head_too_large()

    def _refuse_head_too_large(self) -> None:
        limit = self.limits.max_header_bytes
        self._refuse(
            _HEADER_BYTES,
            b"431 Request Header Fields Too Large",
            f"request line and headers exceed {limit} bytes".encode(),
        )

    def _header_expired(self) -> None:
        self._timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(
                _HEADER_TIMEOUT,
                b"408 Request Timeout",
                f"headers not received within {self.limits.header_timeout_s}s".encode(),
            )

    def _idle_expired(self) -> None:
        self._timer = None
        if not self._in_head and self.cycle is None and not self.transport.is_closing():
            self.limits.hit(_IDLE_TIMEOUT)
            self.transport.close()

    def _refuse(self, limit: str, status: bytes, message: bytes) -> None:
        """Answer ``status`` and close; nothing more of this connection is parsed."""
        self._refused = True
        self._in_head = False
        self._disarm()
        self.limits.hit(limit)
        self.transport.write(_refusal(status, message))
        self.transport.close()

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """A protocol class bound to one listener's ``limits`` (uvicorn builds one protocol
    instance per connection from the class it is given)."""
    return type("ListenerProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


class AsgiListener:
    """One uvicorn server for ``app`` on ``listen``. start/stop are safe to repeat."""

    def __init__(self, app: Any, listen: str, name: str, limits: ConnectionLimits) -> None:
        self.name = name
        self.listen = listen
        self.limits = limits
        self.config = uvicorn.Config(
            app,
            lifespan="off",
            http=guarded_protocol(limits),
            ws="none",
            log_config=None,
            access_log=False,
            server_header=False,
            # The protocol sets the real (float) idle timeout; this is uvicorn's int field.
            timeout_keep_alive=max(1, int(limits.idle_timeout_s)),
        )
        self._server: uvicorn.Server | None = None
        self._sockets: list[socket.socket] = []
        self.bound_port: int | None = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` with the port actually bound once started (``listen`` before)."""
        return bound_address(self.listen, self.bound_port)

    async def start(self) -> None:
        if self._server is not None:
            return
        sock = bind_tcp(self.listen)
        self._sockets = [sock]
        self.bound_port = int(sock.getsockname()[1])
        if not self.config.loaded:
            self.config.load()
        server = uvicorn.Server(self.config)
        server.lifespan = self.config.lifespan_class(self.config)
        await server.startup(sockets=self._sockets)
        if not server.started:
            raise OSError(f"{self.name} listener failed to start on {self.listen}")
        self._server = server
        logger.info("%s listening on %s", self.name, self.address)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting and wait up to ``grace_s`` for in-flight requests."""
        server, self._server = self._server, None
        if server is None:
            return
        self.config.timeout_graceful_shutdown = max(1, int(grace_s + 0.999))
        server.should_exit = True
        await server.shutdown(sockets=self._sockets)
        self._sockets = []
        logger.info("%s listener stopped", self.name)
