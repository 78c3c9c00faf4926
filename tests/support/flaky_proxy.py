"""A TCP forwarder that drops the first connections it gets: a target that fails, then works.

``FlakyProxy(target_port, drop_first=N)`` listens on a free loopback port (``port``) in a
thread of its own. Each connection is read up to the end of its request headers (one
that closes before, such as a probe of the port, counts for nothing); each of the first
``N`` requests is then closed without an answer (what a server that dies mid-request
looks like to aiohttp: ``ServerDisconnectedError``); every later connection is forwarded
to ``127.0.0.1:target_port`` both ways, byte for byte. ``dropped`` counts the dropped
connections. A context manager; ``stop`` is safe twice.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import suppress

from tests.support.ports import free_port, wait_listening


class FlakyProxy:
    def __init__(self, target_port: int, drop_first: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.drop_first = drop_first
        self.port = port or free_port()
        self.dropped = 0
        self.forwarded = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> FlakyProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        future.result(timeout=10)
        wait_listening(self.port, timeout_s=10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> FlakyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()  # no request (a probe of the port): neither dropped nor forwarded
            return
        with self._lock:
            drop = self.dropped < self.drop_first
            if drop:
                self.dropped += 1
            else:
                self.forwarded += 1
        if drop:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        up_writer.write(head)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with suppress(Exception):
            writer.close()
