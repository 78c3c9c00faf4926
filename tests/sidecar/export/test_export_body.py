"""A batch exported from its pieces (``export/body.py``): never joined whole, the same
bytes on the wire as the join, over both exporters, with and without gzip."""

from __future__ import annotations

import base64
import itertools
import random

import grpc
import pytest
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.body import coalesced
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.fanout import FanOutExporter
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter
from gym_sidecar.export.otlp_http import OtlpHttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.sidecar.export.helpers import run, trace_request
from tests.sidecar.export.http_backend import ScriptedHttpBackend
from tests.sidecar.export.test_otlp_grpc_exporter import TRACES, server


def pieces_of(payload: bytes, seed: int) -> list[bytes | memoryview]:
    """``payload`` cut at random places into views and bytes, an empty piece among them."""
    rng = random.Random(seed)
    cuts = sorted({0, len(payload), *(rng.randrange(len(payload)) for _ in range(40))})
    view = memoryview(payload)
    out: list[bytes | memoryview] = [view[a:b] for a, b in itertools.pairwise(cuts)]
    for i in range(0, len(out), 3):
        out[i] = bytes(out[i])
    out.insert(len(out) // 2, b"")
    return out


def big_payload(spans: int = 250) -> bytes:
    """~3 MB, mostly incompressible: far over HTTP/2's windows and the chunk size."""
    rng = random.Random(5)
    req = trace_request("big", spans)
    for span in req.resource_spans[0].scope_spans[0].spans:
        span.name = base64.b64encode(rng.randbytes(9000)).decode()
    return req.SerializeToString()


def test_coalesced_chunks_concatenate_to_the_join_in_bounded_runs() -> None:
    payload = big_payload(40)
    for seed in range(5):
        parts = pieces_of(payload, seed)
        chunks = list(coalesced(parts, chunk_bytes=64 * 1024))
        assert b"".join(chunks) == payload
        assert all(len(c) for c in chunks)
        large = {id(p) for p in parts if len(p) >= 64 * 1024}
        for chunk in chunks:
            # a large piece passes uncopied; a run of small ones stops once it reaches
            # the chunk size, so it is under twice that
            assert id(chunk) in large or len(chunk) < 2 * 64 * 1024


def test_coalesced_of_nothing_is_nothing() -> None:
    assert list(coalesced([])) == []
    assert list(coalesced([b"", memoryview(b"")])) == []


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_h2_export_of_pieces_arrives_as_their_join(compression: str) -> None:
    received: list[bytes] = []

    async def traces(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        received.append(request)
        return b""

    payload = big_payload()
    small = trace_request("small", 3).SerializeToString()

    async def body() -> None:
        async with server({TRACES: traces}) as url:
            exporter = GrpcH2Exporter(BackendConfig(url=url, compression=compression))  # type: ignore[arg-type]
            try:
                for data, seed in ((payload, 1), (small, 2)):
                    result = await exporter.export_parts(Signal.TRACES, pieces_of(data, seed), 250)
                    assert result.outcome is Outcome.SUCCESS, result.message
            finally:
                await exporter.close()
        assert received == [payload, small]

    run(body())


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_http_export_of_pieces_arrives_as_their_join(compression: str) -> None:
    payload = b"".join(trace_request(f"r{i}", 200).SerializeToString() for i in range(20))

    async def body() -> None:
        cfg = BackendConfig(url=backend.url, protocol="http/protobuf", compression=compression)  # type: ignore[arg-type]
        exporter = OtlpHttpExporter(cfg)
        try:
            result = await exporter.export_parts(Signal.TRACES, pieces_of(payload, 3), 4000)
            assert result.outcome is Outcome.SUCCESS, result.message
        finally:
            await exporter.close()

    with ScriptedHttpBackend() as backend:
        run(body())
        assert backend.requests == [ExportTraceServiceRequest.FromString(payload)]


def test_fan_out_hands_pieces_on_and_skips_done_children_on_retry() -> None:
    # The backend fails once: the retry (same pieces object) reaches only the backend.
    payload = trace_request("fan", 5).SerializeToString()
    parts = pieces_of(payload, 4)

    async def body() -> None:
        first = OtlpHttpExporter(BackendConfig(url=ok.url, protocol="http/protobuf"))
        second = OtlpHttpExporter(BackendConfig(url=flaky.url, protocol="http/protobuf"))
        fan = FanOutExporter([first, second])
        try:
            result = await fan.export_parts(Signal.TRACES, parts, 5)
            assert result.outcome is Outcome.RETRYABLE
            result = await fan.export_parts(Signal.TRACES, parts, 5)
            assert result.outcome is Outcome.SUCCESS, result.message
        finally:
            await fan.close()

    with ScriptedHttpBackend() as ok, ScriptedHttpBackend() as flaky:
        flaky.fail_next(1, 503)
        run(body())
        expected = ExportTraceServiceRequest.FromString(payload)
        assert ok.requests == [expected]
        assert flaky.requests == [expected]
