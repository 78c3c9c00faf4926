"""gzip of the OTLP/HTTP exporter: standard output at every level from pieces, and a real
export through the counting HTTP sink (which library deflates:
tests/sidecar/wire/test_deflate.py)."""

from __future__ import annotations

import gzip
import itertools

import pytest
from gym_sidecar.configmodel import ValidationError
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.body import gzip_body, gzip_parts
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.otlp_http import OtlpHttpExporter

from testkit.http_sink import HttpSink
from tests.sidecar.export.helpers import run, trace_request


def many_spans(requests: int) -> bytes:
    """``requests`` x 200 spans as one body (serialized requests concatenate into one)."""
    return b"".join(trace_request(f"t{i}", 200).SerializeToString() for i in range(requests))


@pytest.mark.parametrize("level", range(1, 10))
def test_every_level_gives_a_standard_gzip_member(level: int) -> None:
    payload = trace_request("gz", 200).SerializeToString()
    body = gzip_body(payload, level)
    assert body[:2] == b"\x1f\x8b"
    assert gzip.decompress(body) == payload
    assert len(body) < len(payload) // 3


def test_pieces_deflate_to_the_gzip_of_their_join() -> None:
    # The exporters deflate a batch's pieces (received bytes, views of them, new
    # resources) without joining them: one member that inflates to their join, about the
    # size one call over the join gives (the deflater's choices depend on how input
    # arrives, so the bytes may differ).
    whole = many_spans(12)
    view = memoryview(whole)
    cuts = sorted({0, 1, 7, 4096, 4097, 70_000, len(whole) // 2, len(whole)})
    assert cuts[-1] == len(whole) > 140_000
    pieces: list[bytes | memoryview] = [view[a:b] for a, b in itertools.pairwise(cuts)]
    pieces[2] = bytes(pieces[2])
    for level in (1, 5, 9):
        out = gzip_parts(pieces, level)
        assert gzip.decompress(out) == whole
        assert abs(len(out) - len(gzip_body(whole, level))) <= len(out) // 100


def test_a_higher_level_is_not_larger() -> None:
    payload = many_spans(8)
    assert len(gzip_body(payload, 9)) <= len(gzip_body(payload, 1))


@pytest.mark.parametrize("level", [0, 10])
def test_a_level_outside_1_to_9_is_refused(level: int) -> None:
    with pytest.raises(ValidationError, match="compression_level"):
        BackendConfig(url="http://127.0.0.1:1", compression="gzip", compression_level=level)


def test_small_and_large_bodies_arrive_gzipped_and_whole() -> None:
    # Two requests over one kept-alive connection: 3 spans, then 3000 (~190 KB).
    async def body() -> None:
        cfg = BackendConfig(
            url=sink.url, protocol="http/protobuf", compression="gzip", compression_level=1
        )
        exporter = OtlpHttpExporter(cfg)
        try:
            small = trace_request("small", 3).SerializeToString()
            for spans, payload in ((3, small), (3000, many_spans(15))):
                result = await exporter.export(Signal.TRACES, payload, spans)
                assert result.outcome is Outcome.SUCCESS, result
        finally:
            await exporter.close()

    with HttpSink() as sink:
        run(body())
        assert sink.wait_spans(3003)
        assert (sink.span_count, sink.calls, sink.gzip_requests) == (3003, 2, 2)
        assert sink.bad_requests == 0
