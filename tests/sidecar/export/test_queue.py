"""MemoryQueue, batch concatenation and backoff, exercised directly."""

from __future__ import annotations

import asyncio

import pytest
from gym_sidecar.core.exporter import Exporter, ExportResult
from gym_sidecar.core.stage import Batch, Signal
from gym_sidecar.export import stage as export_stage
from gym_sidecar.export.backoff import Backoff
from gym_sidecar.export.config import QueueConfig
from gym_sidecar.export.queue import MemoryQueue
from gym_sidecar.export.sender import Sender
from gym_sidecar.export.stage import QueueStage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import trace_view
from tests.sidecar.export.helpers import run, trace_request


def test_concatenated_requests_parse_as_one_merged_request() -> None:
    a, b = trace_request("a", 2), trace_request("b", 3)
    merged = ExportTraceServiceRequest.FromString(a.SerializeToString() + b.SerializeToString())
    assert len(merged.resource_spans) == 2
    names = [sp.name for rs in merged.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    assert names == ["a-0", "a-1", "b-0", "b-1", "b-2"]
    assert merged.resource_spans[1].resource.attributes[0].value.string_value == "svc-b"


def test_put_refuses_past_the_byte_bound_and_ack_frees() -> None:
    async def body() -> None:
        q = MemoryQueue(max_bytes=100)
        assert await q.put(Signal.TRACES, b"x" * 60, 1)
        assert not await q.put(Signal.TRACES, b"y" * 41, 1)
        assert q.used_bytes == 60
        assert await q.put(Signal.LOGS, b"z" * 40, 2)
        lease = await q.get(max_bytes=1000, linger_s=0)
        assert lease is not None
        assert q.used_bytes == 100  # leased bytes still count until acked
        await q.ack(lease)
        assert q.used_bytes == 100 - lease.size_bytes

    run(body())


def test_get_batches_one_signal_up_to_max_bytes_in_fifo_order() -> None:
    async def body() -> None:
        q = MemoryQueue(max_bytes=10_000)
        for i in range(5):
            await q.put(Signal.TRACES, bytes([i]) * 10, 1)
        await q.put(Signal.METRICS, b"m" * 10, 4)
        first = await q.get(max_bytes=25, linger_s=0)
        assert first is not None and first.signal is Signal.TRACES
        assert first.payload == bytes([0]) * 10 + bytes([1]) * 10
        assert first.items == 2
        # Oversized single entries still go, alone.
        big = MemoryQueue(max_bytes=10_000)
        await big.put(Signal.TRACES, b"B" * 500, 7)
        lease = await big.get(max_bytes=100, linger_s=0)
        assert lease is not None and lease.items == 7 and lease.size_bytes == 500

    run(body())


def test_entries_given_as_pieces_count_and_join_like_bytes() -> None:
    """A request queued as the pieces it is made of (a trace request only enriched)
    counts its joined length against the bound and joins into the batch in order; a
    lease of one bytes entry is that very object (no copy)."""

    async def body() -> None:
        q = MemoryQueue(max_bytes=100)
        raw = b"0123456789" * 4
        pieces = [memoryview(raw)[:10], b"-new-", memoryview(raw)[30:]]
        assert await q.put(Signal.TRACES, pieces, 2)
        assert q.used_bytes == 25
        assert not await q.put(Signal.TRACES, [b"x" * 40, memoryview(b"y" * 36)], 1)
        assert await q.put(Signal.TRACES, b"tail", 1)
        lease = await q.get(max_bytes=1000, linger_s=0)
        assert lease is not None
        assert lease.payload == b"0123456789-new-0123456789tail"
        assert (lease.items, lease.size_bytes, q.used_bytes) == (3, 29, 29)
        await q.ack(lease)
        assert q.used_bytes == 0
        alone = b"z" * 30
        assert await q.put(Signal.LOGS, alone, 1)
        lease = await q.get(max_bytes=1000, linger_s=0)
        assert lease is not None and lease.payload is alone

    run(body())


def test_a_busy_signal_does_not_starve_an_older_one() -> None:
    async def body() -> None:
        q = MemoryQueue(max_bytes=10_000)
        await q.put(Signal.METRICS, b"m" * 10, 1)  # older, small: lingering
        for _ in range(4):
            await q.put(Signal.TRACES, b"t" * 50, 1)  # newer, a full batch twice over
        await asyncio.sleep(0.06)
        first = await q.get(max_bytes=100, linger_s=0.05)
        assert first is not None and first.signal is Signal.METRICS

    run(body())


def test_get_lingers_for_more_until_the_size_is_reached() -> None:
    async def body() -> None:
        q = MemoryQueue(max_bytes=10_000)
        await q.put(Signal.TRACES, b"a" * 10, 1)
        getter = asyncio.create_task(q.get(max_bytes=30, linger_s=60))
        await asyncio.sleep(0.05)
        assert not getter.done()  # 10 of 30 bytes, oldest far younger than 60 s
        await q.put(Signal.TRACES, b"b" * 10, 1)
        await q.put(Signal.TRACES, b"c" * 10, 1)
        lease = await asyncio.wait_for(getter, 5)
        assert lease is not None and lease.items == 3

    run(body())


def test_drain_hands_out_the_rest_then_none_and_close_reports_losses() -> None:
    async def body() -> None:
        q = MemoryQueue(max_bytes=10_000)
        await q.put(Signal.TRACES, b"a" * 10, 3)
        await q.put(Signal.LOGS, b"l" * 10, 5)
        getter = asyncio.create_task(q.get(max_bytes=1000, linger_s=3600))
        await asyncio.sleep(0.02)
        q.drain()
        first = await asyncio.wait_for(getter, 5)
        assert first is not None
        second = await q.get(max_bytes=1000, linger_s=3600)
        assert second is not None and {first.signal, second.signal} == {Signal.TRACES, Signal.LOGS}
        assert await q.get(max_bytes=1000, linger_s=3600) is None
        await q.ack(first)
        lost = await q.close()  # ``second`` was leased and never acked
        assert lost == {second.signal: second.items}
        assert q.used_bytes == 0

    run(body())


def test_backoff_grows_caps_and_jitters_within_bounds() -> None:
    cfg = QueueConfig(retry_initial_interval_s=1.0, retry_max_interval_s=8.0, retry_multiplier=2.0)
    low = Backoff(cfg, rng=lambda: 0.0)
    high = Backoff(cfg, rng=lambda: 1.0)
    assert [low.delay_s(n) for n in (1, 2, 3, 4, 5, 10_000)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert [high.delay_s(n) for n in (1, 2, 3, 4, 5)] == [1.5, 3.0, 6.0, 12.0, 12.0]


class _Unused(Exporter):
    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        raise AssertionError("not started")

    async def close(self) -> None:
        pass


def test_the_queue_stage_queues_an_only_enriched_trace_request_as_its_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A trace request the stages only enriched is queued as its pieces (copied once,
    into its batch); one a stage removed a ScopeSpans from is serialized at once (what
    it would keep referenced of the received bytes is not what the queue counts). Both
    batch into what their serialization is, counted at that length. (Pieces of these
    small requests average under PIECE_MIN_BYTES: lowered here, tested below.)"""
    monkeypatch.setattr(export_stage, "PIECE_MIN_BYTES", 1)

    async def body() -> None:
        metrics = SelfMetrics()
        queue = MemoryQueue(max_bytes=1 << 20)
        stage = QueueStage(queue, Sender(queue, _Unused(), QueueConfig(), metrics), metrics, 1.0)
        two = trace_request("e", 3)
        two.resource_spans.add().CopyFrom(trace_request("f", 2).resource_spans[0])
        enriched, gated, untouched = (trace_view(two) for _ in range(3))
        enriched.blocks[1].resource_out = b"\n\x0b\n\x01k\x12\x06\n\x04new!"
        del gated.blocks[0].scopes[0]
        gated.blocks[0].edited = True
        expected = []
        for view in (enriched, gated, untouched):
            expected.append(view.SerializeToString())
            await stage.consume(Batch(Signal.TRACES, view, view.span_count()))
        kinds = [type(e.payload) for e in queue._pending[Signal.TRACES]]
        assert kinds == [list, bytes, list]
        assert queue.used_bytes == sum(map(len, expected))
        lease = await queue.get(max_bytes=1 << 20, linger_s=0)
        assert lease is not None and lease.payload == b"".join(expected)
        merged = ExportTraceServiceRequest.FromString(lease.payload)
        assert [len(rs.scope_spans) for rs in merged.resource_spans] == [1, 1, 0, 1, 1, 1]
        assert merged.resource_spans[1].resource.attributes[0].key == "k"
        await queue.ack(lease)
        await stage.consume(Batch(Signal.TRACES, untouched, untouched.span_count()))
        alone = await queue.get(max_bytes=1 << 20, linger_s=0)
        assert alone is not None and alone.payload is untouched.raw  # never copied

    run(body())


def test_a_request_of_small_pieces_is_queued_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces averaging under PIECE_MIN_BYTES are joined when queued: their objects
    (~200 bytes a slice) would weigh too much beside what the queue counts."""
    monkeypatch.setattr(export_stage, "PIECE_MIN_BYTES", 512)

    async def body() -> None:
        metrics = SelfMetrics()
        queue = MemoryQueue(max_bytes=1 << 20)
        stage = QueueStage(queue, Sender(queue, _Unused(), QueueConfig(), metrics), metrics, 1.0)
        small, large = trace_view(trace_request("s", 3)), trace_view(trace_request("l", 250))
        for view in (small, large):
            view.blocks[0].resource_out = b"\n\x0b\n\x01k\x12\x06\n\x04new!"
            assert len(view.parts()) == 6
            await stage.consume(Batch(Signal.TRACES, view, view.span_count()))
        entries = list(queue._pending[Signal.TRACES])
        assert [type(e.payload) for e in entries] == [bytes, list]
        assert entries[0].size < 512 * 6 <= entries[1].size
        assert [e.size for e in entries] == [len(v.SerializeToString()) for v in (small, large)]

    run(body())
