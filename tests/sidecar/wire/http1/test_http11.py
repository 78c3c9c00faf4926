"""HTTP/1.1 as the sidecar's listeners serve it, over real sockets: what uvicorn did for
them before :mod:`gym_sidecar.wire.http1` (pipelining, keep-alive and close, chunked
bodies, 100-continue, HEAD, 400 on bad requests, 500 when an app raises), and the one
thing it does differently on purpose (a client that half-closes gets its answers).

Each test serves a small ASGI app in the test's own event loop and talks to it with raw
bytes, so every byte on the wire is the test's choice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.sidecar.wire.http1.support import (
    exchange,
    limits,
    responses,
    serving,
    status_of,
)

Scope = dict[str, Any]


class Echo:
    """Reads the whole body, answers ``<method> <path> <body length>``; records every
    scope and how many of its requests ran at once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.scopes: list[Scope] = []
        self.bodies: list[bytes] = []
        self.events: list[str] = []
        self.delay_s = delay_s
        self.running = 0
        self.most_at_once = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            self.scopes.append(scope)
            body = b""
            while True:
                message = await receive()
                self.events.append(message["type"])
                if message["type"] == "http.disconnect":
                    return
                body += message["body"]
                if not message["more_body"]:
                    break
            self.bodies.append(body)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            out = f"{scope['method']} {scope['path']} {len(body)}".encode()
            headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(out))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": out})
        finally:
            self.running -= 1


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n".encode()
        + b"".join(extra)
        + b"\r\n"
        + body
    )


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


# -- keep-alive, pipelining, close ----------------------------------------------------------


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    """Three requests in one write, the first answered slowly: three answers in request
    order on one connection, and the app never ran two of them at once."""
    app = Echo(delay_s=0.2)

    async def scenario() -> None:
        async with serving(app) as listener:
            data = await exchange(
                listener.bound_port,
                post("/a", b"1") + post("/b", b"22") + post("/c", b"333", b"Connection: close\r\n"),
            )
        got = responses(data)
        assert [r.body for r in got] == [b"POST /a 1", b"POST /b 2", b"POST /c 3"]
        assert "connection" not in got[0].headers
        assert got[2].headers["connection"] == "close"
        assert app.most_at_once == 1

    run(scenario)


def test_keep_alive_serves_requests_sent_one_after_another() -> None:
    app = Echo()

    async def scenario() -> None:
        async with serving(app) as listener:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)
            for i in range(3):
                writer.write(post(f"/{i}", b"x" * i))
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK"), head
                await reader.readexactly(len(f"POST /{i} {i}"))
            writer.close()
        assert len({scope["client"] for scope in app.scopes}) == 1  # one connection

    run(scenario)


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /v HTTP/1.0\r\n\r\n",
        b"GET /v HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ],
    ids=["HTTP/1.0", "Connection: close"],
)
def test_connection_closes_after_the_response(request_head: bytes) -> None:
    """The answer says ``connection: close`` and the server closes; whatever the client
    sent after a ``Connection: close`` request is ignored (uvicorn's leniency)."""

    async def scenario() -> None:
        async with serving(Echo()) as listener:
            data = await exchange(listener.bound_port, request_head + b"GET /ignored HTTP/1.1\r\n")
        (answer,) = responses(data)
        assert answer.status == 200
        assert answer.headers["connection"] == "close"

    run(scenario)


# -- request bodies -------------------------------------------------------------------------


def test_chunked_request_body_across_writes() -> None:
    """A chunked body sent a few bytes at a time (chunk sizes in hex, an extension, a
    trailer) reaches the app whole, and the connection serves the next request."""
    app = Echo()
    parts = [
        b"POST /chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"5\r\nhello\r\n",
        b"1A;ext=1\r\n" + b"z" * 26 + b"\r\n",
        b"0\r\nX-Trailer: t\r\n\r\n",
        post("/next", b"", b"Connection: close\r\n"),
    ]

    async def scenario() -> None:
        async with serving(app) as listener:
            data = await exchange(listener.bound_port, *parts, pause_s=0.05)
        assert [r.body for r in responses(data)] == [b"POST /chunks 31", b"POST /next 0"]
        assert app.bodies[0] == b"hello" + b"z" * 26

    run(scenario)


