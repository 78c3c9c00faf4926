"""Raw HTTP/2 transport garbage on the gRPC port of a real ``gym-sidecar`` process.

A real HTTP/2 client library (``h2``, ``tests/support/h2client.py``) speaks to the
receiver below the gRPC layer: unknown ``grpc-encoding``, a compressed flag with no
encoding, broken gzip, a length prefix longer than the body or than any limit, frames
out of sequence, a RST_STREAM in the middle of a message, a bad connection preface,
oversized metadata. Every case must end, well within 5 s, with a gRPC status, a reset
stream, a GOAWAY or a closed connection (``Outcome``); never a hang. Afterwards the
process is up, spans accepted before the garbage arrive intact, and a valid request
still succeeds and arrives (sent over the same h2 client and over grpc).
"""

from __future__ import annotations

import gzip
import struct
import time
from collections.abc import Iterator

import grpc
import pytest
from hyperframe.frame import DataFrame, HeadersFrame

from testkit.otlp_samples import grpc_export, trace_request
from testkit.sink import RecordingSink
from tests.support.h2client import (
    ANSWER_BOUND_S,
    H2Client,
    Outcome,
    grpc_frame,
    request_headers,
)
from tests.support.sidecar_proc import SidecarProcess

CANARY = trace_request("h2-canary", 5)
VALID = trace_request("h2-valid", 3).SerializeToString()


@pytest.fixture(scope="module")
def sidecar() -> Iterator[tuple[SidecarProcess, RecordingSink]]:
    with RecordingSink() as sink:
        # The canary waits in the queue while the garbage runs (the backend refuses it).
        sink.fail_next(1, grpc.StatusCode.UNAVAILABLE, retry_after_s=4)
        limits = {"grpc_message_timeout_s": 1, "grpc_idle_timeout_s": 1}
        with SidecarProcess(backend=sink.endpoint, config={"limits": limits}) as sc:
            grpc_export(sc.grpc_endpoint, "traces", CANARY)
            yield sc, sink
        assert sc.returncode == 0, sc.log_text()[-3000:]


def one_stream(
    port: int,
    headers: list[tuple[str, str]],
    body: bytes | None,
    *,
    end_stream: bool = True,
) -> Outcome:
    client = H2Client(port)
    try:
        stream_id = client.start(headers, end_stream=body is None)
        if body is not None:
            client.send(stream_id, body, end_stream=end_stream)
        return client.wait(stream_id)
    finally:
        client.close()


def assert_refused(out: Outcome) -> None:
    """A non-OK gRPC status, or the stream/connection ended without a gRPC OK."""
    assert out.grpc_status != 0, out


