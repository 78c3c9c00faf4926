"""Serve an ASGI app with uvicorn inside the sidecar's own event loop.

uvicorn's ``Server.serve()`` would install its own signal handlers and run its own
main loop; the sidecar owns signals and lifecycle, so :class:`AsgiListener` binds the
socket itself (clear error, port 0 allowed), calls ``startup(sockets=...)`` and later
``shutdown()``. Lifespan events are off: the sidecar starts its components itself.
``http="auto"`` picks uvicorn's httptools parser (a sidecar dependency) when installed.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import uvicorn

from gym_sidecar.config import split_host_port

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


class AsgiListener:
    """One uvicorn server for ``app`` on ``listen``. start/stop are safe to repeat."""

    def __init__(self, app: Any, listen: str, name: str, http: str = "auto") -> None:
        self.name = name
        self.listen = listen
        self.config = uvicorn.Config(
            app,
            lifespan="off",
            http=http,
            ws="none",
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_keep_alive=30,
        )
        self._server: uvicorn.Server | None = None
        self._sockets: list[socket.socket] = []
        self.bound_port: int | None = None

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
        logger.info("%s listening on %s", self.name, self.listen)

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
