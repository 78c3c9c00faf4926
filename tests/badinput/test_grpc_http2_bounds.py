"""Every HTTP/2 bound of the gRPC receiver, against a real ``gym-sidecar`` process: one
test per bound, each sending what the bound is there for with a raw HTTP/2 client
(``tests/support/h2client.py``) and checking the refusal and its counter. Each would fail
without its bound: the connection would stay open (or be closed later, for another
reason, counted under another name).

The module's sidecar has small limits so that the bounds bite quickly: header timeout
1 s, message timeout 2 s, 4 streams per connection, 1 KiB of metadata (so 4 KiB for a
header block and for its decoded headers: ``Http2Bounds.hpack_factor``); the idle timeout
stays long (60 s), so that a connection closed within the tests' 5-second bound was
closed by the bound under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Iterator

import grpc
import hpack
import pytest
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter
from gym_sidecar.wire.http2.guard import ControlBudget

from testkit.otlp_samples import grpc_export, trace_request
from testkit.sink import RecordingSink
from testkit.wait import wait_for
from tests.support.h2client import H2Client, grpc_frame, raw_frame, request_headers
from tests.support.sidecar_proc import SidecarProcess

KiB = 1024
VALID = trace_request("bounds-valid", 2).SerializeToString()
LIMITS = {
    "http_header_timeout_s": 1,
    "grpc_message_timeout_s": 2,
    "grpc_idle_timeout_s": 60,
    "grpc_max_streams_per_connection": 4,
    "http_max_header_bytes": 1 * KiB,
    "close_linger_s": 1,
}
HEADER_BLOCK_BOUND = 4 * KiB  # hpack_factor x http_max_header_bytes
ENHANCE_YOUR_CALM = 0xB
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = (
    0x0,
    0x1,
    0x2,
    0x3,
    0x4,
    0x6,
    0x8,
    0x9,
)
END_STREAM, END_HEADERS = 0x1, 0x4


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    with SidecarProcess(backend=sink.endpoint, config={"limits": LIMITS}) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()[-3000:]


def refusals(sc: SidecarProcess, reason: str) -> float:
    return sc.metric("gym_sidecar_http2_refusals_total", reason=reason)


def limit_hits(sc: SidecarProcess, limit: str) -> float:
    return sc.metric("gym_sidecar_limit_hits_total", limit=limit)


def handshake(client: H2Client) -> None:
    """Read until the server's SETTINGS arrived (the connection is established)."""
    assert client.read_until(lambda: bool(client.remote_settings)), "no SETTINGS from server"


def header_block(headers: list[tuple[str, str]]) -> bytes:
    return hpack.Encoder().encode(headers)


def assert_still_serving(sc: SidecarProcess, sink: RecordingSink, tag: str) -> None:
    grpc_export(sc.grpc_endpoint, "traces", trace_request(tag, 1))
    assert sink.wait_for(lambda: f"{tag}-0" in {s.span.name for s in sink.spans()}, 30)


def assert_answers(client: H2Client) -> None:
    """A second client, connected before the abuse, still gets its call answered OK
    (the receiver stayed responsive while it refused the abuser)."""
    stream_id = client.start(request_headers())
    client.send(stream_id, grpc_frame(VALID))
    out = client.wait(stream_id)
    assert out.grpc_status == 0, out


def assert_goaway(client: H2Client, code: int) -> None:
    """The GOAWAY arrived before the close (not lost to a TCP reset), with ``code``."""
    assert client.wait_closed(), "the connection stayed open"
    assert client.goaway is not None, "closed without a GOAWAY reaching the client"
    assert client.goaway.error_code == code, client.goaway


# -- time ------------------------------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", b"PRI * HTTP/2.0\r\n"], ids=["nothing", "half a preface"])
def test_a_slow_preface_is_closed_by_the_header_timeout(
    sidecar: SidecarProcess, sent: bytes
) -> None:
    before = limit_hits(sidecar, "http_header_timeout_s")
    with H2Client(sidecar.grpc_port, preface=False) as client:
        client.send_raw(sent)
        assert client.wait_closed(), "still open past http_header_timeout_s"
    assert limit_hits(sidecar, "http_header_timeout_s") == before + 1


