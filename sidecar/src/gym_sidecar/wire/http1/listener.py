"""Serve an ASGI app inside the sidecar's own event loop.

:class:`AsgiListener` binds the socket itself (a clear error, port 0 allowed), serves
each connection with :class:`~gym_sidecar.wire.http1.protocol.HttpProtocol` and stops
gracefully, as it did when it drove uvicorn's ``Server.startup(sockets=...)`` and
``shutdown()``: the sidecar owns signals and lifecycle, and there are no lifespan
events (the sidecar starts its components itself).
"""

from __future__ import annotations

import asyncio
import logging

from gym_sidecar.hostport import bind_tcp, bound_address
from gym_sidecar.wire.http1.connection_limits import ConnectionLimits
from gym_sidecar.wire.http1.cycle import App
from gym_sidecar.wire.http1.protocol import HttpProtocol, ServerState

logger = logging.getLogger(__name__)

BACKLOG = 2048
"""Pending connections the kernel queues (uvicorn's default)."""
CANCEL_WAIT_S = 1.0
"""How long ``stop`` waits for the requests it cancelled to end (an app that ignores
the cancellation is left behind; its connection is closed all the same)."""


class AsgiListener:
    """``app`` served on ``listen`` with ``limits``. ``start``/``stop`` are safe to repeat
    (and ``stop`` without ``start``); use from one event loop."""

    def __init__(self, app: App, listen: str, name: str, limits: ConnectionLimits) -> None:
        self.app = app
        self.name = name
        self.listen = listen
        self.limits = limits
        self.bound_port: int | None = None
        self._server: asyncio.Server | None = None
        self._state = ServerState()

    @property
    def address(self) -> str:
        """``HOST:PORT`` with the port actually bound once started (``listen`` before)."""
        return bound_address(self.listen, self.bound_port)

    async def start(self) -> None:
        """Bind and listen; raises ``OSError`` when the address cannot be had."""
        if self._server is not None:
            return
        sock = bind_tcp(self.listen)
        loop = asyncio.get_running_loop()
        app, limits, state = self.app, self.limits, self._state
        try:
            self._server = await loop.create_server(
                lambda: HttpProtocol(app, limits, state, loop), sock=sock, backlog=BACKLOG
            )
        except BaseException:
            sock.close()
            raise
        self.bound_port = int(sock.getsockname()[1])
        logger.info("%s listening on %s", self.name, self.address)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; close idle connections at once and the others after their
        last response; wait up to ``grace_s`` for that and for every running request,
        then cancel the requests still running (each is answered 503 if it had not
        started its response) and close every connection left."""
        server, self._server = self._server, None
        if server is None:
            return
        state = self._state
        state.shutting_down = True
        server.close()
        for conn in list(state.connections):
            conn.shutdown()
        try:
            await asyncio.wait_for(asyncio.shield(state.drained()), grace_s)
        except TimeoutError:
            logger.warning(
                "%s listener: %d request(s) still running after %.1fs, cancelled",
                self.name,
                len(state.tasks),
                grace_s,
            )
            tasks = list(state.tasks)
            for task in tasks:
                task.cancel()
            if tasks:  # each answers 503 and closes its connection as it ends
                await asyncio.wait(tasks, timeout=CANCEL_WAIT_S)
            for conn in list(state.connections):
                conn.transport.close()
        # Refused before admission (the connection cap): not in state, lingering alone.
        await self.limits.lingering.wait(min(grace_s, self.limits.close_linger_s))
        await server.wait_closed()
        logger.info("%s listener stopped", self.name)
