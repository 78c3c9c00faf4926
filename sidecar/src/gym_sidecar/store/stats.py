"""The numbers of ``gym-sidecar stats``: rollout and verify figures over a window.

Two sources, shown side by side:

- spans: exact percentiles of the stored ``gym.rollout`` / ``gym.verify`` spans that
  started in the window (nearest-rank), and the fraction of verifications that
  completed (``succeeded``);
- derived metric points (``gym.rollout.duration_ms``, ``gym.verify.duration_ms``,
  ``gym.verify.count``): percentiles estimated from the histogram buckets (linear within
  a bucket, the way Prometheus' ``histogram_quantile`` does) over the window. Cumulative
  series contribute their last point in the window minus their last point before it;
  delta series the sum of their points in the window. This source also covers groups
  whose spans were gated in ``metrics`` mode and so never stored.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_sidecar.store.figures import RlFigures
from gym_sidecar.store.nesting import OUTERMOST_ROLLOUT
from gym_sidecar.store.queries import STATUS_ERROR

QUANTILES: Final = (0.5, 0.95, 0.99)
_CUMULATIVE: Final = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


@dataclass(frozen=True)
class Distribution:
    """Count and p50/p95/p99 (ms) of one duration, from one source."""

    count: int
    quantiles: tuple[float | None, ...]


@dataclass(frozen=True)
class Stats:
    """Everything ``stats`` prints."""

    window_s: float | None
    rollout_spans: Distribution
    verify_spans: Distribution
    verify_span_success: tuple[int, int]
    """(completed, total) verifications among the spans."""
    rollout_points: Distribution
    verify_points: Distribution
    verify_point_success: tuple[int, int]
    """(succeeded=true, total) from ``gym.verify.count``."""


def nearest_rank(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile by nearest rank (None for no values)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def bucket_quantile(
    bounds: list[float],
    counts: list[int],
    q: float,
    lo: float | None = None,
    hi: float | None = None,
) -> float | None:
    """The ``q`` quantile of an explicit-bucket histogram (linear within the bucket).

    ``lo`` and ``hi``, the smallest and largest value when known (an OTLP point's ``min``
    and ``max``), narrow the bucket the estimate is drawn in: without them a histogram
    whose values all fall in its first bucket, ``[0, 500)`` ms, reads 250 ms at its
    median whatever the values were. Values in the overflow bucket are reported as
    ``hi``, or the last bound (the histogram does not know more); None when the histogram
    is empty.
    """
    total = sum(counts)
    if total == 0:
        return None
    target = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= target:
            if i >= len(bounds):
                return hi if hi is not None else (bounds[-1] if bounds else None)
            lower = bounds[i - 1] if i > 0 else 0.0
            upper = bounds[i]
            if lo is not None and lo > lower:
                lower = min(lo, upper)
            if hi is not None and hi < upper:
                upper = max(hi, lower)
            return lower + (upper - lower) * (target - seen) / n
        seen += n
    return hi if hi is not None else (bounds[-1] if bounds else None)


def _span_distribution(
    conn: sqlite3.Connection, name: str, since_ns: int | None
) -> tuple[list[float], list[tuple[dict[str, Any], int]]]:
    sql = "SELECT start_ns, end_ns, attributes, status_code FROM gym_spans WHERE name = ?"
    if name == semconv.SPAN_ROLLOUT:
        sql += f" AND {OUTERMOST_ROLLOUT}"  # one duration per rollout, as derived metrics
    args: list[Any] = [name]
    if since_ns is not None:
        sql += " AND start_ns >= ?"
        args.append(since_ns)
    durations: list[float] = []
    details: list[tuple[dict[str, Any], int]] = []
    for r in conn.execute(sql, args):
        durations.append(max(0, r["end_ns"] - r["start_ns"]) / 1e6)
        details.append((json.loads(r["attributes"]), int(r["status_code"])))
    durations.sort()
    return durations, details


def window_points(
    conn: sqlite3.Connection, name: str, since_ns: int | None
) -> list[tuple[str, str, dict[str, Any]]]:
    """Per series of metric ``name``, (service, attributes JSON, the value accumulated in
    the window): see the module docstring."""
    rows = conn.execute(
        "SELECT service, attributes, start_ns, time_ns, value FROM metric_points "
        "WHERE name = ? ORDER BY time_ns",
        (name,),
    ).fetchall()
    series: dict[tuple[str, str, int], list[tuple[int, Any]]] = defaultdict(list)
    out: list[tuple[str, str, dict[str, Any]]] = []
    for r in rows:
        value = json.loads(r["value"])
        if value.get("temporality") == _CUMULATIVE:
            series[(r["service"], r["attributes"], r["start_ns"])].append((r["time_ns"], value))
        elif since_ns is None or r["time_ns"] >= since_ns:
            out.append((str(r["service"]), str(r["attributes"]), value))
    for (service, attrs, _start), points in series.items():
        inside = [v for t, v in points if since_ns is None or t >= since_ns]
        if not inside:
            continue
        before = [v for t, v in points if since_ns is not None and t < since_ns]
        out.append((service, attrs, _minus(inside[-1], before[-1] if before else None)))
    return out


def _window_values(conn: sqlite3.Connection, name: str, since_ns: int | None) -> list[Any]:
    """Per series, (attributes JSON, the value accumulated in the window)."""
    return [(attrs, value) for _service, attrs, value in window_points(conn, name, since_ns)]


def _minus(last: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    if base is None:
        return last
    if "buckets" in last:
        # min and max stay the cumulative ones: still bounds of the window's values
        return {
            **last,
            "count": last["count"] - base["count"],
            "sum": last.get("sum", 0.0) - base.get("sum", 0.0),
            "buckets": [a - b for a, b in zip(last["buckets"], base["buckets"], strict=False)],
        }
    return {**last, "value": last["value"] - base["value"]}


def _histogram(conn: sqlite3.Connection, name: str, since_ns: int | None) -> Distribution:
    merged = Histogram()
    for _attrs, value in _window_values(conn, name, since_ns):
        merged.add(value)
    return Distribution(merged.count, tuple(merged.quantile(q) for q in QUANTILES))


@dataclass
class Histogram:
    """A window's merged explicit-bucket histogram, and its extremes while every merged
    point gave them (a point without ``min``/``max`` makes them unknown)."""

    bounds: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    lo: float | None = None
    hi: float | None = None
    _extremes_known: bool = True

    def add(self, value: dict[str, Any]) -> None:
        bounds = [float(b) for b in value.get("bounds", [])]
        buckets = [int(n) for n in value.get("buckets", [])]
        if not self.counts:
            self.bounds, self.counts = bounds, [0] * len(buckets)
        if bounds != self.bounds or len(buckets) != len(self.counts):
            return  # other bounds (a restart with another config): the first set's only
        self.counts = [a + b for a, b in zip(self.counts, buckets, strict=True)]
        self.total += float(value.get("sum", 0.0))
        if not sum(buckets):
            return
        lo, hi = value.get("min"), value.get("max")
        if lo is None or hi is None or not self._extremes_known:
            self._extremes_known = False
            self.lo = self.hi = None
            return
        self.lo = float(lo) if self.lo is None else min(self.lo, float(lo))
        self.hi = float(hi) if self.hi is None else max(self.hi, float(hi))

    @property
    def count(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        return bucket_quantile(self.bounds, self.counts, q, self.lo, self.hi)

    def at_most(self, bound: float) -> int | None:
        """How many values are ``<= bound``, exactly: None unless ``bound`` is one of the
        histogram's bounds (a bucket's count cannot be split)."""
        if bound not in self.bounds:
            return None
        return sum(self.counts[: self.bounds.index(bound) + 1])


def compute(conn: sqlite3.Connection, window_s: float | None, now_ns: int | None = None) -> Stats:
    """Stats over the last ``window_s`` seconds (everything stored when None)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    since_ns = None if window_s is None else now_ns - int(window_s * 1e9)
    rollout_ms, _ = _span_distribution(conn, semconv.SPAN_ROLLOUT, since_ns)
    verify_ms, verify_details = _span_distribution(conn, semconv.SPAN_VERIFY, since_ns)
    completed = sum(
        1
        for attrs, status in verify_details
        if attrs.get(semconv.VERIFY_SUCCEEDED) is not False and status != STATUS_ERROR
    )
    ok = total = 0
    for attrs, value in _window_values(conn, semconv.METRIC_VERIFY_COUNT, since_ns):
        n = int(value["value"])
        total += n
        if json.loads(attrs).get(semconv.VERIFY_SUCCEEDED) is True:
            ok += n
    return Stats(
        window_s=window_s,
        rollout_spans=Distribution(
            len(rollout_ms), tuple(nearest_rank(rollout_ms, q) for q in QUANTILES)
        ),
        verify_spans=Distribution(
            len(verify_ms), tuple(nearest_rank(verify_ms, q) for q in QUANTILES)
        ),
        verify_span_success=(completed, len(verify_ms)),
        rollout_points=_histogram(conn, semconv.METRIC_ROLLOUT_DURATION, since_ns),
        verify_points=_histogram(conn, semconv.METRIC_VERIFY_DURATION, since_ns),
        verify_point_success=(ok, total),
    )


