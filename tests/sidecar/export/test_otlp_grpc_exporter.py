"""OtlpGrpcExporter against a real grpc.aio server that captures metadata and answers
with partial_success or scripted trailers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from gym_sidecar.export.base import Outcome
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter
from gym_sidecar.pipeline.stage import Signal
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tests.sidecar.export.helpers import run, trace_request
from tests.support.ports import free_port

Handler = Callable[[bytes, grpc.aio.ServicerContext], Any]


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


def test_headers_go_as_metadata_and_partial_success_is_read() -> None:
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
            exporter = OtlpGrpcExporter(
                BackendConfig(url=url, headers={"X-Tenant": "t1"}, compression="gzip")
            )
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


def test_retry_info_from_a_bare_trailer_is_a_hint() -> None:
    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=3))
        context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
        return b""

    async def body() -> None:
        async with server({TRACES: traces}) as url:
            exporter = OtlpGrpcExporter(BackendConfig(url=url))
            result = await exporter.export(Signal.TRACES, b"", 0)
            await exporter.close()
        assert result.outcome is Outcome.RETRYABLE
        assert result.retry_after_s == 3.0

    run(body())


def test_unimplemented_signal_is_permanent() -> None:
    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def body() -> None:
        async with server({TRACES: traces}) as url:
            exporter = OtlpGrpcExporter(BackendConfig(url=url))
            result = await exporter.export(Signal.METRICS, b"", 1)
            await exporter.close()
        assert result.outcome is Outcome.PERMANENT
        assert "UNIMPLEMENTED" in result.message

    run(body())
