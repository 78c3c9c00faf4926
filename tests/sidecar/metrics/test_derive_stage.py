"""Unit tests of the derive stage: spans in, exact OTLP metrics out."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.stage import Backpressure, Batch, PassThrough, Signal
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.otlp_request import SCOPE_NAME
from gym_sidecar.metrics.series import HistogramSeries, SeriesPoints
from gym_sidecar.metrics.stage import DeriveStage, build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from testkit.otlp_samples import parsed, trace_batch
from testkit.wait import wait_for_async
from tests.sidecar.metrics.collect import points
from tests.sidecar.metrics.traces import (
    RESOURCE,
    ROLLOUT_SCOPE,
    SERVER_SCOPE,
    VERIFY_SCOPE,
    SpanSpec,
    add_resource,
    request,
    rollout,
    verify,
)
from tests.support.collect_stage import CollectStage
from tests.support.ratelimit import hand_clock

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def make(**cfg: Any) -> tuple[DeriveStage, CollectStage, SelfMetrics]:
    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    stage = build_derive_stage(MetricsConfig(**cfg), tail, metrics)
    assert isinstance(stage, DeriveStage)
    return stage, tail, metrics


def traces(req: Any) -> Batch:
    """``req`` as the receivers hand it on: a batch of its wire view."""
    return trace_batch(req)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


GYM_BATCH = {
    ROLLOUT_SCOPE: [rollout(800), rollout(2000), rollout(2500), rollout(45_000), rollout(45_000)],
    VERIFY_SCOPE: [
        verify(20),
        verify(20),
        verify(20),
        verify(30, reward=0.0),  # answer judged wrong: the call still succeeded
        verify(7, succeeded=False, error_type="ValueError"),  # the verifier raised
    ],
    SERVER_SCOPE: [SpanSpec("POST /verify", 40), SpanSpec("POST /run", 50_000)],
}


def test_exact_counts_sums_and_buckets() -> None:
    stage, tail, _ = make()

    async def go() -> None:
        await stage.consume(traces(request(GYM_BATCH)))
        assert await stage.flush()

    run(go())
    [req] = tail.metric_requests()
    [rm] = req.resource_metrics
    assert rm.scope_metrics[0].scope.name == SCOPE_NAME

    [r] = points(req, semconv.METRIC_ROLLOUT_DURATION)
    assert r.resource == RESOURCE
    assert r.unit == "ms" and r.kind == "histogram" and r.temporality == CUMULATIVE
    assert r.attrs == {}  # the rollout id is never a dimension
    assert r.point.count == 5
    assert r.point.sum == pytest.approx(95_300)
    assert list(r.point.explicit_bounds) == MetricsConfig().rollout_buckets_ms
    # bounds 500, 1000, 2500, 5000, 10000, 30000, 60000, ...: upper bounds inclusive
    assert list(r.point.bucket_counts) == [0, 1, 2, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
    assert (r.point.min, r.point.max) == (800, 45_000)

    vd = {
        (p.attrs[semconv.VERIFY_SUCCEEDED], p.attrs.get(semconv.ERROR_TYPE)): p.point
        for p in points(req, semconv.METRIC_VERIFY_DURATION)
    }
    assert set(vd) == {(True, None), (False, "ValueError")}
    ok, failed = vd[(True, None)], vd[(False, "ValueError")]
    assert (ok.count, ok.sum) == (4, pytest.approx(90))
    # bounds 1, 5, 10, 25, 50, ...: 20 ms -> (10, 25], 30 ms -> (25, 50]
    assert list(ok.bucket_counts)[:6] == [0, 0, 0, 3, 1, 0]
    assert (failed.count, failed.sum) == (1, pytest.approx(7))
    assert list(failed.bucket_counts)[:4] == [0, 0, 1, 0]

    counts = {
        (p.attrs[semconv.VERIFY_SUCCEEDED], p.attrs.get(semconv.ERROR_TYPE)): (
            p.point.as_int,
            p.kind,
            p.point,
        )
        for p in points(req, semconv.METRIC_VERIFY_COUNT)
    }
    assert counts[(True, None)][:2] == (4, "sum")
    assert counts[(False, "ValueError")][:2] == (1, "sum")
    assert req.resource_metrics[0].scope_metrics[0].metrics[2].sum.is_monotonic

    [rate] = points(req, semconv.METRIC_VERIFY_SUCCESS_RATE)
    assert rate.kind == "gauge" and rate.attrs == {}
    assert rate.point.as_double == pytest.approx(0.8)


def test_succeeded_comes_from_status_when_the_attribute_is_missing() -> None:
    stage, tail, _ = make()
    specs = [
        verify(5, succeeded=None),
        verify(5, succeeded=None, error_type="TimeoutError"),
        verify(5, succeeded=False),
    ]

    async def go() -> None:
        await stage.consume(traces(request({VERIFY_SCOPE: specs})))
        await stage.flush()

    run(go())
    got = {
        tuple(sorted(p.attrs.items())): p.point.as_int
        for p in points(tail.metric_requests()[0], semconv.METRIC_VERIFY_COUNT)
    }
    assert got == {
        (("succeeded", True),): 1,
        (("error.type", "TimeoutError"), ("succeeded", False)): 1,
        (("error.type", "_OTHER"), ("succeeded", False)): 1,
    }


def test_other_scopes_and_signals_pass_untouched() -> None:
    stage, tail, metrics = make()
    req = request(
        {
            SERVER_SCOPE: [SpanSpec(semconv.SPAN_ROLLOUT, 10)],  # wrong scope
            ROLLOUT_SCOPE: [SpanSpec("something.else", 10)],
        }
    )  # wrong name
    before = req.SerializeToString()
    logs = Batch(Signal.LOGS, ExportLogsServiceRequest(), items=0)

    async def go() -> None:
        await stage.consume(traces(req))
        await stage.consume(logs)
        assert await stage.flush()

    run(go())
    assert [b.signal for b in tail.batches] == [Signal.TRACES, Signal.LOGS]
    assert tail.batches[0].message.SerializeToString() == before
    assert tail.batches[1] is logs
    assert set(stage.store.spans.values()) == {0}
    assert tail.metric_requests() == []  # nothing derived: no empty export either
    assert metrics.stage_items.labels("derive", "traces", "passed").value == 2


def test_cardinality_limit_sends_new_series_to_overflow() -> None:
    stage, tail, metrics = make(cardinality_limit=3)
    servers = [f"server-{i}" for i in range(5)]

    async def go() -> None:
        for name in servers:
            res = {**RESOURCE, semconv.SERVER_NAME: name}
            await stage.consume(
                traces(
                    request(
                        {VERIFY_SCOPE: [verify(3), verify(4)], ROLLOUT_SCOPE: [rollout(1000)]}, res
                    )
                )
            )
        await stage.flush()

    run(go())
    req = tail.metric_requests()[0]
    for name in (
        semconv.METRIC_ROLLOUT_DURATION,
        semconv.METRIC_VERIFY_DURATION,
        semconv.METRIC_VERIFY_COUNT,
        semconv.METRIC_VERIFY_SUCCESS_RATE,
    ):
        pts = points(req, name)
        regular = [p for p in pts if "otel.metric.overflow" not in p.attrs]
        [overflow] = [p for p in pts if p.attrs.get("otel.metric.overflow") is True]
        assert len(regular) == 2, name  # limit 3 = 2 series + the overflow series
        assert {p.resource[semconv.SERVER_NAME] for p in regular} == {"server-0", "server-1"}
        assert overflow.resource == {} and overflow.attrs == {"otel.metric.overflow": True}
        if name == semconv.METRIC_VERIFY_COUNT:
            assert overflow.point.as_int == 6
        elif name == semconv.METRIC_ROLLOUT_DURATION:
            assert overflow.point.count == 3
    overflowed = {k: n for k, n in stage.store.overflow_points.items() if n}
    assert overflowed == {
        semconv.METRIC_ROLLOUT_DURATION: 3,
        semconv.METRIC_VERIFY_DURATION: 6,
        semconv.METRIC_VERIFY_COUNT: 6,
        semconv.METRIC_VERIFY_SUCCESS_RATE: 6,
    }
    assert semconv.METRIC_ENV_STEP_COUNT in stage.store.overflow_points  # counted, zero
    assert metrics.limit_hits.labels("metrics.cardinality_limit").value == 21
    text = metrics.render().decode()
    assert 'gym_sidecar_derived_overflow_points_total{metric="gym.verify.count"} 6.0' in text


def test_exemplars_carry_the_span_and_trace_ids() -> None:
    stage, tail, _ = make()
    fast, slow = verify(3), verify(2000)
    r = rollout(61_000)

    async def go() -> None:
        await stage.consume(traces(request({VERIFY_SCOPE: [fast, slow], ROLLOUT_SCOPE: [r]})))
        await stage.flush()
        await stage.flush()  # exemplars belong to the interval they were seen in

    run(go())
    first, second = tail.metric_requests()
    [vp] = points(first, semconv.METRIC_VERIFY_DURATION)
    got = {(e.trace_id, e.span_id, e.as_double) for e in vp.point.exemplars}
    assert got == {(fast.trace_id, fast.span_id, 3.0), (slow.trace_id, slow.span_id, 2000.0)}
    [rp] = points(first, semconv.METRIC_ROLLOUT_DURATION)
    [ex] = rp.point.exemplars
    assert (ex.trace_id, ex.span_id) == (r.trace_id, r.span_id)
    assert ex.time_unix_nano == r.start_ns + 61_000 * 1_000_000
    [vp2] = points(second, semconv.METRIC_VERIFY_DURATION)
    assert vp2.point.count == 2 and len(vp2.point.exemplars) == 0


def test_each_bucket_keeps_its_latest_span_as_exemplar_per_series() -> None:
    """Ids are read only for exemplar candidates: the last span of each bucket of each
    series wins, across blocks of a request too; ok and failed verifications in the same
    bucket are different series and each keeps its own."""
    stage, tail, _ = make()
    ok1, ok2, failed, ok3 = verify(3), verify(3.5), verify(3.2, succeeded=False), verify(4)
    early, late, other = rollout(61_000), rollout(62_000), rollout(700)
    later_block = verify(4.5)

    async def go() -> None:
        req = request({VERIFY_SCOPE: [ok1, ok2, failed, ok3], ROLLOUT_SCOPE: [early, late, other]})
        await stage.consume(traces(req))
        await stage.consume(traces(request({VERIFY_SCOPE: [later_block]})))
        await stage.flush()

    run(go())
    [first] = tail.metric_requests()
    by_ok = {
        p.attrs[semconv.VERIFY_SUCCEEDED]: p.point
        for p in points(first, semconv.METRIC_VERIFY_DURATION)
    }
    assert by_ok[True].count == 4 and by_ok[False].count == 1
    [ex_ok] = by_ok[True].exemplars  # 3, 3.5, 4, 4.5 ms: all in the (1, 5] bucket
    assert (ex_ok.trace_id, ex_ok.span_id, ex_ok.as_double) == (
        later_block.trace_id,
        later_block.span_id,
        4.5,
    )
    [ex_failed] = by_ok[False].exemplars
    assert (ex_failed.trace_id, ex_failed.span_id) == (failed.trace_id, failed.span_id)
    [rp] = points(first, semconv.METRIC_ROLLOUT_DURATION)
    got = {(e.trace_id, e.span_id) for e in rp.point.exemplars}
    assert got == {(late.trace_id, late.span_id), (other.trace_id, other.span_id)}


def test_success_rate_is_windowed_per_interval() -> None:
    stage, tail, _ = make()

    async def go() -> None:
        await stage.consume(
            traces(
                request(
                    {
                        VERIFY_SCOPE: [
                            verify(1),
                            verify(1),
                            verify(1),
                            verify(1, succeeded=False, error_type="E"),
                        ]
                    }
                )
            )
        )
        await stage.flush()
        await stage.consume(
            traces(request({VERIFY_SCOPE: [verify(1), verify(1, succeeded=False, error_type="E")]}))
        )
        await stage.flush()
        await stage.flush()  # a window with no verifications: no rate point

    run(go())
    rates = [
        [p.point.as_double for p in points(r, semconv.METRIC_VERIFY_SUCCESS_RATE)]
        for r in tail.metric_requests()
    ]
    assert rates == [[pytest.approx(0.75)], [pytest.approx(0.5)], []]  # not 4/6 cumulative
    first, second = (
        points(r, semconv.METRIC_VERIFY_SUCCESS_RATE)[0].point for r in tail.metric_requests()[:2]
    )
    assert second.start_time_unix_nano == first.time_unix_nano


@pytest.mark.parametrize("temporality", ["cumulative", "delta"])
def test_temporality(temporality: str) -> None:
    stage, tail, _ = make(temporality=temporality)

    async def go() -> None:
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(1000), rollout(3000)]})))
        await stage.flush()
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(7000)]})))
        await stage.flush()
        await stage.flush()

    run(go())
    series = [points(r, semconv.METRIC_ROLLOUT_DURATION) for r in tail.metric_requests()]
    if temporality == "cumulative":
        assert [len(s) for s in series] == [1, 1, 1]  # every series, every interval
        a, b, c = (s[0].point for s in series)
        assert series[0][0].temporality == CUMULATIVE
        assert [(p.count, p.sum) for p in (a, b, c)] == [(2, 4000), (3, 11000), (3, 11000)]
        assert a.start_time_unix_nano == b.start_time_unix_nano == c.start_time_unix_nano
        assert list(b.bucket_counts)[:5] == [0, 1, 0, 1, 1]
    else:
        assert [len(s) for s in series] == [1, 1]  # nothing new: no third export at all
        a, b = (s[0].point for s in series[:2])
        assert series[0][0].temporality == DELTA
        assert [(p.count, p.sum) for p in (a, b)] == [(2, 4000), (1, 7000)]
        assert list(b.bucket_counts)[:5] == [0, 0, 0, 0, 1]
        assert b.start_time_unix_nano == a.time_unix_nano
        assert (b.min, b.max) == (7000, 7000)


def test_backpressure_keeps_the_points_for_the_next_interval() -> None:
    stage, tail, metrics = make(temporality="delta")

    async def go() -> None:
        await stage.consume(traces(request({VERIFY_SCOPE: [verify(1), verify(2)]})))
        tail.refuse = 1
        assert not await stage.flush()
        await stage.consume(traces(request({VERIFY_SCOPE: [verify(3)]})))
        assert await stage.flush()

    run(go())
    [req] = tail.metric_requests()
    [p] = points(req, semconv.METRIC_VERIFY_DURATION)
    assert (p.point.count, p.point.sum) == (3, 6)
    [rate] = points(req, semconv.METRIC_VERIFY_SUCCESS_RATE)
    assert rate.point.as_double == 1.0
    assert stage.store.exports == {"sent": 1, "backpressure": 1, "error": 0}
    assert 'gym_sidecar_derived_exports_total{outcome="backpressure"} 1.0' in (
        metrics.render().decode()
    )


def test_timer_exports_and_shutdown_flushes_the_last_interval() -> None:
    stage, tail, _ = make(interval_s=0.05)

    async def go() -> None:
        await stage.start()
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(1000)]})))
        assert await wait_for_async(tail.metric_requests, 60), "the timer exported nothing"
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(2000)]})))
        await stage.shutdown(5.0)
        await stage.shutdown(5.0)  # safe twice

    run(go())
    last = points(tail.metric_requests()[-1], semconv.METRIC_ROLLOUT_DURATION)[0].point
    assert (last.count, last.sum) == (2, 3000)


def test_shutdown_retries_while_the_queue_pushes_back() -> None:
    stage, tail, _ = make(interval_s=3600)

    async def go() -> None:
        await stage.start()
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(1000)]})))
        tail.refuse = 3
        await stage.shutdown(5.0)

    run(go())
    assert len(tail.metric_requests()) == 1
    assert stage.store.exports["backpressure"] == 3


def test_invalid_spans_are_counted_and_skipped() -> None:
    stage, tail, metrics = make()
    bad = rollout(1000)
    req = request({ROLLOUT_SCOPE: [bad, rollout(5)]})
    sp = req.resource_spans[0].scope_spans[0].spans[0]
    sp.end_time_unix_nano = sp.start_time_unix_nano - 1

    async def go() -> None:
        await stage.consume(traces(req))
        await stage.flush()

    run(go())
    assert stage.store.invalid_spans == 1
    assert points(tail.metric_requests()[0], semconv.METRIC_ROLLOUT_DURATION)[0].point.count == 1
    assert "gym_sidecar_derived_invalid_spans_total 1.0" in metrics.render().decode()


def test_disabled_is_a_pass_through() -> None:
    metrics = SelfMetrics()
    stage = build_derive_stage(MetricsConfig(enabled=False), CollectStage(metrics), metrics)
    assert isinstance(stage, PassThrough)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"rollout_buckets_ms": []}, "at least one"),
        ({"verify_buckets_ms": [1, 5, 5]}, "strictly increasing"),
        ({"verify_buckets_ms": [1, float("inf")]}, "finite"),
        ({"cardinality_limit": 1}, "greater than or equal to 2"),
        ({"interval_s": 0}, "greater than 0"),
        ({"temporality": "sometimes"}, "cumulative"),
    ],
)
def test_config_is_validated(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MetricsConfig(**cfg)


def test_a_trace_batch_refused_downstream_counts_once_when_retried() -> None:
    stage, tail, _ = make()
    req = request({VERIFY_SCOPE: [verify(5), verify(6)], ROLLOUT_SCOPE: [rollout(100)]})

    async def go() -> None:
        tail.refuse = 1
        with pytest.raises(Backpressure):
            await stage.consume(traces(req))
        await stage.consume(traces(req))  # the client's retry
        await stage.flush()

    run(go())
    req_out = tail.metric_requests()[0]
    [v] = points(req_out, semconv.METRIC_VERIFY_DURATION)
    [r] = points(req_out, semconv.METRIC_ROLLOUT_DURATION)
    assert (v.point.count, r.point.count) == (2, 1)
    assert {k: v for k, v in stage.store.spans.items() if v} == {
        semconv.SPAN_ROLLOUT: 1,
        semconv.SPAN_VERIFY: 2,
    }


def test_spans_without_ids_give_no_exemplar_and_exemplars_can_be_off() -> None:
    stage, tail, _ = make(exemplars=False)
    stage2, tail2, _ = make()
    no_ids = verify(5, trace_id=b"", span_id=b"")

    async def go() -> None:
        await stage.consume(traces(request({VERIFY_SCOPE: [verify(5)]})))
        await stage.flush()
        await stage2.consume(traces(request({VERIFY_SCOPE: [no_ids]})))
        await stage2.flush()

    run(go())
    for t in (tail, tail2):
        [v] = points(t.metric_requests()[0], semconv.METRIC_VERIFY_DURATION)
        assert v.point.count == 1 and len(v.point.exemplars) == 0


def test_shutdown_gives_up_after_half_the_deadline_while_pushed_back() -> None:
    # Half of a 6 s deadline is 3 s: a loaded machine's scheduling delays (tenths of a
    # second) stay far from the bound, which is what separates "half" from "all of it".
    deadline_s = 6.0
    stage, tail, _ = make(interval_s=3600)

    async def go() -> float:
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(1000)]})))
        tail.refuse = 10_000
        t0 = asyncio.get_running_loop().time()
        await stage.shutdown(deadline_s)
        return asyncio.get_running_loop().time() - t0

    took = run(go())
    assert tail.metric_requests() == []
    assert stage.store.exports["backpressure"] >= 2
    assert took < 0.95 * deadline_s  # the queue behind keeps the rest of the deadline


# --- span groups: metrics mode by default, off groups not derived (issue 15.1) ----------


def derive_then_gate(**span_groups: Any) -> tuple[DeriveStage, CollectStage]:
    """derive -> gate -> collect, wired the way ``build_pipeline`` wires them."""
    from gym_sidecar.gating.config import SpanGroupsConfig
    from gym_sidecar.gating.stage import build_gate_stage

    metrics = SelfMetrics()
    tail = CollectStage(metrics)
    gate = build_gate_stage(SpanGroupsConfig(**span_groups), tail, metrics)
    stage = build_derive_stage(MetricsConfig(), gate, metrics, gate.enabled_groups)
    assert isinstance(stage, DeriveStage)
    return stage, tail


def derived_and_forwarded(stage: DeriveStage, tail: CollectStage) -> tuple[set[str], set[str]]:
    async def go() -> None:
        await stage.consume(traces(request(GYM_BATCH)))
        await stage.flush()

    run(go())
    derived = {p.metric for req in tail.metric_requests() for p in points(req)}
    forwarded = {
        ss.scope.name
        for b in tail.batches
        if b.signal is Signal.TRACES
        for rs in parsed(b.message).resource_spans
        for ss in rs.scope_spans
    }
    return derived, forwarded


ALL_DERIVED = {
    semconv.METRIC_ROLLOUT_DURATION,
    semconv.METRIC_VERIFY_DURATION,
    semconv.METRIC_VERIFY_COUNT,
    semconv.METRIC_VERIFY_SUCCESS_RATE,
}


def test_default_span_groups_derive_every_metric_and_forward_no_verify_span() -> None:
    derived, forwarded = derived_and_forwarded(*derive_then_gate())
    assert derived == ALL_DERIVED
    assert forwarded == {ROLLOUT_SCOPE, SERVER_SCOPE}


def test_spans_of_an_off_group_are_not_derived() -> None:
    # A stale agent still sends verify spans although verify is off: no gym.verify.*.
    derived, forwarded = derived_and_forwarded(*derive_then_gate(modes={"verify": "off"}))
    assert derived == {semconv.METRIC_ROLLOUT_DURATION}
    assert forwarded == {ROLLOUT_SCOPE, SERVER_SCOPE}


def test_off_is_decided_per_service() -> None:
    service = RESOURCE[semconv.SERVICE_NAME]
    stage, tail = derive_then_gate(services={service: {"spec": "default,-rollout,-verify"}})
    derived, _ = derived_and_forwarded(stage, tail)
    assert derived == set()
    stage, tail = derive_then_gate(services={"another-service": {"modes": {"verify": "off"}}})
    assert derived_and_forwarded(stage, tail)[0] == ALL_DERIVED


def test_nested_rollout_spans_give_no_point() -> None:
    """A relayed /run (marked nested) is part of the relay's rollout: one point only."""
    stage, tail, metrics = make()
    nested = rollout(900)
    nested.attrs[semconv.ROLLOUT_NESTED] = True
    batch = {ROLLOUT_SCOPE: [rollout(1000), nested, rollout(3000)]}

    async def go() -> None:
        await stage.consume(traces(request(batch)))
        assert await stage.flush()

    run(go())
    [req] = tail.metric_requests()
    [r] = points(req, semconv.METRIC_ROLLOUT_DURATION)
    assert r.point.count == 2 and r.point.sum == pytest.approx(4000.0)
    assert stage.store.spans[semconv.SPAN_ROLLOUT] == 2
    assert stage.store.spans["gym.rollout.nested"] == 1
    sample = metrics.registry.get_sample_value(
        "gym_sidecar_derived_spans_total", {"span": "gym.rollout.nested"}
    )
    assert sample == 1


