"""Connection limits of the OTLP/HTTP and admin listeners, over real sockets.

Each limit is configured small (1 s timeouts, 8 KiB of headers, a few connections) and
each test asserts that the sidecar answers or closes well before a generous bound (10x
the configured value), never on tight latencies; then that it still serves and that the
limit was counted in ``gym_sidecar_limit_hits_total``. A second sidecar with a 1 KiB
header cap checks that request bodies, pipelined or not, never count as header bytes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from testkit.otlp_samples import http_post, trace_request
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

KiB = 1024
MiB = 1024 * KiB
TIMEOUT_S = 1.0
BOUND_S = 10 * TIMEOUT_S
"""How long a test waits for the sidecar to act on a 1 s limit."""
MAX_HEADER_BYTES = 8 * KiB
LIMITS = {
    "http_header_timeout_s": TIMEOUT_S,
    "http_idle_timeout_s": TIMEOUT_S,
    "admin_body_timeout_s": TIMEOUT_S,
    "http_max_header_bytes": MAX_HEADER_BYTES,
}
TOKEN = "listener-limits-token"
BODY = trace_request("limits", 2).SerializeToString()


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    config = {"limits": LIMITS, "span_groups": {"token": TOKEN}}
    with SidecarProcess(backend=sink.endpoint, config=config) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()[-3000:]


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(BOUND_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as
    closed); fails the test if it is still open after ``BOUND_S``."""
    data = b""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        except TimeoutError:
            break
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"connection still open after {BOUND_S}s; got {data[:200]!r}")


def assert_serving(sc: SidecarProcess) -> None:
    assert sc.proc is not None and sc.proc.poll() is None, "sidecar died"
    assert http_post(sc.http_url, "traces", BODY).status_code == 200
    assert sc.admin_get("/healthz")[0] == 200


def ports(sc: SidecarProcess) -> list[int]:
    return [sc.http_port, sc.admin_port]


def test_idle_connection_closed(sidecar: SidecarProcess) -> None:
    """A connection that never sends a request is closed after the idle timeout."""
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_idle_timeout_s")
    for port in ports(sidecar):
        with connect(port) as sock:
            assert read_until_closed(sock) == b""
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_idle_timeout_s")
    assert after - before >= 2
    assert_serving(sidecar)


def test_idle_keep_alive_connection_closed(sidecar: SidecarProcess) -> None:
    """After a response, an idle keep-alive connection is closed too."""
    with connect(sidecar.http_port) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
            + BODY
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_slow_headers_answered_408(sidecar: SidecarProcess) -> None:
    """Headers trickled one byte every 0.2 s: 408 and closed after the header timeout,
    although bytes keep arriving (so the idle timeout alone would never fire)."""
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_header_timeout_s")
    for port, path in ((sidecar.http_port, b"/v1/traces"), (sidecar.admin_port, b"/healthz")):
        with connect(port) as sock:
            sock.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n")
            answer = b""
            deadline = time.monotonic() + BOUND_S
            try:
                while time.monotonic() < deadline:
                    sock.sendall(b"X")
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                pass
            with contextlib.suppress(OSError):
                answer = read_until_closed(sock)
            assert time.monotonic() < deadline, "still sending after the bound"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_header_timeout_s")
    assert after - before == 2
    assert_serving(sidecar)


def test_slow_headers_answer_is_408_with_a_message(sidecar: SidecarProcess) -> None:
    with connect(sidecar.http_port) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"headers not received within 1.0s" in answer


@pytest.mark.parametrize(
    "head",
    [
        b"X-Big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n\r\n",
        b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(200)) + b"\r\n",
        b"/" + b"u" * (MAX_HEADER_BYTES + 1),
    ],
    ids=["one large header", "many headers", "long url"],
)
def test_oversized_headers_answered_431(sidecar: SidecarProcess, head: bytes) -> None:
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_max_header_bytes")
    for port in ports(sidecar):
        with connect(port) as sock:
            if head.startswith(b"/"):
                request = b"GET " + head + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            else:
                request = b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n" + head
            sock.sendall(request)
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="http_max_header_bytes")
    assert after - before == 2
    assert_serving(sidecar)


def test_huge_header_stream_is_cut_off(sidecar: SidecarProcess) -> None:
    """64 MiB of one header value: the sidecar stops reading after the limit (plus one
    socket read), so the sender is cut off long before it has sent it all."""
    sent = 0
    with connect(sidecar.http_port) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        chunk = b"h" * (64 * KiB)
        try:
            while sent < 64 * MiB:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
    assert sent < 64 * MiB, "the whole 64 MiB header was accepted"
    assert_serving(sidecar)


