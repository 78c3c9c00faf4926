"""gRPC and HTTP/2 semantics of the OTLP/gRPC receiver, seen from a raw HTTP/2 client
(``tests/support/h2client.py``) against a real ``gym-sidecar`` process: the form of an
answer (headers, message, trailers; trailers-only refusals and the RST_STREAM that stops
a client still sending), content types, ``grpc-encoding``, ``grpc-timeout``, the message
prefix checked before anything is buffered, flow control (the advertised settings,
windows reopened as data is consumed), and the GOAWAY drain on SIGTERM.
"""

from __future__ import annotations

import gzip
import itertools
import signal
import zlib
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import kv, trace_request
from testkit.sink import RecordingSink
from tests.support.h2client import H2Client, Outcome, grpc_frame, request_headers
from tests.support.sidecar_proc import SidecarProcess

KiB = 1024
MiB = 1024 * KiB
LIMITS = {
    "grpc_message_timeout_s": 3,
    "grpc_max_message_bytes": 256 * KiB,
    "grpc_transport_max_bytes": 1 * MiB,
}
NO_ERROR, REFUSED_STREAM = 0x0, 0x7


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    with SidecarProcess(backend=sink.endpoint, config={"limits": LIMITS}) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()[-3000:]


def span_names(sink: RecordingSink) -> set[str]:
    return {s.span.name for s in sink.spans()}


def call(
    sc: SidecarProcess, headers: list[tuple[str, str]], body: bytes, end_stream: bool = True
) -> Outcome:
    with H2Client(sc.grpc_port) as client:
        stream_id = client.start(headers)
        client.send(stream_id, body, end_stream=end_stream)
        out = client.wait(stream_id)
        if out.reset is None and out.grpc_status is not None and not end_stream:
            client.read_until(lambda: out.reset is not None)  # the RST_STREAM that follows
        return out


def test_an_accepted_call_is_headers_message_trailers(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    out = call(sidecar, request_headers(), grpc_frame(trace_request("form", 1).SerializeToString()))
    assert out.headers[":status"] == "200"
    assert out.headers["content-type"] == "application/grpc"
    assert "gzip" in out.headers["grpc-accept-encoding"]
    assert out.data == b"\x00\x00\x00\x00\x00"  # an empty ExportTraceServiceResponse
    assert out.trailers == {"grpc-status": "0"}
    assert sink.wait_for(lambda: "form-0" in span_names(sink), 30)


def test_a_refusal_is_trailers_only_and_stops_a_client_still_sending(
    sidecar: SidecarProcess,
) -> None:
    """An unknown method, its body not finished: one HEADERS frame with the status, then
    RST_STREAM(NO_ERROR) so that the client stops sending (RFC 9113, 8.1)."""
    headers = request_headers(path="/no.Such/Method")
    out = call(sidecar, headers, grpc_frame(b"x" * 100)[:50], end_stream=False)
    assert out.grpc_status == 12, out  # UNIMPLEMENTED
    assert out.http_status == "200" and out.data == b"" and not out.trailers
    assert out.reset == NO_ERROR, out
    assert "/no.Such/Method" in out.grpc_message


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/grpc", 0),
        ("application/grpc+proto", 0),
        ("application/grpc; charset=binary", 0),
        ("application/grpc+json", 3),
        ("application/grpcx", 3),
        ("application/json", 3),
    ],
)
def test_content_types(sidecar: SidecarProcess, content_type: str, status: int) -> None:
    headers = [(k, content_type if k == "content-type" else v) for k, v in request_headers()]
    out = call(sidecar, headers, grpc_frame(trace_request("ct", 1).SerializeToString()))
    assert out.grpc_status == status, out
    if status:
        assert out.http_status == "415"  # as grpc-go answers
        assert out.grpc_status == 3  # INVALID_ARGUMENT


