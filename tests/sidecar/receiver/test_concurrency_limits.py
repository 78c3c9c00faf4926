"""Concurrency and slow-body limits of the receivers: refused, counted, then served.

HTTP runs against a real sidecar process: a raw socket sends headers and half a body,
which keeps one request in flight deterministically. gRPC runs the real
receiver in-process in front of a stage that holds each batch until released, since a
gRPC call cannot be held open half-sent.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from gym_sidecar.config import LimitsConfig
from gym_sidecar.core.grpc_status import RETRY_INFO_TRAILER
from gym_sidecar.core.stage import Batch, Stage
from gym_sidecar.receiver.grpc import GrpcReceiver
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.otlp_samples import SERVICES, http_post, trace_request
from testkit.sink import RecordingSink
from testkit.wait import wait_for
from tests.support.sidecar_proc import SidecarProcess


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response (headers and a Content-Length body), however the
    server's writes were split into segments."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_http_concurrency_limit_429_then_serves() -> None:
    body = trace_request("held", 2).SerializeToString()
    with (
        RecordingSink() as sink,
        SidecarProcess(
            backend=sink.endpoint,
            env={
                "GYM_SIDECAR_LIMITS__HTTP_MAX_CONCURRENT_REQUESTS": "1",
                "GYM_SIDECAR_LIMITS__OVERLOAD_RETRY_AFTER_S": "2",
            },
        ) as sc,
    ):
        held = socket.create_connection(("127.0.0.1", sc.http_port))
        held.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        answers: list[httpx.Response] = []

        def refused() -> bool:  # once the held request is being handled (however late)
            answers.append(http_post(sc.http_url, "traces", body))
            return answers[-1].status_code == 429

        assert wait_for(refused, 60, interval_s=0.01), answers[-1].status_code
        resp = answers[-1]
        assert resp.headers["retry-after"] == "2"
        assert "too many" in status_pb2.Status.FromString(resp.content).message
        assert sc.metric("gym_sidecar_limit_hits_total", limit="http_max_concurrent_requests") >= 1
        held.sendall(body[10:])  # finish the held request: it is accepted
        assert b"200 OK" in _read_response(held)
        held.close()
        assert http_post(sc.http_url, "traces", body).status_code == 200
    assert sc.returncode == 0


class HoldingStage(Stage):
    """Keeps every batch until ``release`` is set (a real stage, for holding calls open)."""

    name = "holding"

    def __init__(self, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.batches: list[Batch] = []

    async def consume(self, batch: Batch) -> None:
        self.entered.set()
        await self.release.wait()
        self.batches.append(batch)


@dataclass
class HeldReceiver:
    """A real gRPC receiver limited to one call at a time, that one call held open."""

    stage: HoldingStage
    metrics: SelfMetrics
    target: str
    call: Any
    held: asyncio.Future[Any]

    def refusals(self) -> float:
        return self.metrics.limit_hits.labels("grpc_max_concurrent_requests").value


@asynccontextmanager
async def held_receiver(retry_after_s: float) -> AsyncIterator[HeldReceiver]:
    metrics = SelfMetrics()
    stage = HoldingStage(metrics)
    limits = LimitsConfig(grpc_max_concurrent_requests=1, overload_retry_after_s=retry_after_s)
    receiver = GrpcReceiver("127.0.0.1:0", stage, limits, metrics)
    await receiver.start()
    try:
        target = f"127.0.0.1:{receiver.bound_port}"
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary(f"/{SERVICES['traces']}/Export")
            held = asyncio.ensure_future(
                call(trace_request("g", 1).SerializeToString(), timeout=60)
            )
            await asyncio.wait_for(stage.entered.wait(), 30)
            yield HeldReceiver(stage, metrics, target, call, held)
    finally:
        await receiver.stop(1)


def test_grpc_concurrency_limit_resource_exhausted_with_retry_info() -> None:
    async def scenario() -> None:
        async with held_receiver(1.5) as h:
            payload = trace_request("g", 1).SerializeToString()
            try:
                await h.call(payload, timeout=30)
                raise AssertionError("second call should be refused")
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                status = rpc_status.from_call(err)
                assert status is not None
                info = error_details_pb2.RetryInfo()
                assert status.details[0].Unpack(info)
                assert info.retry_delay == duration_pb2.Duration(seconds=1, nanos=500_000_000)
                # The same hint as a bare trailer, the form the Python SDK reads.
                trailers = dict(err.trailing_metadata() or ())
                bare = error_details_pb2.RetryInfo.FromString(trailers[RETRY_INFO_TRAILER])
                assert bare == info
            h.stage.release.set()
            await h.held
            await h.call(payload, timeout=30)  # the limit frees up again
            assert len(h.stage.batches) == 2
            assert h.refusals() == 1

    asyncio.run(scenario())


def _sdk_spans(count: int) -> tuple[ReadableSpan, ...]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(count):
        provider.get_tracer("t").start_span(f"sdk-{i}").end()
    provider.shutdown()
    return memory.get_finished_spans()


def test_python_sdk_exporter_honours_our_retry_hint() -> None:
    """The OTel Python gRPC exporter takes our delay, not its own 1 s, 2 s, 4 s backoff.

    The hint (60 s) is longer than the exporter's timeout (8 s): an exporter that reads it
    gives up after the first refusal; one that ignored it would retry after ~1 s and ~2 s
    within its timeout and be refused again (counted in ``limit_hits``).
    """

    async def scenario() -> None:
        async with held_receiver(60) as h:
            exporter = OTLPSpanExporter(endpoint=h.target, insecure=True, timeout=8)
            spans = _sdk_spans(2)
            try:
                refused = await asyncio.to_thread(exporter.export, spans)
                assert refused is SpanExportResult.FAILURE
                retries = h.refusals() - 1
                assert retries == 0, f"the SDK retried {retries} times despite the 60 s hint"
                h.stage.release.set()
                await h.held
                accepted = await asyncio.to_thread(exporter.export, spans)
                assert accepted is SpanExportResult.SUCCESS
                assert len(h.stage.batches) == 2
            finally:
                exporter.shutdown()

    asyncio.run(scenario())


def test_http_trickling_body_times_out_with_408() -> None:
    body = trace_request("slow", 2).SerializeToString()
    with SidecarProcess(env={"GYM_SIDECAR_LIMITS__HTTP_BODY_TIMEOUT_S": "0.5"}) as sc:
        slow = socket.create_connection(("127.0.0.1", sc.http_port))
        slow.settimeout(10)
        slow.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        answer = _read_response(slow)
        slow.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"body not received within 0.5s" in answer
        assert sc.metric("gym_sidecar_limit_hits_total", limit="http_body_timeout_s") == 1
        assert http_post(sc.http_url, "traces", body).status_code == 200
    assert sc.returncode == 0
