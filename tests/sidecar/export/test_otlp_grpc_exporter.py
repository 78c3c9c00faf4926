"""Both gRPC exporters (grpc_h2's own HTTP/2 framing, and grpc.aio) against a real
grpc.aio server that captures metadata and answers with partial_success or scripted
trailers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from gym_sidecar.core.exporter import Exporter, Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.sidecar.export.helpers import run, trace_request
from tests.support.ports import free_port

Handler = Callable[[bytes, grpc.aio.ServicerContext], Any]
Make = Callable[[BackendConfig], Exporter]


@pytest.fixture(params=["h2", "grpcio"])
def make(request: pytest.FixtureRequest) -> Make:
    return GrpcH2Exporter if request.param == "h2" else OtlpGrpcExporter


@asynccontextmanager
async def server(handlers: dict[str, Handler]) -> AsyncIterator[str]:
    srv = grpc.aio.server()
    for service, handler in handlers.items():
        srv.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    service, {"Export": grpc.unary_unary_rpc_method_handler(handler)}
                ),
            )
        )
    port = free_port()
    srv.add_insecure_port(f"127.0.0.1:{port}")
    await srv.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await srv.stop(None)


TRACES = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS = "opentelemetry.proto.collector.logs.v1.LogsService"


def test_headers_go_as_metadata_and_partial_success_is_read(make: Make) -> None:
    seen: dict[str, Any] = {}

    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen["metadata"] = dict(context.invocation_metadata() or ())
        seen["bytes"] = request
        resp = ExportTraceServiceResponse()
        resp.partial_success.rejected_spans = 1
        resp.partial_success.error_message = "one too old"
        return resp.SerializeToString()

    async def logs(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        resp = ExportLogsServiceResponse()
        resp.partial_success.rejected_log_records = 2
        return resp.SerializeToString()

    async def body() -> None:
        async with server({TRACES: traces, LOGS: logs}) as url:
            exporter = make(BackendConfig(url=url, headers={"X-Tenant": "t1"}, compression="gzip"))
            payload = trace_request("m", 3).SerializeToString()
            result = await exporter.export(Signal.TRACES, payload, 3)
            logs_result = await exporter.export(Signal.LOGS, b"", 5)
            await exporter.close()
        assert result.outcome is Outcome.SUCCESS
        assert (result.rejected_items, result.message) == (1, "one too old")
        assert logs_result.rejected_items == 2
        assert seen["metadata"]["x-tenant"] == "t1"
        assert seen["bytes"] == payload

    run(body())


def test_retry_info_from_a_bare_trailer_is_a_hint(make: Make) -> None:
    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=3))
        context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
        return b""

    async def body() -> None:
        async with server({TRACES: traces}) as url:
            exporter = make(BackendConfig(url=url))
            result = await exporter.export(Signal.TRACES, b"", 0)
            await exporter.close()
        assert result.outcome is Outcome.RETRYABLE
        assert result.retry_after_s == 3.0

    run(body())


def test_unimplemented_signal_is_permanent(make: Make) -> None:
    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def body() -> None:
        async with server({TRACES: traces}) as url:
            exporter = make(BackendConfig(url=url))
            result = await exporter.export(Signal.METRICS, b"", 1)
            await exporter.close()
        assert result.outcome is Outcome.PERMANENT
        assert "UNIMPLEMENTED" in result.message

    run(body())


@asynccontextmanager
async def counting_relay(target: str) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP relay in front of ``target`` (``http://host:port``) that counts the bytes
    the client sends, i.e. what went over the wire after gRPC's own compression."""
    host, port = target.removeprefix("http://").rsplit(":", 1)
    sent = [0]

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: bool) -> None:
        try:
            while data := await reader.read(65536):
                if count:
                    sent[0] += len(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(client_r, server_w, True), pipe(server_r, client_w, False))

    relay = await asyncio.start_server(handle, "127.0.0.1", 0)
    relay_port = relay.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{relay_port}", sent
    finally:
        relay.close()


def test_gzip_compresses_what_goes_over_the_wire(make: Make) -> None:
    received: list[bytes] = []

    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        received.append(request)
        return b""

    payload = trace_request("compressible" * 20, 200).SerializeToString()

    async def wire_bytes(compression: str) -> int:
        async with server({TRACES: traces}) as url, counting_relay(url) as (relay, sent):
            exporter = make(BackendConfig(url=relay, compression=compression))  # type: ignore[arg-type]
            result = await exporter.export(Signal.TRACES, payload, 200)
            await exporter.close()
        assert result.outcome is Outcome.SUCCESS, result.message
        return sent[0]

    async def body() -> None:
        plain = await wire_bytes("none")
        gzipped = await wire_bytes("gzip")
        assert plain > len(payload)  # all of it crossed the relay
        assert gzipped < plain / 4, (gzipped, plain, len(payload))
        assert received == [payload, payload]  # inflated back to the same bytes

    run(body())


def _retry_info(seconds: int, nanos: int = 0) -> error_details_pb2.RetryInfo:
    return error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=seconds, nanos=nanos)
    )


def _status_details(*details: Any) -> bytes:
    from google.rpc import status_pb2

    status = status_pb2.Status(code=8, message="busy")
    for detail in details:
        status.details.add().Pack(detail)
    return status.SerializeToString()


def test_retry_delay_is_read_from_the_trailers_whatever_comes_first() -> None:
    from gym_sidecar.export.otlp_grpc import retry_delay_s

    details = _status_details(error_details_pb2.DebugInfo(detail="x"), _retry_info(1, 500_000_000))
    trailers = [("x-other", "text"), ("x-bin", b"\x00"), ("grpc-status-details-bin", details)]
    assert retry_delay_s(trailers) == 1.5
    assert retry_delay_s([("grpc-status-details-bin", _status_details(_retry_info(0)))]) == 0.0
    bare = _retry_info(0, 250_000_000).SerializeToString()
    assert retry_delay_s([("x-bin", b"\x01"), ("google.rpc.retryinfo-bin", bare)]) == 0.25
    assert retry_delay_s([("grpc-status-details-bin", _status_details())]) is None
    assert retry_delay_s([("grpc-status-details-bin", b"\xff\xff")]) is None
    assert retry_delay_s(None) is None


def test_classify_keeps_the_message_and_the_hint() -> None:
    from gym_sidecar.export.otlp_grpc import classify

    code = grpc.StatusCode
    unavailable = classify(code.UNAVAILABLE, "backend restarting", 2.5)
    assert (unavailable.outcome, unavailable.message, unavailable.retry_after_s) == (
        Outcome.RETRYABLE,
        "UNAVAILABLE: backend restarting",
        2.5,
    )
    busy = classify(code.RESOURCE_EXHAUSTED, "quota", 0.5)
    assert (busy.outcome, busy.message, busy.retry_after_s) == (
        Outcome.RETRYABLE,
        "RESOURCE_EXHAUSTED: quota",
        0.5,
    )
    assert classify(code.RESOURCE_EXHAUSTED, "quota", None).outcome is Outcome.PERMANENT
    # a hint does not make a permanent error retryable
    assert classify(code.INVALID_ARGUMENT, "bad span", 1.0).outcome is Outcome.PERMANENT
