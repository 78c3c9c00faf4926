"""The OTLP/HTTP exporter's transport against real TCP servers scripted byte by byte:
keep-alive reuse, a connection the server closed meanwhile, an oversized answer, a
server that never answers, and nothing listening."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.http_post import HttpPoster
from gym_sidecar.export.otlp_http import OtlpHttpExporter

from tests.sidecar.export.helpers import run
from tests.support.ports import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def read_request(conn: socket.socket) -> bytes | None:
    """One HTTP request with a Content-Length body; None when the peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


@contextmanager
def tcp_server(serve: Callable[[socket.socket, int], None]) -> Iterator[tuple[int, list[int]]]:
    """Accepts connections on a free port; ``serve(conn, index)`` handles each one.

    Yields (port, accepted) where ``accepted`` grows by one index per connection.
    """
    port = free_port()
    listener = socket.create_server(("127.0.0.1", port))
    accepted: list[int] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(len(accepted))
            threading.Thread(target=serve, args=(conn, accepted[-1]), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield port, accepted
    finally:
        listener.close()


def test_a_kept_alive_connection_is_reused() -> None:
    def serve(conn: socket.socket, _: int) -> None:
        with conn:
            while read_request(conn) is not None:
                conn.sendall(OK)

    with tcp_server(serve) as (port, accepted):
        poster = HttpPoster(f"http://127.0.0.1:{port}", timeout_s=5)
        for _ in range(3):
            assert poster.post("/v1/traces", b"x" * 1000, {}).status == 200
        poster.close()
    assert len(accepted) == 1


def test_a_connection_closed_by_the_server_while_idle_is_replaced_transparently() -> None:
    # The first connection answers once and closes without saying so (no
    # "Connection: close"): the next request on it fails and is retried on a new one.
    def serve(conn: socket.socket, index: int) -> None:
        with conn:
            while read_request(conn) is not None:
                conn.sendall(OK)
                if index == 0:
                    return

    with tcp_server(serve) as (port, accepted):
        poster = HttpPoster(f"http://127.0.0.1:{port}", timeout_s=5)
        assert poster.post("/v1/traces", b"a", {}).status == 200
        time.sleep(0.1)  # let the server's close arrive
        assert poster.post("/v1/traces", b"b", {}).status == 200
        poster.close()
    assert len(accepted) == 2


def test_an_answer_past_the_limit_is_cut_and_its_connection_not_reused() -> None:
    big = b"e" * 5000

    def serve(conn: socket.socket, _: int) -> None:
        with conn:
            while read_request(conn) is not None:
                conn.sendall(b"HTTP/1.1 500 Oops\r\nContent-Length: 5000\r\n\r\n" + big)

    with tcp_server(serve) as (port, accepted):
        poster = HttpPoster(f"http://127.0.0.1:{port}", timeout_s=5, max_response_bytes=100)
        first = poster.post("/v1/traces", b"a", {})
        assert (first.status, first.body) == (500, b"e" * 100)
        poster.post("/v1/traces", b"b", {})
        poster.close()
    assert len(accepted) == 2


def test_a_server_that_never_answers_is_a_retryable_timeout_within_the_deadline() -> None:
    done = threading.Event()

    def serve(conn: socket.socket, _: int) -> None:
        with conn:
            read_request(conn)
            done.wait(120)  # answers nothing while the test runs

    with tcp_server(serve) as (port, _):
        exporter = OtlpHttpExporter(BackendConfig(url=f"http://127.0.0.1:{port}", timeout_s=0.5))

        async def body() -> None:
            started = time.monotonic()
            result = await exporter.export(Signal.TRACES, b"", 0)
            # The 0.5 s deadline, not the server, ended the call: the server would have
            # held it for minutes (the bound is far from both, for a loaded machine).
            assert time.monotonic() - started < 60
            assert result.outcome is Outcome.RETRYABLE
            assert "timed out after 0.5s" in result.message
            await exporter.close()

        try:
            run(body())
        finally:
            done.set()


def test_nothing_listening_is_retryable() -> None:
    exporter = OtlpHttpExporter(BackendConfig(url=f"http://127.0.0.1:{free_port()}"))

    async def body() -> None:
        result = await exporter.export(Signal.TRACES, b"", 0)
        assert result.outcome is Outcome.RETRYABLE
        assert "ConnectionRefusedError" in result.message
        await exporter.close()

    run(body())