def test_env_step_spans_give_their_own_metrics() -> None:
    stage, tail, metrics = make()
    step_ok = verify(5)
    step_ok.name = semconv.SPAN_ENV_STEP
    step_ok2 = verify(15)
    step_ok2.name = semconv.SPAN_ENV_STEP
    step_failed = verify(3, succeeded=False, error_type="IndexError")
    step_failed.name = semconv.SPAN_ENV_STEP
    batch = {VERIFY_SCOPE: [step_ok, verify(20), step_failed, step_ok2]}

    async def go() -> None:
        await stage.consume(traces(request(batch)))
        assert await stage.flush()

    run(go())
    [req] = tail.metric_requests()
    counts = {
        tuple(sorted(p.attrs.items())): p.point.as_int
        for p in points(req, semconv.METRIC_ENV_STEP_COUNT)
    }
    assert counts == {
        ((semconv.VERIFY_SUCCEEDED, True),): 2,
        ((semconv.ERROR_TYPE, "IndexError"), (semconv.VERIFY_SUCCEEDED, False)): 1,
    }
    durations = {
        tuple(sorted(p.attrs.items())): p.point.sum
        for p in points(req, semconv.METRIC_ENV_STEP_DURATION)
    }
    assert durations[((semconv.VERIFY_SUCCEEDED, True),)] == pytest.approx(20.0)
    [unit] = {p.unit for p in points(req, semconv.METRIC_ENV_STEP_COUNT)}
    assert unit == "{step}"
    # verifications are counted apart, and steps never enter the verify success rate
    [v] = points(req, semconv.METRIC_VERIFY_COUNT)
    assert v.point.as_int == 1
    [rate] = points(req, semconv.METRIC_VERIFY_SUCCESS_RATE)
    assert rate.point.as_double == 1.0
    sample = metrics.registry.get_sample_value(
        "gym_env_step_count_total", {**_labels(), "succeeded": "true"}
    )
    assert sample == 2