def test_a_header_block_left_open_is_closed_by_the_header_timeout(
    sidecar: SidecarProcess,
) -> None:
    """HEADERS without END_HEADERS and no CONTINUATION: the block is timed, not the
    preface (which arrived) nor the idle connection (60 s)."""
    before = limit_hits(sidecar, "http_header_timeout_s")
    with H2Client(sidecar.grpc_port) as client:
        handshake(client)
        block = header_block(request_headers())
        client.send_raw(raw_frame(HEADERS, 0, 1, block[:10]))
        assert client.wait_closed(), "still open past http_header_timeout_s"
    assert limit_hits(sidecar, "http_header_timeout_s") == before + 1


# -- frames ----------------------------------------------------------------------------


def test_a_frame_larger_than_advertised_is_refused_before_its_body(
    sidecar: SidecarProcess,
) -> None:
    """A DATA frame header announcing SETTINGS_MAX_FRAME_SIZE + 1 bytes, then a little of
    its body: refused on the header (h2 alone would wait for the whole 1 MiB first)."""
    before = refusals(sidecar, "frame_too_large")
    with H2Client(sidecar.grpc_port) as client, H2Client(sidecar.grpc_port) as other:
        handshake(client)
        limit = client.remote_settings[0x5]  # SETTINGS_MAX_FRAME_SIZE
        client.send_raw(raw_frame(DATA, 0, 1, b"x" * 100, length=limit + 1))
        assert_goaway(client, FRAME_SIZE_ERROR)  # RFC 9113, 4.2
        assert_answers(other)
    assert refusals(sidecar, "frame_too_large") == before + 1


def test_a_client_that_stays_after_its_goaway_is_cut_off_and_counted(
    sidecar: SidecarProcess,
) -> None:
    """After a refusal the receiver shuts its write side and drains; a client that keeps
    its side open is dropped after ``limits.close_linger_s`` (1 s here), counted."""
    before = limit_hits(sidecar, "close_linger_s")
    with H2Client(sidecar.grpc_port) as client:
        handshake(client)
        client.send_raw(raw_frame(DATA, 0, 1, b"x", length=client.remote_settings[0x5] + 1))
        assert_goaway(client, FRAME_SIZE_ERROR)
        assert wait_for(lambda: limit_hits(sidecar, "close_linger_s") == before + 1, 30)


