"""The fan-out exporter: a real OTLP/gRPC backend (recording sink) plus the local store."""

from __future__ import annotations

import asyncio
import time
from contextlib import closing
from pathlib import Path

import grpc
from gym_sidecar.core.exporter import ExportResult, Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export.config import BackendConfig
from gym_sidecar.export.fanout import FanOutExporter, _combine
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter
from gym_sidecar.store import db, queries
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.exporter import LocalStoreExporter
from gym_sidecar.store.writer import StoreMetrics

from testkit.rollout_requests import Rollout, trace_request
from testkit.sink import RecordingSink


def test_backend_retry_does_not_rewrite_the_store(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    metrics = StoreMetrics()
    payload = trace_request([Rollout("1-0", time.time_ns(), 5)]).SerializeToString()

    async def body(sink: RecordingSink) -> None:
        store = LocalStoreExporter(path, LocalStoreConfig(), metrics)
        backend = OtlpGrpcExporter(BackendConfig(url=f"http://{sink.endpoint}"))
        fanout = FanOutExporter([backend, store])
        assert fanout.name == f"{backend.name}+local_store"
        sink.fail_next(1, grpc.StatusCode.UNAVAILABLE, retry_after_s=0.2)
        first = await fanout.export(Signal.TRACES, payload, 5)
        assert first.outcome is Outcome.RETRYABLE
        assert first.retry_after_s == 0.2
        with closing(db.connect(path, readonly=True)) as conn:
            assert queries.store_counts(conn)["spans"] == 5  # stored despite the backend
        second = await fanout.export(Signal.TRACES, payload, 5)
        assert second.outcome is Outcome.SUCCESS
        await fanout.close()

    with RecordingSink() as sink:
        asyncio.run(body(sink))
        assert sink.span_count == 5
    # one transaction: the retry went to the backend only
    assert metrics.registry.get_sample_value("gym_sidecar_store_transactions_total") == 1


def test_backend_permanent_error_is_permanent_and_the_store_keeps_the_data(
    tmp_path: Path,
) -> None:
    path = tmp_path / "traces.db"

    async def body(sink: RecordingSink) -> None:
        store = LocalStoreExporter(path, LocalStoreConfig(), StoreMetrics())
        backend = OtlpGrpcExporter(BackendConfig(url=f"http://{sink.endpoint}"))
        fanout = FanOutExporter([backend, store])
        payload = trace_request([Rollout("2-0", time.time_ns(), 5)]).SerializeToString()
        sink.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
        result = await fanout.export(Signal.TRACES, payload, 5)
        await fanout.close()
        assert result.outcome is Outcome.PERMANENT

    with RecordingSink() as sink:
        asyncio.run(body(sink))
    with closing(db.connect(path, readonly=True)) as conn:
        assert queries.store_counts(conn)["spans"] == 5


def test_combined_outcome_is_the_worst() -> None:
    ok, perm = ExportResult.success(), ExportResult.permanent("bad")
    retry = ExportResult.retryable("later", 1.5)
    assert _combine([ok, ok]).outcome is Outcome.SUCCESS
    assert _combine([ok, perm]).outcome is Outcome.PERMANENT
    worst = _combine([perm, retry, ExportResult.retryable("soon", 0.5)])
    assert worst.outcome is Outcome.RETRYABLE
    assert worst.retry_after_s == 1.5
    assert _combine([ok, ExportResult.success(rejected_items=3)]).rejected_items == 3