def _labels() -> dict[str, str]:
    return {
        "service_name": RESOURCE[semconv.SERVICE_NAME],
        "nemo_gym_server_name": RESOURCE[semconv.SERVER_NAME],
        "nemo_gym_server_type": RESOURCE[semconv.SERVER_TYPE],
    }


def test_export_failures_are_counted_each_time_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_sidecar.metrics import stage as stage_module

    clock = hand_clock(stage_module._failure_log.name, monkeypatch)
    stage, tail, _ = make()

    async def go() -> None:
        await stage.consume(traces(request({VERIFY_SCOPE: [verify(1)]})))
        tail.refuse = 6
        for _ in range(5):
            assert not await stage.flush()
        clock.now += 60.1
        assert not await stage.flush()
        assert await stage.flush()

    with caplog.at_level(logging.WARNING, logger=stage_module.__name__):
        run(go())
    assert stage.store.exports == {"sent": 1, "backpressure": 6, "error": 0}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert all(m.startswith("derived metrics export pushed back") for m in messages)
    assert messages[1].endswith("[4 similar messages suppressed]")


def test_an_exemplar_needs_both_ids() -> None:
    """A point with only one of trace id and span id cannot link to a span: no exemplar."""
    bounds = [10.0, 100.0]
    series = HistogramSeries(b"r", (), len(bounds) + 1, 0)

    def add(duration_ms: int, end: int, trace_id: bytes, span_id: bytes) -> None:
        points = SeriesPoints(b"r", (), bounds, exemplars=True)
        start = end - duration_ms * 1_000_000
        span = ("gym.rollout", start, end, trace_id, span_id, 0, (None, None, None, None))
        bucket = sum(duration_ms > b for b in bounds)
        points.values.append(float(duration_ms))
        points.counts[bucket] += 1
        assert points.exemplars is not None
        points.exemplars[bucket] = span
        series.add(points)

    add(5, 10**9, b"\x01" * 16, b"")
    add(50, 2 * 10**9, b"", b"\x02" * 8)
    add(500, 3 * 10**9, b"", b"\x02" * 8)
    assert (series.count, series.bucket_counts) == (3, [1, 1, 1])
    assert not any(series.exemplars)
    add(6, 4 * 10**9, b"\x01" * 16, b"\x02" * 8)
    assert series.exemplars[0] == (6.0, 4 * 10**9, b"\x01" * 16, b"\x02" * 8)