@dataclass(frozen=True)
class SpanSample:
    """One stored rollout or verify span, as the web view's charts read it."""

    start_ns: int
    duration_ms: float
    completed: bool
    """For a verify span: the verification completed (``succeeded`` not false, no ERROR)."""
    reward: float | None = None
    """Its ``nemo.gym.reward`` (rollout and verify spans), when numeric."""
    tokens: int | None = None
    """A rollout's input plus output tokens (``nemo.gym.rollout.*_tokens``), when known."""


def span_samples(
    conn: sqlite3.Connection, name: str, window_s: float | None, now_ns: int | None = None
) -> list[SpanSample]:
    """Every stored ``name`` span (``gym.rollout``: outermost ones only) started in the
    last ``window_s`` seconds (all when None), by start time."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    since_ns = None if window_s is None else now_ns - int(window_s * 1e9)
    sql = "SELECT start_ns, end_ns, attributes, status_code FROM gym_spans WHERE name = ?"
    if name == semconv.SPAN_ROLLOUT:
        sql += f" AND {OUTERMOST_ROLLOUT}"
    args: list[Any] = [name]
    if since_ns is not None:
        sql += " AND start_ns >= ?"
        args.append(since_ns)
    out = []
    for r in conn.execute(sql + " ORDER BY start_ns", args):
        attrs = json.loads(r["attributes"])
        figures = RlFigures.of(attrs)
        out.append(
            SpanSample(
                int(r["start_ns"]),
                max(0, r["end_ns"] - r["start_ns"]) / 1e6,
                attrs.get(semconv.VERIFY_SUCCEEDED) is not False
                and int(r["status_code"]) != STATUS_ERROR,
                figures.reward,
                None
                if figures.input_tokens is None and figures.output_tokens is None
                else (figures.input_tokens or 0) + (figures.output_tokens or 0),
            )
        )
    return out
