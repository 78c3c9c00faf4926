"""GrpcH2Exporter (gRPC framed over HTTP/2 by the sidecar itself) against real grpc
servers and scripted sockets: flow control on large messages, concurrency on one
connection, gzip with the compressed flag, broken and silent connections, reconnection,
and how answers without a gRPC status map to outcomes."""

from __future__ import annotations

import asyncio
import base64
import random
import zlib

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from gym_sidecar.assemble import build_exporter
from gym_sidecar.core.exporter import Exporter, Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter, _outcome
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter
from gym_sidecar.wire.http2.grpc_client import Call
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from testkit.sink import RecordingSink
from tests.sidecar.export.helpers import run, trace_request
from tests.sidecar.export.test_otlp_grpc_exporter import TRACES, server
from tests.support.ports import free_port


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_message_larger_than_the_flow_control_windows_arrives_whole(compression: str) -> None:
    received: list[bytes] = []

    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        received.append(request)
        return b""

    # ~3 MB, mostly incompressible: far over HTTP/2's initial 64 KiB windows either way.
    rng = random.Random(5)
    req = trace_request("big", 250)
    for span in req.resource_spans[0].scope_spans[0].spans:
        span.name = base64.b64encode(rng.randbytes(9000)).decode()
    payload = req.SerializeToString()
    assert len(payload) > 2_000_000

    async def body() -> None:
        async with server({TRACES: traces}) as url:
            exporter = GrpcH2Exporter(BackendConfig(url=url, compression=compression))  # type: ignore[arg-type]
            result = await exporter.export(Signal.TRACES, payload, 250)
            await exporter.close()
        assert result.outcome is Outcome.SUCCESS, result.message
        assert received == [payload]

    run(body())


def test_concurrent_calls_share_one_connection_and_all_arrive() -> None:
    async def body() -> None:
        with RecordingSink() as sink:
            exporter = GrpcH2Exporter(
                BackendConfig(url=f"http://{sink.endpoint}", compression="gzip")
            )
            payloads = [trace_request(f"c{i}", 50).SerializeToString() for i in range(24)]
            results = await asyncio.gather(
                *(exporter.export(Signal.TRACES, p, 50) for p in payloads)
            )
            conn = exporter._conn
            await exporter.close()
            assert all(r.outcome is Outcome.SUCCESS for r in results), results
            assert sink.span_count == 24 * 50
            assert conn is not None and conn.h2.highest_outbound_stream_id == 2 * 24 - 1

    run(body())


def test_a_long_lived_connection_remembers_a_bounded_number_of_closed_streams() -> None:
    """Every call is a stream, and one connection carries them all for days: h2's own
    memory of closed streams (65,536 by default, ~7 MiB) is capped at 1,024."""

    async def body() -> None:
        with RecordingSink(record=False) as sink:
            exporter = GrpcH2Exporter(BackendConfig(url=f"http://{sink.endpoint}"))
            payload = trace_request("many", 1).SerializeToString()
            for _ in range(1200):
                result = await exporter.export(Signal.TRACES, payload, 1)
                assert result.outcome is Outcome.SUCCESS, result.message
            conn = exporter._conn
            assert conn is not None and conn.h2.highest_outbound_stream_id == 2 * 1200 - 1
            remembered = len(conn.h2._closed_streams)
            await exporter.close()
            assert sink.span_count == 1200
            assert remembered == 1024

    run(body())


def test_refused_connection_is_retryable_unavailable() -> None:
    async def body() -> None:
        exporter = GrpcH2Exporter(BackendConfig(url=f"http://127.0.0.1:{free_port()}"))
        result = await exporter.export(Signal.TRACES, b"", 0)
        await exporter.close()
        assert result.outcome is Outcome.RETRYABLE
        assert result.message.startswith("UNAVAILABLE")

    run(body())


def test_a_silent_server_times_out_as_retryable_deadline_exceeded() -> None:
    async def body() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # reads nothing, answers nothing

        silent = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = silent.sockets[0].getsockname()[1]
        exporter = GrpcH2Exporter(BackendConfig(url=f"http://127.0.0.1:{port}", timeout_s=0.5))
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await exporter.export(Signal.TRACES, b"x" * 100, 1)
        elapsed = loop.time() - started
        await exporter.close()
        for w in accepted:
            w.close()
        silent.close()
        assert result.outcome is Outcome.RETRYABLE
        assert result.message.startswith("DEADLINE_EXCEEDED")
        assert elapsed < 5  # bounded by timeout_s, not by the server

    run(body())


def test_a_restarted_server_gets_a_new_connection() -> None:
    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def body() -> None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        exporter = GrpcH2Exporter(BackendConfig(url=url))
        payload = trace_request("r", 2).SerializeToString()

        async def serve() -> grpc.aio.Server:
            srv = grpc.aio.server()
            srv.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(
                        TRACES, {"Export": grpc.unary_unary_rpc_method_handler(traces)}
                    ),
                )
            )
            srv.add_insecure_port(f"127.0.0.1:{port}")
            await srv.start()
            return srv

        srv = await serve()
        first = await exporter.export(Signal.TRACES, payload, 2)
        await srv.stop(None)
        down = await exporter.export(Signal.TRACES, payload, 2)
        srv = await serve()
        again = await exporter.export(Signal.TRACES, payload, 2)
        await exporter.close()
        await srv.stop(None)
        assert first.outcome is Outcome.SUCCESS, first.message
        assert down.outcome is Outcome.RETRYABLE, down.message
        assert again.outcome is Outcome.SUCCESS, again.message

    run(body())