@pytest.mark.parametrize("frames", [1, 7])
@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_messages_are_inflated(
    sidecar: SidecarProcess, sink: RecordingSink, encoding: str, frames: int
) -> None:
    """In one DATA frame, or cut into seven (inflated chunk by chunk, the prefix split
    across the first two)."""
    tag = f"enc-{encoding}-{frames}"
    data = trace_request(tag, 40).SerializeToString()
    packed = gzip.compress(data) if encoding == "gzip" else zlib.compress(data)
    body = grpc_frame(packed, compressed=True)
    step = max(1, len(body) // frames)
    cuts = [*[0, 3, *range(3 + step, len(body), step)][:frames], len(body)]
    with H2Client(sidecar.grpc_port) as client:
        stream_id = client.start(request_headers(grpc_encoding=encoding))
        for start, end in itertools.pairwise(cuts):
            client.send(stream_id, body[start:end], end_stream=end == len(body))
        out = client.wait(stream_id)
    assert out.grpc_status == 0, out
    assert sink.wait_for(lambda: f"{tag}-39" in span_names(sink), 30)


def test_data_after_the_compressed_stream_is_refused(sidecar: SidecarProcess) -> None:
    """Not silently dropped: a second gzip member, or garbage, after the first."""
    packed = gzip.compress(trace_request("trailing", 1).SerializeToString()) * 2
    out = call(sidecar, request_headers(grpc_encoding="gzip"), grpc_frame(packed, compressed=True))
    assert out.grpc_status == 3, out  # INVALID_ARGUMENT
    assert "past its end" in out.grpc_message


def test_an_unsupported_encoding_is_unimplemented_with_the_accepted_ones(
    sidecar: SidecarProcess,
) -> None:
    out = call(sidecar, request_headers(grpc_encoding="br"), grpc_frame(b"\x01" * 10, True))
    assert out.grpc_status == 12, out  # UNIMPLEMENTED, as the gRPC spec says
    assert set(out.headers["grpc-accept-encoding"].split(",")) >= {"identity", "gzip"}
    before = sidecar.metric("gym_sidecar_bad_requests_total", transport="grpc", reason="encoding")
    assert before >= 1


def test_a_compressed_message_inflating_past_the_message_limit_is_refused_and_counted(
    sidecar: SidecarProcess,
) -> None:
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit="grpc_max_message_bytes")
    bomb = gzip.compress(bytes(64 * MiB), 9)  # ~64 KiB on the wire, 256x the limit inflated
    out = call(sidecar, request_headers(grpc_encoding="gzip"), grpc_frame(bomb, compressed=True))
    assert out.grpc_status == 3, out  # INVALID_ARGUMENT
    assert "inflated exceeds the limit" in out.grpc_message
    after = sidecar.metric("gym_sidecar_limit_hits_total", limit="grpc_max_message_bytes")
    assert after == before + 1


@pytest.mark.parametrize(
    ("length", "status", "limit"),
    [(2 * MiB, 8, "grpc_transport_max_bytes"), (512 * KiB, 3, "grpc_max_message_bytes")],
    ids=["over the transport limit", "over the message limit"],
)
def test_a_length_prefix_over_a_limit_is_refused_before_the_message_is_buffered(
    sidecar: SidecarProcess, length: int, status: int, limit: str
) -> None:
    """Only the prefix and 100 bytes are sent, the stream left open: the answer comes
    from the prefix (RESOURCE_EXHAUSTED / INVALID_ARGUMENT), not from the message timeout
    (DEADLINE_EXCEEDED) that buffering it would have ended in."""
    before = sidecar.metric("gym_sidecar_limit_hits_total", limit=limit)
    out = call(sidecar, request_headers(), grpc_frame(b"x" * 100, length=length), end_stream=False)
    assert out.grpc_status == status, out
    assert out.reset == NO_ERROR, out
    assert sidecar.metric("gym_sidecar_limit_hits_total", limit=limit) == before + 1


def test_the_clients_grpc_timeout_bounds_the_wait_for_its_message(
    sidecar: SidecarProcess,
) -> None:
    """grpc-timeout 300 ms, shorter than grpc_message_timeout_s (3 s), and no message:
    DEADLINE_EXCEEDED saying it was the client's deadline, counted as such."""
    before = sidecar.metric(
        "gym_sidecar_bad_requests_total", transport="grpc", reason="client_deadline"
    )
    with H2Client(sidecar.grpc_port) as client:
        stream_id = client.start(request_headers(grpc_timeout="300m"))
        out = client.wait(stream_id, bound_s=2.5)
    assert out.grpc_status == 4, out  # DEADLINE_EXCEEDED
    assert "grpc-timeout" in out.grpc_message
    after = sidecar.metric(
        "gym_sidecar_bad_requests_total", transport="grpc", reason="client_deadline"
    )
    assert after == before + 1


