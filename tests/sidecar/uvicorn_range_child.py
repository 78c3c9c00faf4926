"""Run inside a throw-away venv by test_uvicorn_range.py: serve a tiny ASGI app through
the sidecar's ``AsgiListener`` (uvicorn's ``HttpToolsProtocol`` subclassed with the
sidecar's limits) and check, over a real socket, that a request is served and that
headers over the limit are refused with 431 and counted. Prints one JSON line."""

from __future__ import annotations

import asyncio
import json
from importlib.metadata import version
from typing import Any

from gym_sidecar.asgi_listener import AsgiListener, ConnectionLimits
from gym_sidecar.selfmetrics import SelfMetrics


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def status_line(response: bytes) -> str:
    return response.split(b"\r\n", 1)[0].decode()


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 60)  # to EOF: both answers close
    writer.close()
    return data


async def main() -> dict[str, Any]:
    metrics = SelfMetrics()
    limits = ConnectionLimits(
        metrics=metrics,
        max_connections=8,
        max_header_bytes=1024,
        header_timeout_s=30.0,
        idle_timeout_s=30.0,
        max_connections_key="http_max_connections",
    )
    listener = AsgiListener(app, "127.0.0.1:0", "range", limits)
    await listener.start()
    try:
        port = listener.bound_port
        served = await exchange(port, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        big = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 4096 + b"\r\n\r\n"
        refused = await exchange(port, big)
    finally:
        await listener.stop(1.0)
    hits = metrics.limit_hits.labels("http_max_header_bytes").value
    return {
        "uvicorn": version("uvicorn"),
        "served": served.split(b"\r\n", 1)[0].decode()
        + " "
        + served.rsplit(b"\r\n", 1)[-1].decode(),
        "refused": status_line(refused),
        "header_limit_hits": hits,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