GZIPPED = gzip.compress(VALID)
CASES: dict[str, tuple[list[tuple[str, str]], bytes | None, set[int]]] = {
    # name: (headers, DATA payload (None: headers with END_STREAM only), gRPC codes that
    # are the right answer if the server answers with a status at all)
    "unknown grpc-encoding": (
        request_headers(grpc_encoding="snappy-x"),
        grpc_frame(VALID, compressed=True),
        {12, 13},  # UNIMPLEMENTED by the spec; grpc core says INTERNAL
    ),
    "compressed flag without grpc-encoding": (
        request_headers(),
        grpc_frame(VALID, compressed=True),
        {13},  # INTERNAL
    ),
    "broken gzip": (
        request_headers(grpc_encoding="gzip"),
        grpc_frame(GZIPPED[:20] + b"\xff" * 40, compressed=True),
        {3, 13},
    ),
    "gzip with the compressed flag off": (
        request_headers(grpc_encoding="gzip"),
        grpc_frame(GZIPPED),
        {3},  # the gzip bytes are parsed as protobuf: INVALID_ARGUMENT
    ),
    "length prefix longer than the body": (
        request_headers(),
        grpc_frame(VALID, length=len(VALID) + 1000),
        {3},  # the call ends without a whole message
    ),
    "length prefix of 4 GiB": (
        request_headers(),
        grpc_frame(VALID, length=0xFFFFFFFF),
        {8, 13},  # RESOURCE_EXHAUSTED
    ),
    "truncated length prefix": (request_headers(), b"\x00\x00\x00", {3}),
    "two messages on a unary call": (
        request_headers(),
        grpc_frame(VALID) * 2,
        {3},
    ),
    "headers only, no message": (request_headers(), None, {3}),
    "garbage message": (request_headers(), grpc_frame(b"\xff" * 100), {3}),
    "wrong content-type": (
        [(k, "application/json" if k == "content-type" else v) for k, v in request_headers()],
        grpc_frame(VALID),
        {0, 2, 3, 12, 13},  # grpc core does not check the content-type
    ),
    "GET instead of POST": (
        [(k, "GET" if k == ":method" else v) for k, v in request_headers()],
        grpc_frame(VALID),
        {2, 3, 12, 13},
    ),
    "unknown method path": (
        [(k, "/no.Such/Method" if k == ":path" else v) for k, v in request_headers()],
        grpc_frame(VALID),
        {12},
    ),
    "oversized metadata": (
        request_headers(**{f"x-pad-{i}": "p" * 1000 for i in range(128)}),
        grpc_frame(VALID),
        {8, 13},
    ),
    "invalid grpc-timeout": (
        request_headers(grpc_timeout="soon"),
        grpc_frame(VALID),
        {0, 3, 13},  # grpc ignores or refuses an unparsable timeout
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_grpc_transport_garbage(sidecar: tuple[SidecarProcess, RecordingSink], name: str) -> None:
    sc, _ = sidecar
    headers, body, codes = CASES[name]
    started = time.monotonic()
    out = one_stream(sc.grpc_port, headers, body)
    if 0 not in codes:
        assert_refused(out)
    if out.grpc_status is not None:
        assert out.grpc_status in codes, (name, out)
    assert time.monotonic() - started < ANSWER_BOUND_S
    assert sc.proc is not None and sc.proc.poll() is None, "sidecar died"


def test_rst_stream_mid_message(sidecar: tuple[SidecarProcess, RecordingSink]) -> None:
    """Half a message, then RST_STREAM: the call is dropped (nothing reaches the sink);
    the same connection then carries a valid call that is accepted."""
    sc, sink = sidecar
    client = H2Client(sc.grpc_port)
    try:
        half = trace_request("h2-reset", 2).SerializeToString()
        stream_id = client.start(request_headers())
        client.send(stream_id, grpc_frame(half)[: len(half) // 2], end_stream=False)
        client.conn.reset_stream(stream_id)
        client.flush()
        valid = client.start(request_headers())
        client.send(valid, grpc_frame(VALID))
        out = client.wait(valid)
        assert out.grpc_status == 0, out
    finally:
        client.close()
    assert sink.wait_for(lambda: "h2-valid-0" in {s.span.name for s in sink.spans()}, 30)
    assert "h2-reset-0" not in {s.span.name for s in sink.spans()}


def test_message_without_end_of_stream_times_out(
    sidecar: tuple[SidecarProcess, RecordingSink],
) -> None:
    """A whole message but the stream left open: DEADLINE_EXCEEDED after the configured
    1 s (``grpc_message_timeout_s``), counted; without the deadline the call would wait
    for the client for ever."""
    sc, _ = sidecar
    out = one_stream(sc.grpc_port, request_headers(), grpc_frame(VALID), end_stream=False)
    assert out.grpc_status == 4, out  # DEADLINE_EXCEEDED
    assert "not received within 1.0s" in out.grpc_message
    assert sc.metric("gym_sidecar_limit_hits_total", limit="grpc_message_timeout_s") >= 1


def test_refusals_are_counted(sidecar: tuple[SidecarProcess, RecordingSink]) -> None:
    sc, _ = sidecar
    one_stream(sc.grpc_port, request_headers(), None)
    one_stream(sc.grpc_port, request_headers(), grpc_frame(VALID) * 2)
    for reason in ("no_message", "many_messages"):
        count = sc.metric("gym_sidecar_bad_requests_total", transport="grpc", reason=reason)
        assert count >= 1, reason


def test_data_before_headers(sidecar: tuple[SidecarProcess, RecordingSink]) -> None:
    """A DATA frame on a stream that was never opened: grpc core ignores it, and the
    connection, with no call in progress, is closed by the idle timeout (1 s here)."""
    sc, _ = sidecar
    client = H2Client(sc.grpc_port)
    try:
        client.send_raw(DataFrame(1, data=grpc_frame(VALID)).serialize())
        out = client.wait(1)
        assert out.goaway is not None or out.closed or out.reset is not None, out
    finally:
        client.close()


def test_headers_frame_with_garbage_hpack(sidecar: tuple[SidecarProcess, RecordingSink]) -> None:
    sc, _ = sidecar
    client = H2Client(sc.grpc_port)
    try:
        frame = HeadersFrame(1, data=b"\xff" * 64)
        frame.flags.add("END_HEADERS")
        client.send_raw(frame.serialize())
        out = client.wait(1)
        assert out.goaway is not None or out.closed or out.reset is not None, out
    finally:
        client.close()


@pytest.mark.parametrize(
    "raw",
    [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"],
    ids=["http/1.1", "zeros", "bad preface"],
)
def test_bad_connection_preface(sidecar: tuple[SidecarProcess, RecordingSink], raw: bytes) -> None:
    sc, _ = sidecar
    client = H2Client(sc.grpc_port, preface=False)
    try:
        client.send_raw(raw)
        out = client.wait(1)
        assert out.closed or out.goaway is not None, out
    finally:
        client.close()


def test_frame_with_unknown_type_and_bad_length(
    sidecar: tuple[SidecarProcess, RecordingSink],
) -> None:
    """A frame header claiming 16 MiB of payload (over the default max frame size)."""
    sc, _ = sidecar
    client = H2Client(sc.grpc_port)
    try:
        client.send_raw(struct.pack(">I", 0xFFFFFF)[1:] + b"\x00\x00\x00\x00\x00\x01")
        out = client.wait(1)
        assert out.goaway is not None or out.closed, out
    finally:
        client.close()


def test_zz_still_serving_and_earlier_data_intact(
    sidecar: tuple[SidecarProcess, RecordingSink],
) -> None:
    """Runs last (file order): the canary accepted before arrives byte-identical, and a
    valid request sent now over grpc is accepted and arrives."""
    sc, sink = sidecar
    assert sc.proc is not None and sc.proc.poll() is None
    grpc_export(sc.grpc_endpoint, "traces", trace_request("h2-after", 2))
    want = {
        sp.name: sp
        for req in (CANARY, trace_request("h2-after", 2))
        for sp in req.resource_spans[0].scope_spans[0].spans
    }
    assert sink.wait_for(lambda: set(want) <= {s.span.name for s in sink.spans()}, 30)
    for s in sink.spans():
        if s.span.name in want:
            assert s.span == want[s.span.name]
    assert sc.metric("gym_sidecar_dropped_items_total") == 0
