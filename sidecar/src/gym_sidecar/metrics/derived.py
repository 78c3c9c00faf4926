"""The derived-metrics tables: the series of one sidecar, and export snapshots (not a
store: "store" is the SQLite trace store, ``gym_sidecar.store``).

Lifecycle of an export (driven by the derive stage):

1. :meth:`DerivedMetrics.collect` takes a :class:`Snapshot` of every point to export
   (cumulative or delta values, exemplars of the interval, success rates of the window).
2. The snapshot is turned into an OTLP request and handed down the pipeline.
3. Only if that was accepted, :meth:`DerivedMetrics.commit` moves the series' "last
   exported" marks to the snapshot. If it was refused, nothing moves: the next snapshot
   covers both intervals (delta points and the success-rate window simply grow).

Thread-safety: every method takes ``lock``. Recording happens on the event loop; the
Prometheus collector reads from whatever thread serves ``/metrics``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gym_telemetry_semconv as semconv
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.metrics.config import RL_METRICS, MetricsConfig
from gym_sidecar.metrics.live_series import LiveSeries, RolloutSeries
from gym_sidecar.metrics.rl import HISTOGRAMS, SUMS
from gym_sidecar.metrics.rl_tables import LABEL_SETS_LIMIT_NAME, RlTables
from gym_sidecar.metrics.series import (
    Attrs,
    CounterSeries,
    Exemplar,
    HistogramSeries,
    HistogramTable,
    RateTable,
    RateWindow,
)
from gym_sidecar.selfmetrics import SelfMetrics

_INF = float("inf")

NESTED_ROLLOUT_SPANS = "gym.rollout.nested"
"""Key of :attr:`DerivedMetrics.spans` counting nested rollout spans (seen, not derived)."""
MODEL_CALL_SPANS = "gym.model.*"
"""Key of :attr:`DerivedMetrics.spans` counting model-call spans derived."""
HOP_SPANS = "http_client.retried_or_failed"
"""Key of :attr:`DerivedMetrics.spans` counting the retried or failed hops derived."""

CARDINALITY_LIMIT_NAME = "metrics.cardinality_limit"
"""The ``limit`` label under which overflowed points are counted in ``limit_hits``."""


def _float_bounds(bounds: list[float]) -> list[float]:
    """``bounds`` as floats. The config gives floats (its defaults and validated lists);
    this holds for bounds set another way too (``model_copy``, a test), since a float
    compares with a float several times faster than with an int, and exactly as it does
    with that int (every bound is finite and exact as a float), so a span's bucket is
    the same."""
    return [float(b) for b in bounds]


@dataclass(slots=True)
class HistogramPoint:
    resource_key: bytes
    attrs: Attrs
    start_time_ns: int
    bucket_counts: list[int]
    count: int
    sum: float
    min: float | None
    max: float | None
    exemplars: list[Exemplar]


@dataclass(slots=True)
class SumPoint:
    resource_key: bytes
    attrs: Attrs
    start_time_ns: int
    value: int


@dataclass(slots=True)
class GaugePoint:
    resource_key: bytes
    attrs: Attrs
    start_time_ns: int
    value: float


@dataclass(slots=True)
class _SeriesMark:
    series: HistogramSeries
    bucket_counts: list[int]
    count: int
    sum: float
    exemplars: list[Exemplar | None]


@dataclass(slots=True)
class Snapshot:
    """Points of one export, plus what :meth:`DerivedMetrics.commit` needs."""

    time_ns: int
    delta: bool
    rollout_duration: list[HistogramPoint] = field(default_factory=list)
    verify_duration: list[HistogramPoint] = field(default_factory=list)
    verify_count: list[SumPoint] = field(default_factory=list)
    success_rate: list[GaugePoint] = field(default_factory=list)
    env_step_duration: list[HistogramPoint] = field(default_factory=list)
    env_step_count: list[SumPoint] = field(default_factory=list)
    rl_histograms: list[tuple[str, HistogramPoint]] = field(default_factory=list)
    """The RL view's histogram points, with their metric's name."""
    rl_sums: list[tuple[str, SumPoint]] = field(default_factory=list)
    rollout_in_flight: list[GaugePoint] = field(default_factory=list)
    rollout_stalled: list[GaugePoint] = field(default_factory=list)
    rollout_lost: list[SumPoint] = field(default_factory=list)
    event_loop_lag: list[HistogramPoint] = field(default_factory=list)
    resources: dict[bytes, Resource] = field(default_factory=dict)
    _marks: list[_SeriesMark] = field(default_factory=list)
    _windows: list[tuple[RateWindow, int, int]] = field(default_factory=list)
    _counters: list[tuple[CounterSeries, int]] = field(default_factory=list)
    _lost: list[tuple[RolloutSeries, int]] = field(default_factory=list)

    @property
    def points(self) -> int:
        """Data points in this snapshot (the ``items`` of its metrics batch)."""
        return (
            len(self.rollout_duration)
            + len(self.verify_duration)
            + len(self.verify_count)
            + len(self.success_rate)
            + len(self.env_step_duration)
            + len(self.env_step_count)
            + len(self.rl_histograms)
            + len(self.rl_sums)
            + len(self.rollout_in_flight)
            + len(self.rollout_stalled)
            + len(self.rollout_lost)
            + len(self.event_loop_lag)
        )


class DerivedMetrics:
    """Series of ``gym.rollout.duration_ms``, ``gym.verify.*``, ``gym.env.step.*`` and the
    RL view's metrics (:attr:`rl`, ``metrics.rl_tables``) for one sidecar, and the live
    metrics the live tracker sets (:attr:`live`, :mod:`.live_series`).

    Plain integer counters (``spans``, ``invalid_spans``, ``overflow_points``,
    ``exports``) are read by the Prometheus collector; they cost no lock to bump.
    """

    def __init__(
        self,
        cfg: MetricsConfig,
        selfmetrics: SelfMetrics | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cfg = cfg
        self.delta = cfg.temporality == "delta"
        self.lock = threading.Lock()
        self.clock_ns = clock_ns
        self.resources: dict[bytes, Resource] = {}
        self._limit_hits = (
            selfmetrics.limit_hits.labels(limit=CARDINALITY_LIMIT_NAME) if selfmetrics else None
        )
        self.rollout = HistogramTable(
            metric_names=(semconv.METRIC_ROLLOUT_DURATION,),
            bounds=_float_bounds(cfg.rollout_buckets_ms),
            cardinality_limit=cfg.cardinality_limit,
            clock_ns=clock_ns,
            on_overflow=self._overflowed,
            resources=self.resources,
        )
        self.verify = HistogramTable(
            metric_names=(semconv.METRIC_VERIFY_DURATION, semconv.METRIC_VERIFY_COUNT),
            bounds=_float_bounds(cfg.verify_buckets_ms),
            cardinality_limit=cfg.cardinality_limit,
            clock_ns=clock_ns,
            on_overflow=self._overflowed,
            resources=self.resources,
        )
        # Gymnasium-style /step calls: same buckets and point attributes as /verify.
        self.env_step = HistogramTable(
            metric_names=(semconv.METRIC_ENV_STEP_DURATION, semconv.METRIC_ENV_STEP_COUNT),
            bounds=_float_bounds(cfg.verify_buckets_ms),
            cardinality_limit=cfg.cardinality_limit,
            clock_ns=clock_ns,
            on_overflow=self._overflowed,
            resources=self.resources,
        )
        self.rates = RateTable(cfg.cardinality_limit, self._overflowed, self.resources)
        self._label_hits = (
            selfmetrics.limit_hits.labels(limit=LABEL_SETS_LIMIT_NAME) if selfmetrics else None
        )
        self.rl = RlTables(cfg, clock_ns, self._overflowed, self._capped, self.resources)
        self.live = LiveSeries(
            cardinality_limit=cfg.cardinality_limit,
            clock_ns=clock_ns,
            on_overflow=self._overflowed,
            resources=self.resources,
        )
        self.window_start_ns = clock_ns()
        self.spans: dict[str, int] = {
            semconv.SPAN_ROLLOUT: 0,
            semconv.SPAN_VERIFY: 0,
            semconv.SPAN_ENV_STEP: 0,
            NESTED_ROLLOUT_SPANS: 0,
            MODEL_CALL_SPANS: 0,
            HOP_SPANS: 0,
        }
        self.invalid_spans = 0
        self.overflow_points: dict[str, int] = {
            semconv.METRIC_ROLLOUT_DURATION: 0,
            semconv.METRIC_VERIFY_DURATION: 0,
            semconv.METRIC_VERIFY_COUNT: 0,
            semconv.METRIC_VERIFY_SUCCESS_RATE: 0,
            semconv.METRIC_ENV_STEP_DURATION: 0,
            semconv.METRIC_ENV_STEP_COUNT: 0,
            **dict.fromkeys(RL_METRICS, 0),
            semconv.METRIC_ROLLOUT_IN_FLIGHT: 0,
            semconv.METRIC_ROLLOUT_STALLED: 0,
            semconv.METRIC_ROLLOUT_LOST: 0,
            semconv.METRIC_EVENT_LOOP_LAG: 0,
        }
        self.exports: dict[str, int] = {"sent": 0, "backpressure": 0, "error": 0}

    def _overflowed(self, metric_names: tuple[str, ...], points: int) -> None:
        for name in metric_names:
            self.overflow_points[name] += points
        if self._limit_hits is not None:
            self._limit_hits.inc(len(metric_names) * points)

    def _capped(self, metric: str, points: int) -> None:
        self.overflow_points[metric] += points
        if self._label_hits is not None:
            self._label_hits.inc(points)

    # -- export -----------------------------------------------------------------------
    def collect(self) -> Snapshot:
        """Snapshot what is due for export now (see the module docstring)."""
        with self.lock:
            now = self.clock_ns()
            snap = Snapshot(time_ns=now, delta=self.delta)
            for s in self.rollout:
                p = self._histogram_point(s, snap)
                if p is not None:
                    snap.rollout_duration.append(p)
            for s in self.verify:
                p = self._histogram_point(s, snap)
                if p is not None:
                    snap.verify_duration.append(p)
                    snap.verify_count.append(
                        SumPoint(s.resource_key, s.attrs, p.start_time_ns, p.count)
                    )
            for s in self.env_step:
                p = self._histogram_point(s, snap)
                if p is not None:
                    snap.env_step_duration.append(p)
                    snap.env_step_count.append(
                        SumPoint(s.resource_key, s.attrs, p.start_time_ns, p.count)
                    )
            for name, table in zip(HISTOGRAMS, self.rl.histograms, strict=True):
                for s in table:
                    p = self._histogram_point(s, snap)
                    if p is not None:
                        snap.rl_histograms.append((name, p))
            for name, counters in zip(SUMS, self.rl.sums, strict=True):
                for c in counters:
                    sp = self._sum_point(c, snap)
                    if sp is not None:
                        snap.rl_sums.append((name, sp))
            for w in self.rates:
                snap._windows.append((w, w.ok, w.total))
                if w.total:
                    snap.success_rate.append(
                        GaugePoint(w.resource_key, w.attrs, self.window_start_ns, w.ok / w.total)
                    )
            self._collect_live(snap)
            keys = {p.resource_key for p in snap.rollout_duration}
            keys.update(p.resource_key for p in snap.verify_duration)
            keys.update(p.resource_key for p in snap.env_step_duration)
            keys.update(g.resource_key for g in snap.success_rate)
            keys.update(p.resource_key for _, p in snap.rl_histograms)
            keys.update(p.resource_key for _, p in snap.rl_sums)
            keys.update(g.resource_key for g in snap.rollout_in_flight)
            keys.update(p.resource_key for p in snap.event_loop_lag)
            for key in keys:
                snap.resources[key] = self.resources.get(key, Resource())
            return snap

    def _collect_live(self, snap: Snapshot) -> None:
        """The live metrics' points: both gauges of every agent server every time (0
        included), the lost counter (delta: only when it grew), the lag histograms."""
        for r in self.live:
            snap.rollout_in_flight.append(
                GaugePoint(r.resource_key, r.attrs, r.start_time_ns, r.in_flight)
            )
            snap.rollout_stalled.append(
                GaugePoint(r.resource_key, r.attrs, r.start_time_ns, r.stalled)
            )
            snap._lost.append((r, r.lost))
            if not self.delta:
                snap.rollout_lost.append(SumPoint(r.resource_key, r.attrs, r.start_time_ns, r.lost))
            elif r.lost != r.prev_lost:
                snap.rollout_lost.append(
                    SumPoint(r.resource_key, r.attrs, r.prev_time_ns, r.lost - r.prev_lost)
                )
        for s in self.live.lag:
            p = self._histogram_point(s, snap)
            if p is not None:
                snap.event_loop_lag.append(p)

    def _histogram_point(self, s: HistogramSeries, snap: Snapshot) -> HistogramPoint | None:
        counts = list(s.bucket_counts)
        exemplars = list(s.exemplars)
        snap._marks.append(_SeriesMark(s, counts, s.count, s.sum, exemplars))
        kept = [
            e
            for e, sent in zip(exemplars, s.sent_exemplars, strict=True)
            if e is not None and e is not sent
        ]
        # A series' minimum and maximum are each unknown until a point gave one (a merged
        # heartbeat histogram gives a maximum only).
        win_min = s.win_min if s.win_min != _INF else None
        win_max = s.win_max if s.win_max != -_INF else None
        if self.delta:
            if s.count == s.prev_count:
                return None
            return HistogramPoint(
                s.resource_key,
                s.attrs,
                s.prev_time_ns,
                [c - p for c, p in zip(counts, s.prev_bucket_counts, strict=True)],
                s.count - s.prev_count,
                s.sum - s.prev_sum,
                win_min,
                win_max,
                kept,
            )
        if s.count == 0:
            return None
        lo = min(s.cum_min, s.win_min)
        hi = max(s.cum_max, s.win_max)
        return HistogramPoint(
            s.resource_key,
            s.attrs,
            s.start_time_ns,
            counts,
            s.count,
            s.sum,
            lo if lo != _INF else None,
            hi if hi != -_INF else None,
            kept,
        )

    def _sum_point(self, c: CounterSeries, snap: Snapshot) -> SumPoint | None:
        snap._counters.append((c, c.value))
        if self.delta:
            if c.value == c.prev_value:
                return None
            return SumPoint(c.resource_key, c.attrs, c.prev_time_ns, c.value - c.prev_value)
        if c.value == 0:
            return None
        return SumPoint(c.resource_key, c.attrs, c.start_time_ns, c.value)

    def commit(self, snap: Snapshot) -> None:
        """Mark ``snap`` as exported: move delta marks, mark its exemplars as sent, close
        the success-rate window. Call only after the snapshot's request was accepted."""
        with self.lock:
            for m in snap._marks:
                s = m.series
                s.prev_bucket_counts = m.bucket_counts
                s.prev_count = m.count
                s.prev_sum = m.sum
                s.prev_time_ns = snap.time_ns
                s.cum_min = min(s.cum_min, s.win_min)
                s.cum_max = max(s.cum_max, s.win_max)
                if s.count == m.count:  # nothing arrived meanwhile: the window is closed
                    s.win_min = float("inf")
                    s.win_max = float("-inf")
                s.sent_exemplars = m.exemplars
            for c, value in snap._counters:
                c.prev_value = value
                c.prev_time_ns = snap.time_ns
            for r, lost in snap._lost:
                r.prev_lost = lost
                r.prev_time_ns = snap.time_ns
            for w, ok, total in snap._windows:
                w.ok -= ok
                w.total -= total
                w.last_rate = ok / total if total else None
            self.window_start_ns = snap.time_ns