def test_a_body_in_one_read_reaches_the_app_in_one_message() -> None:
    app = Echo()

    async def scenario() -> None:
        async with serving(app) as listener:
            await exchange(listener.bound_port, post("/one", b"b" * 1000, b"Connection: close\r\n"))
        assert app.events == ["http.request"]
        assert app.bodies == [b"b" * 1000]

    run(scenario)


def test_expect_100_continue_is_answered_when_the_app_asks_for_the_body() -> None:
    """The client sends headers only and waits: ``100 Continue`` comes once the app
    reads, then the body is sent and answered."""
    app = Echo()

    async def scenario() -> None:
        async with serving(app) as listener:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)
            writer.write(
                b"POST /c HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n"
                b"Connection: close\r\n\r\n"
            )
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"body")
            data = await asyncio.wait_for(reader.read(), 10)
            writer.close()
        (answer,) = responses(data)
        assert (answer.status, answer.body) == (200, b"POST /c 4")

    run(scenario)


def test_expect_100_continue_gets_no_interim_answer_when_the_app_answers_first() -> None:
    """An app that refuses on the headers alone (as the receiver does with 413 on
    ``Content-Length``) never asks for the body: no ``100 Continue``, only its answer."""

    async def refuse(scope: Scope, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]}
        )
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        async with serving(refuse) as listener:
            data = await exchange(
                listener.bound_port,
                b"POST /c HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 99\r\n"
                b"Connection: close\r\n\r\n",
            )
        assert status_of(data) == [413]

    run(scenario)


# -- responses ------------------------------------------------------------------------------


