"""The local store: writes through the writer thread, reads, retention, metric points."""

from __future__ import annotations

import asyncio
import time
from contextlib import closing
from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.exporter import Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.store import db, queries, stats
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.exporter import LocalStoreExporter, StoreOpenError
from gym_sidecar.store.writer import StoreMetrics
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from testkit.otlp_samples import set_attrs
from testkit.rollout_requests import (
    AGENT,
    RESOURCES,
    Rollout,
    count_request,
    histogram_request,
    trace_request,
)
from testkit.wait import wait_for_async

MiB = 1024 * 1024
NOW = time.time_ns()


def _sample(m: StoreMetrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    return float(value or 0.0)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "store" / "traces.db"


def _export(path: Path, cfg: LocalStoreConfig, *payloads: tuple[Signal, bytes]) -> StoreMetrics:
    metrics = StoreMetrics()

    async def body() -> None:
        exporter = LocalStoreExporter(path, cfg, metrics)
        results = await asyncio.gather(*(exporter.export(s, p, 1) for s, p in payloads))
        await exporter.close()
        assert all(r.outcome is Outcome.SUCCESS for r in results), results

    asyncio.run(body())
    return metrics


def test_spans_round_trip_with_resource_attributes_and_rollout_ids(path: Path) -> None:
    rollouts = [Rollout(f"{i}-0", NOW - 10**9 + i * 10**6, 10 + i) for i in range(5)]
    payload = trace_request(rollouts).SerializeToString()
    metrics = _export(path, LocalStoreConfig(), (Signal.TRACES, payload))
    assert _sample(metrics, "gym_sidecar_store_written_items_total", signal="traces") == 25
    with closing(db.connect(path, readonly=True)) as conn:
        rows = queries.rollouts(conn, limit=10)
        assert [r.rollout_id for r in rows] == [f"{i}-0" for i in reversed(range(5))]
        assert rows[0].span_count == 5
        assert rows[0].services == (AGENT, RESOURCES)
        assert rows[0].verify == "ok"
        assert rows[-1].duration_ms == pytest.approx(10.0)
        spans = queries.trace_spans(conn, rows[0].trace_id)
        verify = next(s for s in spans if s.name == semconv.SPAN_VERIFY)
        assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True
        assert verify.service == RESOURCES
        assert verify.scope == semconv.scope_name(semconv.GROUP_VERIFY)
        assert verify.rollout_id == "4-0"
        run = next(s for s in spans if s.name == "POST /run")
        assert run.service == AGENT and run.parent_span_id is None
        assert run.attributes["http.route"] == "/run"
        assert {s.parent_span_id for s in spans} - {None} <= {s.span_id for s in spans}
        assert queries.find_traces(conn, "4-0") == [rows[0].trace_id]
        assert queries.find_traces(conn, rows[0].trace_id[:10]) == [rows[0].trace_id]
        assert queries.find_traces(conn, "no-such-rollout") == []


def test_undecodable_payload_is_a_permanent_error(path: Path) -> None:
    metrics = StoreMetrics()

    async def body() -> None:
        exporter = LocalStoreExporter(path, LocalStoreConfig(), metrics)
        bad = await exporter.export(Signal.TRACES, b"\xff\xff\xff", 1)
        good = await exporter.export(
            Signal.TRACES, trace_request([Rollout("2-0", NOW, 5)]).SerializeToString(), 5
        )
        await exporter.close()
        closed = await exporter.export(Signal.TRACES, b"", 0)
        assert bad.outcome is Outcome.PERMANENT and "decode" in bad.message
        assert good.outcome is Outcome.SUCCESS
        assert closed.outcome is Outcome.PERMANENT

    asyncio.run(body())
    assert _sample(metrics, "gym_sidecar_store_failed_requests_total", reason="decode") == 1


def test_failed_filter_slowest_and_service(path: Path) -> None:
    rollouts = [
        Rollout(f"{i}-0", NOW - 10**9 + i * 10**6, 10 * (i + 1), i % 4 != 3) for i in range(8)
    ]
    _export(path, LocalStoreConfig(), (Signal.TRACES, trace_request(rollouts).SerializeToString()))
    with closing(db.connect(path, readonly=True)) as conn:
        failed = queries.rollouts(conn, failed_only=True)
        assert sorted(r.rollout_id for r in failed) == ["3-0", "7-0"]
        assert all(r.verify == "failed" and r.error for r in failed)
        slowest = queries.rollouts(conn, slowest=2)
        assert [r.rollout_id for r in slowest] == ["7-0", "6-0"]
        assert len(queries.rollouts(conn, service="weather")) == 8
        assert queries.rollouts(conn, service="math") == []
        assert queries.rollouts(conn, since_s=0.5, now_ns=NOW) == []


def test_a_relayed_rollout_is_one_row_and_fails_with_its_inner_span(path: Path) -> None:
    """A relay's /run and the agent /run it relays (marked nested): one rollout."""
    rollouts = [Rollout(f"{i}-0", NOW - 10**9 + i * 10**6, 10) for i in range(3)]
    request = trace_request(rollouts)
    relay = request.resource_spans.add()
    set_attrs(relay.resource.attributes, {semconv.SERVICE_NAME: "nemo-gym/relay"})
    scope = relay.scope_spans.add()
    scope.scope.name = semconv.scope_name(semconv.GROUP_ROLLOUT)
    agent_rollouts = [
        span
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name == semconv.SPAN_ROLLOUT
    ]
    for i, inner in enumerate(agent_rollouts):
        outer = scope.spans.add()
        outer.CopyFrom(inner)
        outer.span_id = bytes([i + 1]) * 8
        outer.start_time_unix_nano -= 1000
        outer.end_time_unix_nano += 1000
        set_attrs(inner.attributes, {semconv.ROLLOUT_NESTED: True})
    agent_rollouts[1].status.code = Status.STATUS_CODE_ERROR  # the relayed agent run failed
    _export(path, LocalStoreConfig(), (Signal.TRACES, request.SerializeToString()))
    with closing(db.connect(path, readonly=True)) as conn:
        rows = queries.rollouts(conn)
        assert sorted(r.rollout_id for r in rows) == ["0-0", "1-0", "2-0"]
        assert all("nemo-gym/relay" in r.services for r in rows)
        [failed] = queries.rollouts(conn, failed_only=True)
        assert failed.rollout_id == "1-0" and failed.error
        assert queries.store_counts(conn)["rollouts"] == 3
        assert stats.compute(conn, None).rollout_spans.count == 3


def test_retention_by_age_deletes_and_counts(path: Path) -> None:
    cfg = LocalStoreConfig(max_age_s=0.3, prune_interval_s=0.05)
    metrics = StoreMetrics()

    async def body() -> None:
        exporter = LocalStoreExporter(path, cfg, metrics)
        payload = trace_request([Rollout("1-0", NOW, 5)]).SerializeToString()
        await exporter.export(Signal.TRACES, payload, 5)
        with closing(db.connect(path, readonly=True)) as conn:
            assert queries.store_counts(conn)["spans"] == 5
            # The pruner runs every 50 ms: wait for it, however slow the machine.
            await wait_for_async(lambda: not queries.store_counts(conn)["spans"], 60)
            assert queries.store_counts(conn)["spans"] == 0
        await exporter.close()

    asyncio.run(body())
    assert _sample(metrics, "gym_sidecar_store_pruned_items_total", reason="max_age") == 5


def _used_bytes(path: Path) -> int:
    with closing(db.connect(path, readonly=True)) as conn:
        return int(db.used_bytes(conn))


def test_retention_by_size_keeps_the_newest_under_the_bound(path: Path) -> None:
    cfg = LocalStoreConfig(max_bytes=1 * MiB, prune_interval_s=0.05)
    metrics = StoreMetrics()
    pad = "x" * 3000

    async def body() -> None:
        exporter = LocalStoreExporter(path, cfg, metrics)
        for batch in range(12):  # 12 x 40 rollouts x 5 spans x ~3 KB = ~7 MB written
            rollouts = [Rollout(f"{batch}-{i}", NOW, 5, pad=pad) for i in range(40)]
            result = await exporter.export(
                Signal.TRACES, trace_request(rollouts).SerializeToString(), 200
            )
            assert result.outcome is Outcome.SUCCESS
            await asyncio.sleep(0.06)  # let the pruner run between batches
        # It prunes down to the bound: waited for, not assumed done within some time.
        pruned_to_bound = await wait_for_async(
            lambda: (
                _sample(metrics, "gym_sidecar_store_pruned_items_total", reason="max_bytes") > 0
                and _used_bytes(path) <= cfg.max_bytes
            ),
            60,
        )
        await exporter.close()
        assert pruned_to_bound

    asyncio.run(body())
    pruned = _sample(metrics, "gym_sidecar_store_pruned_items_total", reason="max_bytes")
    assert pruned > 0
    with closing(db.connect(path)) as conn:
        assert db.used_bytes(conn) <= cfg.max_bytes
        ids = {r[0] for r in conn.execute("SELECT DISTINCT rollout_id FROM gym_spans")}
        assert "11-39" in ids  # the newest survived
        assert "0-0" not in ids  # the oldest went
        assert queries.find_traces(conn, "0-0") == []
        left = queries.store_counts(conn)["spans"]
    assert left + pruned == 12 * 200


def test_metric_points_only_gym_names_and_stats_over_a_window(path: Path) -> None:
    bounds = [10.0, 100.0, 1000.0]
    t0, t1, t2 = NOW - 60 * 10**9, NOW - 30 * 10**9, NOW - 10**9
    rollout = semconv.METRIC_ROLLOUT_DURATION
    payloads = [
        (
            Signal.METRICS,
            histogram_request(rollout, bounds, [1, 1, 0, 0], t0, t1).SerializeToString(),
        ),
        (
            Signal.METRICS,
            histogram_request(rollout, bounds, [1, 5, 4, 0], t0, t2).SerializeToString(),
        ),
        (Signal.METRICS, count_request(3, 1, t0, t1).SerializeToString()),
        (Signal.METRICS, count_request(9, 3, t0, t2).SerializeToString()),
    ]
    metrics = _export(path, LocalStoreConfig(), *payloads)
    # 2 histogram points + 4 count points; the non-gym gauges were skipped
    assert _sample(metrics, "gym_sidecar_store_written_items_total", signal="metrics") == 6
    with closing(db.connect(path, readonly=True)) as conn:
        everything = stats.compute(conn, None, now_ns=NOW)
        # cumulative: the last point holds everything
        assert everything.rollout_points.count == 10
        assert everything.verify_point_success == (9, 12)
        recent = stats.compute(conn, 20, now_ns=NOW)
        # the window starts after t1: last point minus the one before the window
        assert recent.rollout_points.count == 8
        assert recent.verify_point_success == (6, 8)
        # buckets [0,4,4]: p50 is the 4th of 8 values, at the top of (10, 100]
        assert recent.rollout_points.quantiles[0] == pytest.approx(100.0)


def test_delta_points_add_up(path: Path) -> None:
    delta = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    name = semconv.METRIC_VERIFY_DURATION
    payloads = [
        (
            Signal.METRICS,
            histogram_request(
                name, [1.0, 2.0], [2, 0, 0], NOW - 2, NOW - 1, delta
            ).SerializeToString(),
        ),
        (
            Signal.METRICS,
            histogram_request(name, [1.0, 2.0], [0, 2, 0], NOW - 1, NOW, delta).SerializeToString(),
        ),
    ]
    _export(path, LocalStoreConfig(), *payloads)
    with closing(db.connect(path, readonly=True)) as conn:
        result = stats.compute(conn, None, now_ns=NOW)
    assert result.verify_points.count == 4


def test_span_percentiles_and_success_fraction(path: Path) -> None:
    rollouts = [Rollout(f"{i}-0", NOW - 10**9, 10 * (i + 1), i >= 3) for i in range(20)]
    _export(path, LocalStoreConfig(), (Signal.TRACES, trace_request(rollouts).SerializeToString()))
    with closing(db.connect(path, readonly=True)) as conn:
        result = stats.compute(conn, 60, now_ns=NOW)
    assert result.rollout_spans.count == 20
    assert result.rollout_spans.quantiles == pytest.approx((100.0, 190.0, 200.0))
    assert result.verify_span_success == (17, 20)


def test_bucket_quantile() -> None:
    assert stats.bucket_quantile([10, 20], [0, 0, 0], 0.5) is None
    assert stats.bucket_quantile([10, 20], [10, 0, 0], 0.5) == pytest.approx(5.0)
    assert stats.bucket_quantile([10, 20], [0, 10, 0], 0.9) == pytest.approx(19.0)
    assert stats.bucket_quantile([10, 20], [0, 0, 3], 0.5) == 20  # overflow: last bound
    # the extremes narrow the bucket the estimate is drawn in
    assert stats.bucket_quantile([500, 1000], [30, 0, 0], 0.5, 20.0, 240.0) == pytest.approx(130.0)
    assert stats.bucket_quantile([10, 20], [0, 10, 0], 0.9, 12.0, 30.0) == pytest.approx(19.2)
    assert stats.bucket_quantile([10, 20], [0, 0, 3], 0.5, 5.0, 42.0) == 42.0  # overflow: max


def test_point_extremes_bound_the_estimated_percentiles(path: Path) -> None:
    """All 30 rollouts under the first bound (500 ms): without min and max the median
    would read 250 ms whatever the values; with them it is drawn between them, and one
    point without them makes them unknown again."""
    rollout = semconv.METRIC_ROLLOUT_DURATION
    bounds = [500.0, 1000.0]
    t0, t1 = NOW - 60 * 10**9, NOW - 10**9
    with_extremes = histogram_request(rollout, bounds, [30, 0, 0], t0, t1, extremes=(20.0, 240.0))
    _export(path, LocalStoreConfig(), (Signal.METRICS, with_extremes.SerializeToString()))
    with closing(db.connect(path, readonly=True)) as conn:
        p50 = stats.compute(conn, None, now_ns=NOW).rollout_points.quantiles[0]
    assert p50 == pytest.approx(130.0)
    other = histogram_request(rollout, bounds, [2, 0, 0], t0, t1, service="another")
    _export(path, LocalStoreConfig(), (Signal.METRICS, other.SerializeToString()))
    with closing(db.connect(path, readonly=True)) as conn:
        p50 = stats.compute(conn, None, now_ns=NOW).rollout_points.quantiles[0]
    assert p50 == pytest.approx(250.0)  # the 16th of 32 in [0, 500), no extremes known


def test_reader_on_missing_store_says_so(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        db.connect(tmp_path / "none.db", readonly=True)


def test_newer_schema_is_refused(path: Path) -> None:
    with closing(db.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version={db.SCHEMA_VERSION + 1}")
    with pytest.raises(db.StoreVersionError):
        db.connect(path)


def test_a_file_that_is_not_a_store_fails_to_open_with_an_oserror(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    path.write_bytes(b"not a database, just some bytes" * 100)
    with pytest.raises(StoreOpenError, match="cannot open the local store"):
        LocalStoreExporter(path, LocalStoreConfig(), StoreMetrics())
    assert issubclass(StoreOpenError, OSError)  # the CLI reports it: exit 1, not a traceback