def test_an_unparsable_grpc_timeout_is_ignored(sidecar: SidecarProcess) -> None:
    """As grpc core does: the call is served as if it had none."""
    body = grpc_frame(trace_request("bad-timeout", 1).SerializeToString())
    assert call(sidecar, request_headers(grpc_timeout="soon"), body).grpc_status == 0


def test_the_advertised_settings_and_connection_window(sidecar: SidecarProcess) -> None:
    with H2Client(sidecar.grpc_port) as client:
        assert client.read_until(
            lambda: (
                bool(client.remote_settings) and client.conn.outbound_flow_control_window > 65535
            )
        )
        settings = client.remote_settings
        assert settings[0x3] == 128  # MAX_CONCURRENT_STREAMS: grpc_max_streams_per_connection
        assert settings[0x4] == 4 * MiB  # INITIAL_WINDOW_SIZE
        assert settings[0x5] == 1 * MiB  # MAX_FRAME_SIZE
        assert settings[0x6] == 64 * KiB  # MAX_HEADER_LIST_SIZE: http_max_header_bytes
        assert client.conn.outbound_flow_control_window == 4 * MiB


def _big_request(tag: str, size: int) -> bytes:
    request = ExportTraceServiceRequest.FromString(trace_request(tag, 1).SerializeToString())
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.append(kv("blob", "b" * size))
    return request.SerializeToString()


def test_a_message_larger_than_every_window_arrives_under_flow_control(
    sink: RecordingSink,
) -> None:
    """10 MiB from a client that never sends past the windows: it can finish only if the
    receiver reopens the stream and connection windows as it consumes the data. Then a
    3 MiB message on another stream of the same connection: the connection window did
    not shrink with the first call's data."""
    with SidecarProcess(backend=sink.endpoint) as sc, H2Client(sc.grpc_port) as client:
        for tag, size in (("flow-10m", 10 * MiB), ("flow-3m", 3 * MiB)):
            stream_id = client.start(request_headers())
            client.send_flow_controlled(stream_id, grpc_frame(_big_request(tag, size)))
            assert client.wait(stream_id, bound_s=30).grpc_status == 0
            assert sink.wait_for(lambda tag=tag: f"{tag}-0" in span_names(sink), 60)
    assert sc.returncode == 0


def test_sigterm_drains_with_goaway_serving_the_call_in_progress(sink: RecordingSink) -> None:
    """A call half sent when SIGTERM arrives: GOAWAY(NO_ERROR) naming it as the last
    stream; a stream opened after that is refused (REFUSED_STREAM: clients retry it
    elsewhere); the call in progress finishes within the grace period, is answered OK
    and its data delivered; the process exits 0."""
    tag = "drained"
    body = grpc_frame(trace_request(tag, 1).SerializeToString())
    sc = SidecarProcess(backend=sink.endpoint, config={"shutdown_timeout_s": 20}).start()
    try:
        with H2Client(sc.grpc_port) as client:
            stream_id = client.start(request_headers())
            client.send(stream_id, body[:20], end_stream=False)
            client.read_until(lambda: bool(client.remote_settings))
            sc.signal(signal.SIGTERM)
            assert client.read_until(lambda: client.goaway is not None)
            assert client.goaway is not None
            assert client.goaway.error_code == NO_ERROR
            assert client.goaway.last_stream_id == stream_id
            late = client.start(request_headers())
            client.send(late, body)
            client.send(stream_id, body[20:])
            assert client.wait(stream_id).grpc_status == 0
            late_out = client.wait(late)
            assert late_out.reset == REFUSED_STREAM or late_out.closed, late_out
            assert client.wait_closed()
    finally:
        sc.stop()
    assert sc.returncode == 0, sc.log_text()[-3000:]
    assert f"{tag}-0" in span_names(sink)


def test_sigterm_closes_a_call_that_never_finishes_after_the_grace_period() -> None:
    """shutdown_timeout_s 4: the receivers get a quarter of it; the half-sent call is
    then cut off, and the process still exits 0 within its deadline."""
    sc = SidecarProcess(config={"shutdown_timeout_s": 4}).start()
    try:
        with H2Client(sc.grpc_port) as client:
            stream_id = client.start(request_headers())
            client.send(stream_id, b"\x00\x00\x00\x01\x00", end_stream=False)
            client.read_until(lambda: bool(client.remote_settings))
            sc.signal(signal.SIGTERM)
            assert client.wait_closed(bound_s=10)
        assert sc.proc is not None
        assert sc.proc.wait(timeout=30) == 0
    finally:
        sc.stop()
