"""The HTTP/1.1 server under the receiver's body limits, its bounded read-ahead, its idle
clock and its graceful stop.

The body limits are the OTLP/HTTP receiver's own (``OtlpHttpApp``, served as in the
sidecar): a body over ``http_max_body_bytes`` is answered 413 and the connection stays
usable, whether the body is announced by ``Content-Length`` or chunked. The read-ahead
bound is checked on the protocol itself with a stand-in transport, which records exactly
when reading is paused and resumed (a real socket's kernel buffers would hide it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.stage import Batch, Stage
from gym_sidecar.receiver.http import OtlpHttpApp
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http1.protocol import HIGH_WATER_BYTES, HttpProtocol, ServerState

from testkit.otlp_samples import trace_request
from tests.sidecar.wire.http1.support import (
    BOUND_S,
    counted,
    exchange,
    limits,
    read_to_eof,
    responses,
    serving,
    status_of,
)

KiB = 1024
BODY = trace_request("wire.http1", 2).SerializeToString()
BODY_LIMIT = 4 * KiB


class Collect(Stage):
    """The pipeline's head: keeps every batch."""

    name = "collect"

    def __init__(self, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self.batches: list[Batch] = []

    async def consume(self, batch: Batch) -> None:
        self.batches.append(batch)


def otlp_post(body: bytes, *extra: bytes, length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        + b"".join(extra)
        + b"Content-Length: %d\r\n\r\n" % size
        + body
    )


def chunked_post(body: bytes, chunk: int, *extra: bytes) -> bytes:
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        + b"".join(extra)
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
        + b"0\r\n\r\n"
    )


def receiver() -> tuple[OtlpHttpApp, Collect, SelfMetrics]:
    metrics = SelfMetrics()
    head = Collect(metrics)
    app = OtlpHttpApp(head, LimitsConfig(http_max_body_bytes=BODY_LIMIT), metrics)
    return app, head, metrics


def run(scenario: Any) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


# -- request bodies over the receiver's limit -----------------------------------------------


def test_a_body_over_the_limit_by_content_length_is_413_and_the_connection_goes_on() -> None:
    """413 on the header alone; the client sends the body anyway, then another request on
    the same connection: the refused body is skipped, the next one accepted."""
    app, head, metrics = receiver()
    too_big = b"\x00" * (BODY_LIMIT + 1)

    async def scenario() -> None:
        async with serving(app) as listener:
            data = await exchange(
                listener.bound_port,
                otlp_post(too_big),
                otlp_post(BODY, b"Connection: close\r\n"),
                pause_s=0.1,
            )
        assert status_of(data) == [413, 200]
        assert len(head.batches) == 1
        assert counted_limit(metrics, "http_max_body_bytes") == 1

    run(scenario)


def test_a_chunked_body_over_the_limit_is_413() -> None:
    app, head, metrics = receiver()

    async def scenario() -> None:
        async with serving(app) as listener:
            data = await exchange(
                listener.bound_port,
                chunked_post(b"\x00" * (BODY_LIMIT * 2), 1000),
                chunked_post(BODY, 7, b"Connection: close\r\n"),
            )
        assert status_of(data) == [413, 200]
        assert len(head.batches) == 1
        assert counted_limit(metrics, "http_max_body_bytes") == 1

    run(scenario)


def counted_limit(metrics: SelfMetrics, key: str) -> float:
    return float(metrics.limit_hits.labels(key).value)


# -- the idle clock -------------------------------------------------------------------------


def test_the_rest_of_a_refused_body_does_not_keep_the_connection() -> None:
    """After the 413 the client trickles the refused body: no request is in progress, so
    the idle timeout closes the connection (it used to be held for as long as bytes came)."""
    app, _, _ = receiver()
    lim = limits(idle_timeout_s=0.5)

    async def scenario() -> None:
        async with serving(app, lim) as listener:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)
            writer.write(otlp_post(b"", length=BODY_LIMIT * 100))
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413"), head
            loop = asyncio.get_running_loop()
            deadline = loop.time() + BOUND_S
            try:
                while loop.time() < deadline and not reader.at_eof():
                    writer.write(b"\x00" * 10)
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    if reader._buffer or reader.at_eof():  # type: ignore[attr-defined]
                        break
            except ConnectionError:
                pass
            await asyncio.wait_for(read_to_eof(reader), BOUND_S)
            assert loop.time() < deadline, "still open"
            writer.close()
        assert counted(lim, "limit_hits", "http_idle_timeout_s") == 1

    run(scenario)


def test_bytes_that_begin_no_request_do_not_keep_a_connection() -> None:
    """Blank lines between keep-alive requests are skipped by the parser and begin no
    request: the idle timeout still closes the connection."""
    lim = limits(idle_timeout_s=0.5)

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 204, "headers": []},
        )
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        async with serving(ok, lim) as listener:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 204")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + BOUND_S
            try:
                while loop.time() < deadline and not reader.at_eof():
                    writer.write(b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    if reader._buffer or reader.at_eof():  # type: ignore[attr-defined]
                        break
            except ConnectionError:
                pass
            assert await asyncio.wait_for(read_to_eof(reader), BOUND_S) == b""
            assert loop.time() < deadline, "still open"
            writer.close()
        assert counted(lim, "limit_hits", "http_idle_timeout_s") == 1

    run(scenario)


def test_the_deadlines_follow_a_busy_connection() -> None:
    """Requests every 0.1 s for longer than both timeouts, one of them with its head sent
    in two halves: all answered on one connection (each deadline is the current one,
    never one left over from an earlier request); then, idle, the connection is closed
    and the idle timeout counted once."""
    lim = limits(idle_timeout_s=2.0, header_timeout_s=2.0)

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        async with serving(ok, lim) as listener:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)
            for i in range(50):
                if i == 25:
                    writer.write(b"GET /split HTTP/1.1\r\n")
                    await asyncio.sleep(1.0)
                    writer.write(b"Host: x\r\n\r\n")
                else:
                    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
                assert head.startswith(b"HTTP/1.1 204"), (i, head)
                await asyncio.sleep(0.1)
            assert await asyncio.wait_for(read_to_eof(reader), BOUND_S) == b""
            writer.close()
        assert counted(lim, "limit_hits", "http_idle_timeout_s") == 1
        assert counted(lim, "limit_hits", "http_header_timeout_s") == 0

    run(scenario)


