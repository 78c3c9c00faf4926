"""In-memory aggregation of derived metrics: histogram series and success-rate windows.

A *series* is one (resource, point attributes) pair of one metric. The resource is keyed
by its serialized OTLP bytes as the trace request's wire view holds them (as received,
or as enriched), so identifying it costs no serialization and no attribute parsing (two
encodings of one resource, which one SDK process never produces, would be two series);
point attributes are a small tuple of ``(key, value)`` pairs sorted by key.

Storage is always cumulative: a series holds totals since it was created. Each series
also remembers what the last *successful* export carried (``prev_*``), so a delta export
and the windowed success rate are differences against that snapshot, and an export that
was refused (backpressure) simply leaves the snapshot where it was: the next export
covers both intervals and nothing is lost.

Thread-safety: none here. :class:`gym_sidecar.metrics.derived.DerivedMetrics` guards every
table with one lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

AttrValue = bool | str
Attrs = tuple[tuple[str, AttrValue], ...]
"""Point attributes, sorted by key."""
SeriesKey = tuple[bytes, Attrs]
"""(serialized resource, point attributes)."""

OVERFLOW_ATTRIBUTE: Final = "otel.metric.overflow"
OVERFLOW_ATTRS: Final[Attrs] = ((OVERFLOW_ATTRIBUTE, True),)
OVERFLOW_RESOURCE: Final = b""
"""Overflow series carry an empty resource: keying them by resource would make the
resource itself the unbounded dimension the limit exists to stop."""

VERIFY_OK_ATTRS: Final[Attrs] = ((semconv.VERIFY_SUCCEEDED, True),)

Exemplar = tuple[float, int, bytes, bytes]
"""(value, time_unix_nano, trace_id, span_id)."""


def remember_resource(resources: dict[bytes, Resource], key: bytes) -> None:
    """Keep the resource serialized as ``key`` (parsed once, when its first series is
    created; the batch it came from is not referenced)."""
    if key not in resources:
        resources[key] = Resource.FromString(key)


class HistogramSeries:
    """Cumulative explicit-bucket histogram of one series, with per-bucket exemplars."""

    __slots__ = (
        "attrs",
        "bucket_counts",
        "count",
        "cum_max",
        "cum_min",
        "exemplars",
        "prev_bucket_counts",
        "prev_count",
        "prev_sum",
        "prev_time_ns",
        "resource_key",
        "sent_exemplars",
        "start_time_ns",
        "sum",
        "win_max",
        "win_min",
    )

    def __init__(self, resource_key: bytes, attrs: Attrs, n_buckets: int, now_ns: int) -> None:
        self.resource_key = resource_key
        self.attrs = attrs
        self.start_time_ns = now_ns
        self.bucket_counts = [0] * n_buckets
        self.count = 0
        self.sum = 0.0
        self.win_min = float("inf")
        self.win_max = float("-inf")
        self.cum_min = float("inf")
        self.cum_max = float("-inf")
        self.exemplars: list[Exemplar | None] = [None] * n_buckets
        """Latest exemplar per bucket (kept for Prometheus scrapes)."""
        self.sent_exemplars: list[Exemplar | None] = [None] * n_buckets
        """Those already exported over OTLP (each is exported once)."""
        self.prev_bucket_counts = [0] * n_buckets
        self.prev_count = 0
        self.prev_sum = 0.0
        self.prev_time_ns = now_ns

    def record(
        self,
        bounds: list[float],
        value: float,
        end_ns: int,
        trace_id: bytes | None,
        span_id: bytes | None,
    ) -> None:
        """Add one value (ms). No ``trace_id``/``span_id``: no exemplar is kept."""
        i = bisect_left(bounds, value)  # bounds are inclusive upper bounds
        self.bucket_counts[i] += 1
        self.count += 1
        self.sum += value
        # plain comparisons: min()/max() calls cost more on this per-span path
        if value < self.win_min:  # noqa: PLR1730
            self.win_min = value
        if value > self.win_max:  # noqa: PLR1730
            self.win_max = value
        if trace_id and span_id:  # None (exemplars off) or empty ids: no exemplar
            self.exemplars[i] = (value, end_ns, trace_id, span_id)

    @property
    def succeeded(self) -> bool | None:
        """The ``succeeded`` attribute of this series, if it has one."""
        for key, value in self.attrs:
            if key == semconv.VERIFY_SUCCEEDED:
                return bool(value)
        return None


class HistogramTable:
    """All series of one histogram metric, bounded by the cardinality limit."""

    def __init__(
        self,
        *,
        metric_names: tuple[str, ...],
        bounds: list[float],
        cardinality_limit: int,
        clock_ns: Callable[[], int],
        on_overflow: Callable[[tuple[str, ...]], None],
        resources: dict[bytes, Resource],
    ) -> None:
        self.resources = resources
        self.metric_names = metric_names
        self.bounds = bounds
        self.n_buckets = len(bounds) + 1
        self.limit = cardinality_limit
        self.series: dict[SeriesKey, HistogramSeries] = {}
        self._clock_ns = clock_ns
        self._on_overflow = on_overflow
        self._regular = 0

    def get(self, resource_key: bytes, attrs: Attrs) -> HistogramSeries:
        """The series for this key, creating it (or routing to overflow) if new."""
        s = self.series.get((resource_key, attrs))
        if s is None:
            s = self._admit(resource_key, attrs)
        return s

    def _admit(self, resource_key: bytes, attrs: Attrs) -> HistogramSeries:
        if self._regular < self.limit - 1:
            self._regular += 1
            remember_resource(self.resources, resource_key)
            s = HistogramSeries(resource_key, attrs, self.n_buckets, self._clock_ns())
            self.series[(resource_key, attrs)] = s
            return s
        self._on_overflow(self.metric_names)
        key = (OVERFLOW_RESOURCE, OVERFLOW_ATTRS)
        overflow = self.series.get(key)
        if overflow is None:
            overflow = HistogramSeries(
                OVERFLOW_RESOURCE, OVERFLOW_ATTRS, self.n_buckets, self._clock_ns()
            )
            self.series[key] = overflow
        return overflow

    def __iter__(self) -> Iterator[HistogramSeries]:
        return iter(self.series.values())


class RateWindow:
    """Verifications of one resource in the current window: succeeded and total."""

    __slots__ = ("attrs", "last_rate", "ok", "resource_key", "total")

    def __init__(self, resource_key: bytes, attrs: Attrs) -> None:
        self.resource_key = resource_key
        self.attrs = attrs
        self.ok = 0
        self.total = 0
        self.last_rate: float | None = None
        """Rate of the last exported window (None: that window had no verifications)."""


class RateTable:
    """``gym.verify.success_rate`` windows per resource, bounded by the cardinality limit."""

    def __init__(
        self,
        cardinality_limit: int,
        on_overflow: Callable[[tuple[str, ...]], None],
        resources: dict[bytes, Resource],
    ) -> None:
        self.resources = resources
        self.limit = cardinality_limit
        self.windows: dict[bytes, RateWindow] = {}
        self._overflow: RateWindow | None = None
        self._on_overflow = on_overflow

    def get(self, resource_key: bytes) -> RateWindow:
        """The window of this resource, creating it (or routing to overflow) if new."""
        w = self.windows.get(resource_key)
        if w is None:
            w = self._admit(resource_key)
        return w

    def _admit(self, resource_key: bytes) -> RateWindow:
        if len(self.windows) < self.limit - 1:
            remember_resource(self.resources, resource_key)
            w = RateWindow(resource_key, ())
            self.windows[resource_key] = w
            return w
        self._on_overflow((semconv.METRIC_VERIFY_SUCCESS_RATE,))
        if self._overflow is None:
            self._overflow = RateWindow(OVERFLOW_RESOURCE, OVERFLOW_ATTRS)
        return self._overflow

    def __iter__(self) -> Iterator[RateWindow]:
        yield from self.windows.values()
        if self._overflow is not None:
            yield self._overflow
