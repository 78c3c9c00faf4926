"""A listener on a free loopback port in the test's own event loop, raw socket clients
for it, and a parser for what comes back: the shared parts of the HTTP/1.1 tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http1.connection_limits import ConnectionLimits
from gym_sidecar.wire.http1.listener import AsgiListener

BOUND_S = 10.0
"""How long a client waits for the server to answer or close (never a latency bound)."""


def limits(**overrides: Any) -> ConnectionLimits:
    values: dict[str, Any] = {
        "metrics": SelfMetrics(),
        "max_connections": 16,
        "max_header_bytes": 8 * 1024,
        "header_timeout_s": 30.0,
        "idle_timeout_s": 30.0,
        "max_connections_key": "http_max_connections",
    }
    values.update(overrides)
    return ConnectionLimits(**values)


def counted(lim: ConnectionLimits, name: str, *labels: str) -> float:
    """A counter's value in ``lim``'s metrics (``limit_hits`` or ``bad_requests``)."""
    return float(getattr(lim.metrics, name).labels(*labels).value)


@contextlib.asynccontextmanager
async def serving(app: Any, lim: ConnectionLimits | None = None) -> AsyncIterator[AsgiListener]:
    listener = AsgiListener(app, "127.0.0.1:0", "test", lim or limits())
    await listener.start()
    try:
        yield listener
    finally:
        await listener.stop(1.0)


async def exchange(
    port: int, *parts: bytes, half_close: bool = False, pause_s: float = 0.0
) -> bytes:
    """Send ``parts`` (``pause_s`` apart), optionally half-close, and return everything
    the server sends until it closes; fails if it is still open after ``BOUND_S``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i, part in enumerate(parts):
            if i and pause_s:
                await asyncio.sleep(pause_s)
            writer.write(part)
            await writer.drain()
        if half_close:
            writer.write_eof()
        return await asyncio.wait_for(read_to_eof(reader), BOUND_S)
    finally:
        writer.close()


async def read_to_eof(reader: asyncio.StreamReader) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            data += chunk
    return data


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    raw_head: bytes = b""
    chunks: list[bytes] = field(default_factory=list)


def responses(data: bytes, head_only: int = 0) -> list[Response]:
    """The HTTP/1.1 responses in ``data``, in order (bodies by Content-Length or chunked
    framing; the first ``head_only`` have no body, as answers to HEAD)."""
    out: list[Response] = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"incomplete response head: {head[:200]!r}"
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.decode().lower()] = value.decode().strip()
        body = b""
        chunks: list[bytes] = []
        if len(out) < head_only or status in (100, 204, 304):
            pass
        elif headers.get("transfer-encoding") == "chunked":
            while True:
                size_line, _, data = data.partition(b"\r\n")
                size = int(size_line, 16)
                chunk, data = data[:size], data[size + 2 :]
                if not size:
                    break
                chunks.append(chunk)
            body = b"".join(chunks)
        else:
            size = int(headers.get("content-length", "0"))
            body, data = data[:size], data[size:]
        out.append(Response(status, headers, body, head, chunks))
    return out


def status_of(data: bytes) -> list[int]:
    return [r.status for r in responses(data)]