def test_every_span_of_a_block_is_read_and_each_bad_one_counted() -> None:
    """One scope block mixing every case: spans of other names are skipped (not the rest
    of the block), each nested rollout and each invalid span counts once, a span with no
    start time is invalid, and a zero-length span is a valid 0 ms point."""
    stage, tail, _ = make()
    nested = [rollout(900), rollout(950)]
    for span in nested:
        span.attrs[semconv.ROLLOUT_NESTED] = True
    no_start_rollout, no_start_verify = rollout(5, start_ns=0), verify(5, start_ns=0)
    batch = {
        ROLLOUT_SCOPE: [
            SpanSpec("something else", 5),
            rollout(10),
            *nested,
            no_start_rollout,
            rollout(7, start_ns=0),
            rollout(0),
            rollout(20),
        ],
        VERIFY_SCOPE: [
            SpanSpec("something else", 5),
            verify(10),
            no_start_verify,
            verify(0),
            verify(30),
        ],
    }
    req = request(batch)
    ends_early = req.resource_spans[0].scope_spans[1].spans.add()
    ends_early.CopyFrom(req.resource_spans[0].scope_spans[1].spans[1])
    ends_early.end_time_unix_nano = ends_early.start_time_unix_nano - 1

    async def go() -> None:
        await stage.consume(traces(req))
        assert await stage.flush()

    run(go())
    [out] = tail.metric_requests()
    [rollouts] = points(out, semconv.METRIC_ROLLOUT_DURATION)
    assert (rollouts.point.count, rollouts.point.sum) == (3, pytest.approx(30.0))
    [verifies] = points(out, semconv.METRIC_VERIFY_DURATION)
    assert (verifies.point.count, verifies.point.sum) == (3, pytest.approx(40.0))
    assert stage.store.spans["gym.rollout.nested"] == 2
    assert stage.store.invalid_spans == 4