@pytest.mark.parametrize(
    ("piece_bytes", "pieces"),
    [(HEADER_BLOCK_BOUND // 2 + 1, 2), (16 * KiB, 64)],
    ids=["just over the bound", "a 1 MiB header list"],
)
def test_a_header_block_larger_than_the_bound_is_refused(
    sidecar: SidecarProcess, piece_bytes: int, pieces: int
) -> None:
    """HEADERS and CONTINUATION frames adding up to more than 4 x the metadata limit on
    the wire (the CONTINUATION flood; or a 1 MiB header list in 16 KiB frames): refused
    as the block grows, not when it ends. The call is answered RESOURCE_EXHAUSTED, then
    GOAWAY(ENHANCE_YOUR_CALM), both delivered; another client is still answered."""
    before = refusals(sidecar, "header_block_too_large")
    with H2Client(sidecar.grpc_port) as client, H2Client(sidecar.grpc_port) as other:
        handshake(client)
        # The client's h2 opens stream 1 (so that it can read the answer on it); its own
        # HEADERS are dropped, the raw frames below go instead.
        client.conn.send_headers(client.conn.get_next_available_stream_id(), request_headers())
        client.conn.take()
        block = header_block(request_headers())
        piece = b"\x00" * piece_bytes
        frames = raw_frame(HEADERS, 0, 1, block) + raw_frame(CONTINUATION, 0, 1, piece) * pieces
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            client.send_raw(frames)  # the answer and the GOAWAY must arrive all the same
        assert client.read_until(lambda: client.closed or client.goaway is not None)
        assert client.goaway is not None, "closed without a GOAWAY reaching the client"
        assert client.goaway.error_code == ENHANCE_YOUR_CALM
        assert client.outcome(1).grpc_status == 8, client.outcome(1)  # RESOURCE_EXHAUSTED
        assert_answers(other)
    assert refusals(sidecar, "header_block_too_large") == before + 1


def test_an_hpack_bomb_is_refused_while_decoding(sidecar: SidecarProcess) -> None:
    """~1 KiB on the wire (one 1000-byte header indexed, then referenced 19 times)
    decoding to ~20 KiB: over 4 x the metadata limit, so decoding stops and the
    connection is refused (h2's own default would have decoded up to 64 KiB)."""
    before = refusals(sidecar, "header_list_too_large")
    block = header_block(request_headers() + [("x-bomb", "b" * 1000)] * 20)
    assert len(block) < HEADER_BLOCK_BOUND // 2
    with H2Client(sidecar.grpc_port) as client, H2Client(sidecar.grpc_port) as other:
        handshake(client)
        client.send_raw(raw_frame(HEADERS, END_HEADERS, 1, block))
        assert_goaway(client, ENHANCE_YOUR_CALM)
        assert_answers(other)
    assert refusals(sidecar, "header_list_too_large") == before + 1


def test_metadata_between_the_limit_and_the_bound_refuses_only_the_call(
    sidecar: SidecarProcess,
) -> None:
    """2 KiB of metadata (limit 1 KiB, bound 4 KiB): RESOURCE_EXHAUSTED without RetryInfo
    on that stream, counted; the connection carries the next call."""
    before = limit_hits(sidecar, "http_max_header_bytes")
    with H2Client(sidecar.grpc_port) as client:
        big = client.start(request_headers(x_pad_a="p" * 1000, x_pad_b="p" * 1000))
        client.send(big, grpc_frame(VALID))
        out = client.wait(big)
        assert out.grpc_status == 8, out  # RESOURCE_EXHAUSTED
        assert "google.rpc.retryinfo-bin" not in out.headers
        ok = client.start(request_headers())
        client.send(ok, grpc_frame(VALID))
        assert client.wait(ok).grpc_status == 0
    assert limit_hits(sidecar, "http_max_header_bytes") == before + 1


# -- floods ----------------------------------------------------------------------------

FLOOD = 300  # frames: more than ControlBudget.burst (256)
assert ControlBudget().burst < FLOOD


def _flood_frames(kind: str) -> bytes:
    if kind == "PING":
        return raw_frame(PING, 0, 0, b"\x00" * 8) * FLOOD
    if kind == "SETTINGS":
        return raw_frame(SETTINGS, 0, 0, b"") * FLOOD
    if kind == "WINDOW_UPDATE":
        return raw_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * FLOOD
    if kind == "PRIORITY":
        return b"".join(
            raw_frame(PRIORITY, 0, 2 * i + 1, struct.pack(">IB", 0, 15)) for i in range(FLOOD)
        )
    if kind == "unknown frame type":
        return raw_frame(0xFA, 0, 0, b"x") * FLOOD
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "PING",
        "SETTINGS",
        "WINDOW_UPDATE",
        "PRIORITY",
        "unknown frame type",
        "empty DATA",
        "rapid reset",
    ],
)
def test_control_frame_floods_end_the_connection(sidecar: SidecarProcess, kind: str) -> None:
    """300 control frames at once: GOAWAY(ENHANCE_YOUR_CALM) and closed, counted. Rapid
    reset is HEADERS then RST_STREAM, 150 times (CVE-2023-44487); empty DATA frames
    without END_STREAM on an open call cost as much as control frames."""
    before = refusals(sidecar, "control_frame_flood")
    with H2Client(sidecar.grpc_port) as client, H2Client(sidecar.grpc_port) as other:
        handshake(client)
        try:
            if kind == "rapid reset":
                for _ in range(FLOOD // 2):
                    stream_id = client.conn.get_next_available_stream_id()
                    client.conn.send_headers(stream_id, request_headers())
                    client.conn.reset_stream(stream_id)
                client.flush()
            elif kind == "empty DATA":
                stream_id = client.start(request_headers())
                client.send_raw(raw_frame(DATA, 0, stream_id, b"") * FLOOD)
            else:
                client.send_raw(_flood_frames(kind))
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: what the test waits for
        assert client.wait_closed(), "the flood was served"
        assert client.goaway is not None, "closed without a GOAWAY reaching the client"
        assert client.goaway.error_code == ENHANCE_YOUR_CALM, client.goaway
        assert_answers(other)
    assert refusals(sidecar, "control_frame_flood") == before + 1


def test_well_behaved_clients_never_run_out_of_control_budget(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    """600 calls each from grpcio on one channel and from the sidecar's own h2 exporter
    on one connection (its 5-byte prefix is a small DATA frame of its own): every call
    answered OK, no connection refused."""
    before = refusals(sidecar, "control_frame_flood")
    with grpc.insecure_channel(sidecar.grpc_endpoint) as channel:
        call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        for _ in range(600):
            call(VALID, timeout=10)

    async def h2_exports() -> None:
        exporter = GrpcH2Exporter(BackendConfig(url=f"http://{sidecar.grpc_endpoint}"))
        try:
            for _ in range(600):
                result = await exporter.export(Signal.TRACES, VALID, 2)
                assert result.outcome is Outcome.SUCCESS, result
        finally:
            await exporter.close()

    asyncio.run(h2_exports())
    assert refusals(sidecar, "control_frame_flood") == before
    assert_still_serving(sidecar, sink, "budget-after")


# -- streams ---------------------------------------------------------------------------


def test_a_stream_past_the_per_connection_cap_is_refused_and_the_connection_kept(
    sidecar: SidecarProcess,
) -> None:
    """5 calls opened at once where SETTINGS_MAX_CONCURRENT_STREAMS is 4 (sent before the
    server's SETTINGS were read, as a client that ignores them would): the fifth stream
    is reset REFUSED_STREAM (clients retry it), counted; the four are served."""
    before = limit_hits(sidecar, "grpc_max_streams_per_connection")
    with H2Client(sidecar.grpc_port) as client:
        streams = [client.start(request_headers()) for _ in range(5)]
        refused = client.wait(streams[4])
        assert refused.reset == REFUSED_STREAM, refused
        assert client.remote_settings[0x3] == 4  # SETTINGS_MAX_CONCURRENT_STREAMS
        for stream_id in streams[:4]:
            client.send(stream_id, grpc_frame(VALID))
        for stream_id in streams[:4]:
            assert client.wait(stream_id).grpc_status == 0
        again = client.start(request_headers())
        client.send(again, grpc_frame(VALID))
        assert client.wait(again).grpc_status == 0
    assert limit_hits(sidecar, "grpc_max_streams_per_connection") == before + 1


def test_an_answer_stalled_by_a_zero_window_is_reset(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    """A client that opens no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE 0) for the
    answer: the data is accepted, the answer's DATA cannot be sent, and after
    grpc_message_timeout_s (2 s) the stream is reset CANCEL, counted, not kept for ever."""
    before = refusals(sidecar, "response_stalled")
    tag = "stalled-answer"
    with H2Client(sidecar.grpc_port, settings={0x4: 0}) as client:  # INITIAL_WINDOW_SIZE
        stream_id = client.start(request_headers())
        client.send(stream_id, grpc_frame(trace_request(tag, 1).SerializeToString()))
        out = client.wait(stream_id, bound_s=10)
        assert out.reset == CANCEL, out
        assert out.headers.get(":status") == "200" and out.data == b"", out
    assert refusals(sidecar, "response_stalled") == before + 1
    assert sink.wait_for(lambda: f"{tag}-0" in {s.span.name for s in sink.spans()}, 30)


# -- connections -----------------------------------------------------------------------


def test_connections_past_the_cap_are_closed_before_anything_is_read() -> None:
    with SidecarProcess(config={"limits": {"grpc_max_connections": 2}}) as sc:
        first, second = H2Client(sc.grpc_port), H2Client(sc.grpc_port)
        handshake(first)
        handshake(second)
        with H2Client(sc.grpc_port) as third:
            assert third.wait_closed()
            assert not third.remote_settings, "the third connection was served"
        assert limit_hits(sc, "grpc_max_connections") == 1
        first.close()

        def fourth_served() -> bool:
            with H2Client(sc.grpc_port) as fourth:
                fourth.read_until(lambda: bool(fourth.remote_settings) or fourth.closed)
                return bool(fourth.remote_settings)

        assert wait_for(fourth_served, 30)
        second.close()
    assert sc.returncode == 0


def test_an_idle_connection_gets_goaway_but_not_while_a_call_is_in_progress() -> None:
    limits = {"grpc_idle_timeout_s": 1, "grpc_message_timeout_s": 10}
    with (
        RecordingSink() as sink,
        SidecarProcess(backend=sink.endpoint, config={"limits": limits}) as sc,
    ):
        with H2Client(sc.grpc_port) as client:
            stream_id = client.start(request_headers())
            client.send(stream_id, grpc_frame(VALID)[:10], end_stream=False)
            client.read_until(lambda: False, bound_s=2.5)  # > the idle timeout
            assert client.goaway is None and not client.closed
            client.send(stream_id, grpc_frame(VALID)[10:])
            assert client.wait(stream_id).grpc_status == 0
            assert client.wait_closed()
            assert client.goaway is not None and client.goaway.error_code == 0
            assert client.goaway.last_stream_id == stream_id
        assert limit_hits(sc, "grpc_idle_timeout_s") == 1
    assert sc.returncode == 0
