"""HTTP/1.1 request smuggling and framing probes against the sidecar's HTTP/1.1 server,
with uvicorn (h11, and httptools) as the anchor in the same run.

Each probe is a ``POST /probe`` whose framing is ambiguous or broken (Content-Length
with Transfer-Encoding, duplicated or malformed lengths, obfuscated Transfer-Encoding,
bad chunk sizes, bare LF/CR, obs-fold ...), and most carry a second request,
``GET /smuggled``, placed where one reading of the framing makes it a request of its own
and another makes it body. A server that serves ``/smuggled`` has been desynchronised:
behind a proxy that read the framing the other way, that request would be someone
else's. Every connection ends with ``GET /end`` and ``Connection: close``, so it closes
once the server has said what it will say.

Checked: the sidecar serves ``/smuggled`` for no probe, and refuses (does not serve
``/probe``) every probe that both uvicorn+h11 and uvicorn+httptools refuse. What the
anchors serve is printed, not asserted (it is theirs to change).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import pytest
import uvicorn

from tests.sidecar.wire.http1.support import exchange, limits, read_to_eof, serving
from tests.support.ports import free_port

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
END = b"GET /end HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
WAIT_S = 3.0
"""How long a probe's connection may stay open (a length no body will fill keeps every
server waiting for it); then the client closes it. A bound on waiting, not a check."""
HEAD = b"POST /probe HTTP/1.1\r\nHost: x\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _cl_te(te_line: bytes) -> bytes:
    """Content-Length covering ``0`` chunk + SMUGGLED, with ``te_line``: a server that
    takes the Transfer-Encoding as chunked ends the body at ``0`` and serves SMUGGLED."""
    body = b"0\r\n\r\n" + SMUGGLED
    return HEAD + b"Content-Length: %d\r\n" % len(body) + te_line + b"\r\n" + body


def _te_cl(cl_value: bytes) -> bytes:
    """Chunked body holding SMUGGLED, with a Content-Length that ends before it: a
    server that takes the length serves SMUGGLED as the next request."""
    size_line = b"%x\r\n" % len(SMUGGLED)
    body = size_line + SMUGGLED + b"\r\n0\r\n\r\n"
    return HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: " + cl_value + b"\r\n\r\n" + body


def _lengths(*values: bytes) -> bytes:
    """Content-Length lines with ``values``, then SMUGGLED as the body (a server that
    reads 0 serves it)."""
    lines = b"".join(b"Content-Length: " + v + b"\r\n" for v in values)
    return HEAD + lines + b"\r\n" + SMUGGLED


def _chunked(raw_body: bytes) -> bytes:
    return HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + raw_body + SMUGGLED


N = len(SMUGGLED)
PROBES: dict[str, bytes] = {
    # Content-Length and Transfer-Encoding together (RFC 9112 6.1: TE wins, or refuse).
    "CL.TE": _cl_te(b"Transfer-Encoding: chunked\r\n"),
    "TE.CL": _te_cl(b"4"),
    "TE.CL zero": _te_cl(b"0"),
    # Content-Length.
    "two equal lengths": _lengths(b"%d" % N, b"%d" % N),
    "two lengths, 0 first": _lengths(b"0", b"%d" % N),
    "two lengths, 0 last": _lengths(b"%d" % N, b"0"),
    "length list": _lengths(b"0, %d" % N),
    "length with plus": _lengths(b"+%d" % N),
    "length in hex": _lengths(b"0x%x" % N),
    "length with inner space": _lengths(b"%d %d" % (N // 10, N % 10)),
    "negative length": _lengths(b"-1"),
    "overflowing length": _lengths(b"99999999999999999999999"),
    "length with letters": _lengths(b"%da" % N),
    "space before colon": HEAD + b"Content-Length : 0\r\n\r\n" + SMUGGLED,
    "length folded": HEAD + b"Content-Length:\r\n %d\r\n\r\n" % N + SMUGGLED,
    # Transfer-Encoding obfuscated, with a Content-Length covering the rest.
    "TE xchunked": _cl_te(b"Transfer-Encoding: xchunked\r\n"),
    "TE space before colon": _cl_te(b"Transfer-Encoding : chunked\r\n"),
    "TE tab": _cl_te(b"Transfer-Encoding:\tchunked\r\n"),
    "TE chunked, identity": _cl_te(b"Transfer-Encoding: chunked, identity\r\n"),
    "TE identity, chunked": _cl_te(b"Transfer-Encoding: identity, chunked\r\n"),
    "TE twice": _cl_te(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n"),
    "TE upper case": _cl_te(b"Transfer-Encoding: CHUNKED\r\n"),
    "TE folded": _cl_te(b"Transfer-Encoding:\r\n chunked\r\n"),
    "TE vertical tab": _cl_te(b"Transfer-Encoding: \x0bchunked\r\n"),
    "TE NUL": _cl_te(b"Transfer-Encoding: chunked\x00\r\n"),
    "TE quoted": _cl_te(b'Transfer-Encoding: "chunked"\r\n'),
    "TE underscore name": _cl_te(b"Transfer_Encoding: chunked\r\n"),
    "TE on HTTP/1.0": _cl_te(b"Transfer-Encoding: chunked\r\n").replace(
        b"HTTP/1.1", b"HTTP/1.0", 1
    ),
    # Chunked framing.
    "negative chunk size": _chunked(b"-1\r\nx\r\n0\r\n\r\n"),
    "overflowing chunk size": _chunked(b"ffffffffffffffff1\r\nx\r\n0\r\n\r\n"),
    "chunk size with plus": _chunked(b"+1\r\nx\r\n0\r\n\r\n"),
    "chunk size with space": _chunked(b"1 \r\nx\r\n0\r\n\r\n"),
    "chunk extension with NUL": _chunked(b"1;\x00\r\nx\r\n0\r\n\r\n"),
    "chunk data without CRLF": _chunked(b"1\r\nxx0\r\n\r\n"),
    "chunk lines with bare LF": _chunked(b"1\nx\n0\n\n"),
    # Lines.
    "bare LF request": b"POST /probe HTTP/1.1\nHost: x\nContent-Length: 0\n\n" + SMUGGLED,
    "bare CR in a header": HEAD + b"X-A: a\rContent-Length: 0\r\n\r\n" + SMUGGLED,
    "bad HTTP version": b"POST /probe HTTP/1.1x\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Recorder:
    """An ASGI app that reads each request's body, answers 200 and records its path."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def sidecar_server(app: Recorder) -> AsyncIterator[int]:
    async with serving(app, limits(idle_timeout_s=2.0, header_timeout_s=2.0)) as listener:
        assert listener.bound_port is not None
        yield listener.bound_port