SMALL_HEADER_CAP = KiB
"""The smallest cap the config allows, for the tests that bodies are not header bytes."""
LARGE_BODY = trace_request("limits-large", 600).SerializeToString()
"""Over 64 KiB: a body 64x ``SMALL_HEADER_CAP``."""


@pytest.fixture(scope="module")
def small_cap_sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    """1 KiB of headers, and header/idle timeouts long enough that a test waiting for
    one response before sending the rest of the next request never meets them."""
    limits = {
        "http_max_header_bytes": SMALL_HEADER_CAP,
        "http_header_timeout_s": 60,
        "http_idle_timeout_s": 60,
    }
    with SidecarProcess(backend=sink.endpoint, config={"limits": limits}) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()[-3000:]


def post_head(body: bytes, *extra: bytes) -> bytes:
    return (
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
        + b"".join(extra)
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )


def statuses(answer: bytes) -> list[bytes]:
    """The status codes of the HTTP/1.1 responses in ``answer``."""
    return [line.split(b" ")[1] for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]


def header_limit_hits(sc: SidecarProcess) -> float:
    return sc.metric("gym_sidecar_limit_hits_total", limit="http_max_header_bytes")


def test_large_body_in_one_write_is_not_header_bytes(small_cap_sidecar: SidecarProcess) -> None:
    """Small headers and a body 64x the header cap in one write: 200, not 431."""
    sc = small_cap_sidecar
    assert len(LARGE_BODY) > 64 * SMALL_HEADER_CAP
    before = header_limit_hits(sc)
    with connect(sc.http_port) as sock:
        sock.sendall(post_head(LARGE_BODY, b"Connection: close\r\n") + LARGE_BODY)
        answer = read_until_closed(sock)
    assert statuses(answer) == [b"200"], answer[:300]
    assert header_limit_hits(sc) == before


def test_pipelined_requests_after_a_large_body_are_served(
    small_cap_sidecar: SidecarProcess,
) -> None:
    """Two pipelined requests in one write, the first with a body 64x the header cap:
    two 200s. Then the same with the second request's headers split across two writes
    (the second sent once the first response is in), so that a socket read surely ends
    inside them right after the first request's body: still two 200s."""
    sc = small_cap_sidecar
    before = header_limit_hits(sc)
    second = post_head(BODY, b"Connection: close\r\n")
    with connect(sc.http_port) as sock:
        sock.sendall(post_head(LARGE_BODY) + LARGE_BODY + second + BODY)
        answer = read_until_closed(sock)
    assert statuses(answer) == [b"200", b"200"], answer[:300]
    with connect(sc.http_port) as sock:
        sock.sendall(post_head(LARGE_BODY) + LARGE_BODY + second[:20])
        answer = b""
        while b"\r\n\r\n" not in answer:  # the first response's head
            chunk = sock.recv(65536)
            assert chunk, answer[:300]
            answer += chunk
        sock.sendall(second[20:] + BODY)
        answer += read_until_closed(sock)
    assert statuses(answer) == [b"200", b"200"], answer[:300]
    assert header_limit_hits(sc) == before
    assert_serving(sc)


def test_header_stream_after_a_pipelined_body_is_cut_off(
    small_cap_sidecar: SidecarProcess,
) -> None:
    """A header stream that begins in the same write as the previous request's large
    body is still refused and cut off, and counted: the read it begins in counts what
    the parser reported of it, every later read counts in full."""
    sc = small_cap_sidecar
    before = header_limit_hits(sc)
    sent = 0
    answer = b""
    with connect(sc.http_port) as sock:
        sock.sendall(
            post_head(LARGE_BODY) + LARGE_BODY + b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nX-Huge: "
        )
        chunk = b"h" * (64 * KiB)
        try:
            while sent < 64 * MiB:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        with contextlib.suppress(OSError, AssertionError):
            answer = read_until_closed(sock)
    assert sent < 64 * MiB, "the whole 64 MiB header was accepted"
    assert b"HTTP/1.1 5" not in answer, answer[:300]  # a reset may lose the 431 itself
    assert header_limit_hits(sc) - before == 1
    assert_serving(sc)