# -- bounded read-ahead ---------------------------------------------------------------------


class StandInTransport(asyncio.Transport):
    """Records writes and whether reading is paused; ``close`` reports the loss."""

    def __init__(self, protocol: HttpProtocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.written = b""
        self.paused = False
        self.closed = False
        self.pauses = 0

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def connect(app: Any) -> tuple[HttpProtocol, StandInTransport]:
    protocol = HttpProtocol(app, limits(), ServerState(), asyncio.get_running_loop())
    transport = StandInTransport(protocol)
    protocol.connection_made(transport)
    return protocol, transport


def test_reading_pauses_while_a_body_waits_for_the_app_and_resumes_when_it_reads() -> None:
    """Fed 16 KiB at a time, as long as the transport reads: reading pauses once more
    than the high-water mark waits for an app that has not read, with at most one read
    past it, and resumes when the app asks for the body."""
    release = asyncio.Event()
    got: list[bytes] = []

    async def slow_reader(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        while True:
            message = await receive()
            got.append(message["body"])
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        protocol, transport = connect(slow_reader)
        size, piece = 1024 * KiB, 16 * KiB
        protocol.data_received(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        fed = 0
        while fed < size and not transport.paused:
            protocol.data_received(b"b" * piece)
            fed += piece
        assert transport.paused
        assert HIGH_WATER_BYTES < fed <= HIGH_WATER_BYTES + piece
        await asyncio.sleep(0.05)
        assert transport.paused  # the app has not asked yet
        release.set()
        while fed < size:
            await asyncio.sleep(0)
            if not transport.paused:
                protocol.data_received(b"b" * piece)
                fed += piece
        for _ in range(100):
            if transport.written:
                break
            await asyncio.sleep(0.01)
        assert b"".join(got) == b"b" * size
        assert transport.written.startswith(b"HTTP/1.1 204")
        assert transport.pauses >= 1

    run(scenario)


def test_reading_pauses_while_a_pipelined_request_waits() -> None:
    """A second request whose head is complete while the first is answered waits, and
    reading pauses until the first answer is complete; then it is served."""
    release = asyncio.Event()
    order: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        order.append(scope["path"])
        if scope["path"] == "/first":
            await release.wait()
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> None:
        protocol, transport = connect(app)
        protocol.data_received(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.01)
        assert not transport.paused
        protocol.data_received(b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.05)
        assert transport.paused
        assert order == ["/first"]
        release.set()
        for _ in range(100):
            if transport.written.count(b"HTTP/1.1 204") == 2:
                break
            await asyncio.sleep(0.01)
        assert order == ["/first", "/second"]
        assert not transport.paused
        assert transport.written.count(b"HTTP/1.1 204") == 2

    run(scenario)


# -- graceful stop ---------------------------------------------------------------------------


def test_stop_lets_a_running_request_finish_and_closes_idle_connections() -> None:
    """While ``stop`` waits: an idle keep-alive connection is closed at once, a request in
    progress is answered (with ``connection: close``) and its connection then closed."""
    started = asyncio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            started.set()
            await asyncio.sleep(0.3)
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    async def scenario() -> None:
        async with serving(slow) as listener:
            port = listener.bound_port
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
            idle_w.write(b"GET /quick HTTP/1.1\r\nHost: x\r\n\r\n")
            await idle_r.readuntil(b"ok")
            busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
            busy_w.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await started.wait()
            stopping = asyncio.ensure_future(listener.stop(BOUND_S))
            assert await asyncio.wait_for(read_to_eof(idle_r), BOUND_S) == b""
            answer = await asyncio.wait_for(read_to_eof(busy_r), BOUND_S)
            await asyncio.wait_for(stopping, BOUND_S)
            idle_w.close()
            busy_w.close()
        (response,) = responses(answer)
        assert (response.status, response.body) == (200, b"ok")
        assert response.headers["connection"] == "close"

    run(scenario)


def test_stop_cancels_a_request_still_running_after_the_grace_period() -> None:
    """Cancelled, answered 503 + ``Retry-After`` (it had not started a response) and
    closed; the listener no longer accepts connections."""
    cancelled = asyncio.Event()
    started = asyncio.Event()

    async def stuck(scope: Any, receive: Any, send: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def scenario() -> None:
        async with serving(stuck) as listener:
            reader, writer = await asyncio.open_connection("127.0.0.1", listener.bound_port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await started.wait()
            await asyncio.wait_for(listener.stop(0.2), BOUND_S)
            assert cancelled.is_set()
            answer = await asyncio.wait_for(read_to_eof(reader), BOUND_S)
            writer.close()
            try:
                await asyncio.open_connection("127.0.0.1", listener.bound_port)
            except OSError:
                pass
            else:
                raise AssertionError("still accepting after stop")
        (response,) = responses(answer)
        assert response.status == 503  # retryable for OTLP clients (uvicorn: 500)
        assert response.headers["retry-after"] == "1"
        assert response.headers["connection"] == "close"

    run(scenario)