@contextlib.asynccontextmanager
async def uvicorn_server(app: Recorder, http: str) -> AsyncIterator[int]:
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        http=http,
        lifespan="off",
        log_level="critical",
        timeout_keep_alive=2,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            assert not task.done(), "uvicorn did not start"
            await asyncio.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def probe_all(make: Callable[[Recorder], Any]) -> dict[str, list[str]]:
    """``{probe: the paths the app was called with}`` on a server made by ``make``."""
    app = Recorder()
    seen: dict[str, list[str]] = {}
    async with make(app) as port:
        for name, data in PROBES.items():
            app.paths = []
            await send_probe(port, data + END)
            seen[name] = list(app.paths)
    return seen


async def send_probe(port: int, data: bytes) -> None:
    """Send ``data`` and read until the server closes, ``WAIT_S`` at most."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(read_to_eof(reader), WAIT_S)
    finally:
        writer.close()


def refused(paths: list[str]) -> bool:
    return "/probe" not in paths


def test_no_probe_smuggles_a_request_and_the_anchors_refusals_are_the_sidecars() -> None:
    async def main() -> tuple[dict[str, list[str]], ...]:
        return (
            await probe_all(sidecar_server),
            await probe_all(lambda app: uvicorn_server(app, "h11")),
            await probe_all(lambda app: uvicorn_server(app, "httptools")),
        )

    sidecar, h11, httptools = asyncio.run(main())
    assert len(PROBES) == 38
    smuggled = {name for name, paths in sidecar.items() if "/smuggled" in paths}
    assert smuggled == set()
    both_refuse = {name for name in PROBES if refused(h11[name]) and refused(httptools[name])}
    assert both_refuse, "the anchors refused nothing: the probes did not run"
    assert {name for name in both_refuse if not refused(sidecar[name])} == set()
    sidecar_refuses = {name for name in PROBES if refused(sidecar[name])}
    for label, seen in (("uvicorn+h11", h11), ("uvicorn+httptools", httptools)):
        served = sorted(name for name, paths in seen.items() if "/smuggled" in paths)
        print(f"{label}: serves /smuggled for {served}")
    print(
        f"sidecar: refuses {len(sidecar_refuses)}/{len(PROBES)}, including the "
        f"{len(both_refuse)} both anchors refuse; serves /smuggled for none"
    )


@pytest.mark.parametrize("name", ["CL.TE", "TE.CL", "two lengths, 0 first"])
def test_the_classic_desyncs_are_refused_with_400(name: str) -> None:
    """The three classic desyncs get a 400, not a silent close (the answer reaches the
    client before the close: the lingering close, not a reset)."""

    async def main() -> bytes:
        async with sidecar_server(Recorder()) as port:
            return await exchange(port, PROBES[name] + END)

    answer = asyncio.run(main())
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