def test_admin_put_body_deadline_408(sidecar: SidecarProcess) -> None:
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="admin_body_timeout_s")
    with connect(sidecar.admin_port) as sock:
        sock.sendall(
            b"PUT /v1/span-groups HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100\r\n\r\n".encode()
            + b'{"modes": '
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"body not received within 1.0s" in answer
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="admin_body_timeout_s")
    assert after - before == 1
    assert_serving(sidecar)


def _hold(port: int, count: int) -> list[socket.socket]:
    """``count`` open connections with no request in flight, each one surely accepted
    (a request on it was answered)."""
    held = []
    for _ in range(count):
        sock = connect(port)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 ")
        held.append(sock)
    return held


def test_connection_caps_refuse_then_free_up(sink: RecordingSink) -> None:
    """Past the cap a new connection gets 503 and is closed at once, on both listeners,
    each with its own cap; closing one held connection frees a slot."""
    limits = {
        "http_max_connections": 4,
        "admin_max_connections": 3,
        # Long enough that held connections stay open during the test.
        "http_idle_timeout_s": 60,
        "http_header_timeout_s": 60,
    }
    with SidecarProcess(backend=sink.endpoint, config={"limits": limits}) as sc:
        for port, cap, key in (
            (sc.http_port, 4, "http_max_connections"),
            (sc.admin_port, 3, "admin_max_connections"),
        ):
            held = _hold(port, cap)
            with connect(port) as extra:
                answer = read_until_closed(extra)
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b"too many open connections" in answer
            held.pop().close()
            deadline = time.monotonic() + BOUND_S
            while time.monotonic() < deadline:  # until the server has seen the close
                with connect(port) as probe:
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    if not probe.recv(65536).startswith(b"HTTP/1.1 503"):
                        break
                time.sleep(0.05)
            else:
                raise AssertionError("no slot freed after closing a held connection")
            for sock in held:
                sock.close()
            # The admin listener has its own pool: counted apart.
            assert sc.metric("gym_sidecar_limit_hits_total", limit=key) >= 1
        assert sc.admin_get("/healthz")[0] == 200
    assert sc.returncode == 0


def test_many_slow_clients_do_not_starve_the_listener(sidecar: SidecarProcess) -> None:
    """200 connections that each send half a request line: all are closed by the header
    timeout, and a normal client is served while they are held and afterwards."""
    socks: list[socket.socket] = []
    for _ in range(200):
        sock = connect(sidecar.http_port)
        sock.sendall(b"POST /v1/tra")
        socks.append(sock)
    assert http_post(sidecar.http_url, "traces", BODY).status_code == 200
    closed = []

    def drain(sock: socket.socket) -> None:
        try:
            read_until_closed(sock)
            closed.append(sock)
        except (AssertionError, OSError):
            pass

    threads = [threading.Thread(target=drain, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S * 2)
    for sock in socks:
        sock.close()
    assert len(closed) == len(socks)
    assert_serving(sidecar)


def _head_at(size: int, body: bytes) -> bytes:
    """A POST head whose header bytes, as the listener counts them (the URL, plus each
    header's name and value and 4 for ``": "`` and CRLF), are exactly ``size``."""
    url = b"/v1/traces"
    headers = [
        (b"Host", b"x"),
        (b"Content-Type", b"application/x-protobuf"),
        (b"Connection", b"close"),
        (b"Content-Length", str(len(body)).encode()),
    ]
    used = len(url) + sum(len(n) + len(v) + 4 for n, v in headers) + len(b"X-Pad") + 4
    headers.append((b"X-Pad", b"p" * (size - used)))
    assert len(url) + sum(len(n) + len(v) + 4 for n, v in headers) == size
    return (
        b"POST " + url + b" HTTP/1.1\r\n" + b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    ) + b"\r\n"


@pytest.mark.parametrize(
    ("size", "status"),
    [(SMALL_HEADER_CAP, b"200"), (SMALL_HEADER_CAP + 1, b"431")],
    ids=["exactly the cap", "one byte over"],
)
def test_header_cap_at_its_exact_boundary(
    small_cap_sidecar: SidecarProcess, size: int, status: bytes
) -> None:
    """``http_max_header_bytes`` is the most allowed: a head of exactly that many bytes
    is served, one byte more is 431 (the head is one small write, so one socket read)."""
    sc = small_cap_sidecar
    before = header_limit_hits(sc)
    with connect(sc.http_port) as sock:
        sock.sendall(_head_at(size, BODY) + BODY)
        answer = read_until_closed(sock)
    assert statuses(answer) == [status], answer[:300]
    assert header_limit_hits(sc) - before == (status == b"431")