def _finished(headers: list[tuple[str, str]], trailers: list[tuple[str, str]] = []) -> Call:  # noqa: B006
    loop = asyncio.new_event_loop()
    try:
        call = Call(loop.create_future(), headers=headers, trailers=trailers)
    finally:
        loop.close()
    return call


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")  # gRPC may send it unpadded


@pytest.mark.parametrize(
    ("http_status", "code", "outcome"),
    [
        (400, "INTERNAL", Outcome.PERMANENT),
        (401, "UNAUTHENTICATED", Outcome.PERMANENT),
        (403, "PERMISSION_DENIED", Outcome.PERMANENT),
        (404, "UNIMPLEMENTED", Outcome.PERMANENT),
        (429, "UNAVAILABLE", Outcome.RETRYABLE),
        (502, "UNAVAILABLE", Outcome.RETRYABLE),
        (503, "UNAVAILABLE", Outcome.RETRYABLE),
        (504, "UNAVAILABLE", Outcome.RETRYABLE),
        (500, "UNKNOWN", Outcome.PERMANENT),
    ],
)
def test_http_status_without_grpc_status_maps_like_the_grpc_spec(
    http_status: int, code: str, outcome: Outcome
) -> None:
    """gRPC's HTTP-to-gRPC table (a proxy in front of the backend answering on its own):
    429, 502, 503 and 504 are UNAVAILABLE, so retried; the others are not."""
    result = _outcome(Signal.TRACES, _finished([(":status", str(http_status))]), 1)
    assert (result.outcome, result.message.split(":", 1)[0]) == (outcome, code), result


def test_answers_map_to_outcomes_like_grpc_core() -> None:
    # No grpc-status: the HTTP status decides (gRPC's HTTP-to-gRPC table).
    unavailable = _outcome(Signal.TRACES, _finished([(":status", "503")]), 1)
    assert unavailable.outcome is Outcome.RETRYABLE
    assert unavailable.message.startswith("UNAVAILABLE")
    not_found = _outcome(Signal.TRACES, _finished([(":status", "404")]), 1)
    assert not_found.outcome is Outcome.PERMANENT
    assert not_found.message.startswith("UNIMPLEMENTED")
    no_status = _outcome(Signal.TRACES, _finished([(":status", "200")]), 1)
    assert no_status.outcome is Outcome.PERMANENT
    # Trailers-only answer with a percent-encoded message.
    invalid = _outcome(
        Signal.TRACES,
        _finished([(":status", "200"), ("grpc-status", "3"), ("grpc-message", "bad%20span")]),
        1,
    )
    assert (invalid.outcome, invalid.message) == (Outcome.PERMANENT, "INVALID_ARGUMENT: bad span")
    # RESOURCE_EXHAUSTED with RetryInfo in the status details (unpadded base64).
    info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=7))
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="busy")
    status.details.add().Pack(info)
    busy = _outcome(
        Signal.TRACES,
        _finished(
            [(":status", "200"), ("content-type", "application/grpc")],
            [
                ("grpc-status", "8"),
                ("grpc-message", "busy"),
                ("grpc-status-details-bin", _b64(status.SerializeToString())),
            ],
        ),
        1,
    )
    assert (busy.outcome, busy.retry_after_s) == (Outcome.RETRYABLE, 7.0)


def test_a_gzip_compressed_response_is_read_for_partial_success() -> None:
    resp = ExportTraceServiceResponse()
    resp.partial_success.rejected_spans = 2
    resp.partial_success.error_message = "too old"
    body = zlib.compress(resp.SerializeToString(), 6, 31)
    call = _finished([(":status", "200"), ("grpc-encoding", "gzip")], [("grpc-status", "0")])
    call.data += bytes([1]) + len(body).to_bytes(4, "big") + body
    result = _outcome(Signal.TRACES, call, 5)
    assert (result.outcome, result.rejected_items, result.message) == (
        Outcome.SUCCESS,
        2,
        "too old",
    )


@pytest.mark.parametrize(
    ("client", "compression", "expected"),
    [
        ("auto", "gzip", GrpcH2Exporter),
        ("auto", "none", GrpcH2Exporter),
        ("h2", "none", GrpcH2Exporter),
        ("grpcio", "gzip", OtlpGrpcExporter),
        ("grpcio", "none", OtlpGrpcExporter),
    ],
)
def test_grpc_client_auto_is_h2_and_grpcio_only_when_asked_for(
    client: str, compression: str, expected: type[Exporter]
) -> None:
    async def body() -> None:
        exporter = build_exporter(
            BackendConfig(url="http://127.0.0.1:4317", compression=compression, grpc_client=client)  # type: ignore[arg-type]
        )
        await exporter.close()
        assert type(exporter) is expected

    run(body())


def test_grpc_client_grpcio_without_the_grpcio_package_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """grpcio is an extra now: asking for its client where it is not installed is
    refused at load, with the pip command, not at the first export."""
    import importlib.util

    from gym_sidecar.configmodel import ValidationError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a)
    )
    with pytest.raises(ValidationError, match=r"gym-telemetry-sidecar\[grpcio\]"):
        BackendConfig(url="http://127.0.0.1:4317", grpc_client="grpcio")
    assert BackendConfig(url="http://127.0.0.1:4317", grpc_client="auto").grpc_client == "auto"