def test_head_gets_the_head_without_the_body() -> None:
    async def scenario() -> None:
        async with serving(Echo()) as listener:
            data = await exchange(
                listener.bound_port,
                b"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /g HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            )
        head, get = responses(data, head_only=1)
        assert head.status == 200
        assert head.headers["content-length"] == str(len(b"HEAD /h 0"))
        assert head.body == b""
        assert get.body == b"GET /g 0"  # so the HEAD answer carried no body bytes

    run(scenario)


def test_a_response_without_length_is_chunked() -> None:
    async def streaming(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part1", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await send({"type": "http.response.body", "body": b"part2"})

    async def scenario() -> None:
        async with serving(streaming) as listener:
            data = await exchange(
                listener.bound_port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
        (answer,) = responses(data)
        assert answer.headers["transfer-encoding"] == "chunked"
        assert answer.chunks == [b"part1", b"part2"]

    run(scenario)


@pytest.mark.parametrize("when", ["before the response", "without a response"])
def test_an_app_that_fails_is_answered_500_without_a_traceback(when: str) -> None:
    async def broken(scope: Scope, receive: Any, send: Any) -> None:
        if when == "before the response":
            raise ValueError("secret detail of the bug")

    async def scenario() -> None:
        async with serving(broken) as listener:
            data = await exchange(listener.bound_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        (answer,) = responses(data)
        assert answer.status == 500
        assert answer.body == b"Internal Server Error"
        assert answer.headers["connection"] == "close"
        assert b"secret" not in data and b"Traceback" not in data

    run(scenario)


def test_an_app_that_raises_mid_response_has_its_connection_closed() -> None:
    async def broken(scope: Scope, receive: Any, send: Any) -> None:
        headers = [(b"content-length", b"10")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"12345", "more_body": True})
        raise ValueError("secret detail of the bug")

    async def scenario() -> None:
        async with serving(broken) as listener:
            data = await exchange(listener.bound_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert data.endswith(b"\r\n\r\n12345")  # then closed, nothing more
        assert b"secret" not in data

    run(scenario)


def test_the_scope_is_uvicorns() -> None:
    """Path percent-decoded, raw path and query as sent, header names lower-cased, the
    socket's addresses; a forwarded-for header from loopback changes nothing."""
    app = Echo()

    async def scenario() -> None:
        async with serving(app) as listener:
            await exchange(
                listener.bound_port,
                b"GET /a%20b/c?x=1&y=%20 HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.9.9.9\r\n"
                b"X-Forwarded-Proto: https\r\nConnection: close\r\n\r\n",
            )
            port = listener.bound_port
        (scope,) = app.scopes
        assert scope["type"] == "http"
        assert scope["method"] == "GET"
        assert scope["http_version"] == "1.1"
        assert scope["path"] == "/a b/c"
        assert scope["raw_path"] == b"/a%20b/c"
        assert scope["query_string"] == b"x=1&y=%20"
        assert scope["root_path"] == ""
        assert scope["scheme"] == "http"
        assert scope["server"] == ("127.0.0.1", port)
        assert scope["client"][0] == "127.0.0.1"
        assert (b"x-forwarded-for", b"10.9.9.9") in scope["headers"]
        assert scope["asgi"]["version"] == "3.0"

    run(scenario)


# -- bad requests -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /x HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /x HTTP/1.1\r\nBad Header\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nhello\r\n",
        b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
    ids=["request line", "version", "header line", "chunk size", "non-ASCII path"],
)
def test_malformed_request_is_answered_400_closed_and_counted(request_bytes: bytes) -> None:
    app = Echo()
    lim = limits(transport="admin")

    async def scenario() -> None:
        async with serving(app, lim) as listener:
            data = await exchange(listener.bound_port, request_bytes)
            # the listener keeps serving
            ok = await exchange(
                listener.bound_port, b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
        (answer,) = responses(data)
        assert (answer.status, answer.body) == (400, b"Invalid HTTP request received.")
        assert answer.headers["connection"] == "close"
        assert status_of(ok) == [200]
        malformed = lim.metrics.bad_requests.labels("admin", "malformed").value
        assert malformed == 1

    run(scenario)


def test_a_malformed_request_after_a_good_one() -> None:
    """The good one is answered first when it is quick; the garbage then gets 400."""
    app = Echo()

    async def scenario() -> None:
        async with serving(app) as listener:
            data = await exchange(
                listener.bound_port, post("/ok", b"x"), b"NOT HTTP\r\n\r\n", pause_s=0.2
            )
        assert status_of(data) == [200, 400]

    run(scenario)


def test_an_upgrade_request_is_served_as_a_plain_request() -> None:
    async def scenario() -> None:
        async with serving(Echo()) as listener:
            data = await exchange(
                listener.bound_port,
                b"GET /u HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                half_close=True,
            )
        (answer,) = responses(data)
        assert (answer.status, answer.body) == (200, b"GET /u 0")

    run(scenario)


# -- half-close (the one difference from uvicorn) -------------------------------------------


def test_a_client_that_half_closes_gets_its_answers() -> None:
    """Complete requests then a half-close (``shutdown(SHUT_WR)``): each is answered, in
    order, and then the server closes. uvicorn closed at once and lost them."""
    app = Echo(delay_s=0.2)

    async def scenario() -> None:
        async with serving(app) as listener:
            data = await exchange(
                listener.bound_port, post("/1", b"a") + post("/2", b"bb"), half_close=True
            )
        assert [r.body for r in responses(data)] == [b"POST /1 1", b"POST /2 2"]

    run(scenario)


def test_a_request_incomplete_at_the_half_close_is_dropped() -> None:
    """Its body can never arrive: the app sees ``http.disconnect``, nothing is written,
    and the connection closes; a complete request before it is still answered."""
    app = Echo()

    async def scenario() -> None:
        async with serving(app) as listener:
            partial = b"POST /partial HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly some"
            alone = await exchange(listener.bound_port, partial, half_close=True)
            after = await exchange(listener.bound_port, post("/ok", b"x"), partial, half_close=True)
            await asyncio.sleep(0.1)
        assert alone == b""
        assert [r.body for r in responses(after)] == [b"POST /ok 1"]
        assert app.events.count("http.disconnect") == 2

    run(scenario)