def test_points_of_two_resources_in_one_request_stay_apart() -> None:
    stage, tail, _ = make()
    req = request({ROLLOUT_SCOPE: [rollout(10), rollout(20)]})
    add_resource(req, {ROLLOUT_SCOPE: [rollout(300)]}, {**RESOURCE, semconv.SERVER_NAME: "other"})

    async def go() -> None:
        await stage.consume(traces(req))
        assert await stage.flush()

    run(go())
    [out] = tail.metric_requests()
    got = {
        p.resource[semconv.SERVER_NAME]: (p.point.count, p.point.sum)
        for p in points(out, semconv.METRIC_ROLLOUT_DURATION)
    }
    assert got == {
        RESOURCE[semconv.SERVER_NAME]: (2, pytest.approx(30.0)),
        "other": (1, pytest.approx(300.0)),
    }


def test_every_overflowed_point_of_a_block_is_counted() -> None:
    stage, tail, _ = make(cardinality_limit=2)  # one series, then the overflow series

    async def go() -> None:
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(10)]})))
        over = {**RESOURCE, semconv.SERVER_NAME: "over"}
        await stage.consume(traces(request({ROLLOUT_SCOPE: [rollout(20), rollout(30)]}, over)))
        assert await stage.flush()

    run(go())
    assert stage.store.overflow_points[semconv.METRIC_ROLLOUT_DURATION] == 2
    [out] = tail.metric_requests()
    [overflow] = [
        p
        for p in points(out, semconv.METRIC_ROLLOUT_DURATION)
        if p.attrs.get("otel.metric.overflow") is True
    ]
    assert overflow.point.count == 2
