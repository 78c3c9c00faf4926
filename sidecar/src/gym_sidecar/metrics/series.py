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

from collections.abc import Callable, Iterator, Sequence
from operator import add
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.core.traces import DerivedSpan

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

NS_PER_MS: Final = 1_000_000.0
"""A span's value in ms is ``(end_time_unix_nano - start_time_unix_nano) / NS_PER_MS``."""


def exemplar_of(span: DerivedSpan, value: float | None = None) -> Exemplar | None:
    """The exemplar ``span`` makes (``value``, else its duration in ms; its end time and
    ids); None when it lacks one of the ids (it cannot link to a span)."""
    _, start, end, trace_id, span_id, _, _ = span
    if trace_id and span_id:
        return ((end - start) / NS_PER_MS if value is None else value, end, trace_id, span_id)
    return None


class SeriesPoints:
    """The points one ScopeSpans block gives one series, read but not yet recorded.

    The deriver fills it span by span (:mod:`gym_sidecar.metrics.spans`); the store
    adds it to its series in one go (:meth:`HistogramSeries.add`) once the request was
    accepted. Not thread-safe (filled and read on the event loop).
    """

    __slots__ = (
        "attrs",
        "bounds",
        "counts",
        "exemplar_value",
        "exemplars",
        "key",
        "spans",
        "values",
    )

    def __init__(
        self,
        key: bytes,
        attrs: Attrs,
        bounds: list[float],
        exemplars: bool,
        spans: Sequence[DerivedSpan] = (),
    ) -> None:
        self.key = key
        """The resource's serialized bytes."""
        self.attrs = attrs
        self.spans = spans
        """The block's spans (all of them, as scanned): where the points come from,
        read again when several series of one block meet in the overflow series."""
        self.bounds = bounds
        """The histogram's bucket bounds (floats), to find each value's bucket."""
        self.values: list[float] = []
        """Each point's value in ms, in span order."""
        self.counts = [0] * (len(bounds) + 1)
        """Points per bucket."""
        self.exemplars: dict[int, DerivedSpan] | None = {} if exemplars else None
        """Bucket -> the block's last span in it (None: exemplars are off)."""
        self.exemplar_value: Callable[[DerivedSpan], float] | None = None
        """The point's value of a span, for a metric whose value is not the span's
        duration in ms (a reward, tokens, seconds): called for each bucket's exemplar
        span only, when the points are recorded; None: the duration in ms."""


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

    def add(self, points: SeriesPoints) -> None:
        """Add the points one block gave this series (see :class:`SeriesPoints`).

        The same as adding each value in turn: ``sum`` adds them in their order (a
        float sum depends on it), and each bucket's exemplar becomes the block's last
        span in it when that span has both ids (else the bucket keeps its exemplar).
        """
        values = points.values
        self.count += len(values)
        total = self.sum
        for value in values:  # in order, one by one: sum() compensates on 3.12+
            total += value
        self.sum = total
        low = min(values)
        high = max(values)
        # plain comparisons: min()/max() of two cost more than a compare on this path
        if low < self.win_min:  # noqa: PLR1730
            self.win_min = low
        if high > self.win_max:  # noqa: PLR1730
            self.win_max = high
        self.bucket_counts = list(map(add, self.bucket_counts, points.counts))
        if points.exemplars:
            exemplars = self.exemplars
            value_of = points.exemplar_value
            for bucket, span in points.exemplars.items():
                exemplar = exemplar_of(span, None if value_of is None else value_of(span))
                if exemplar is not None:  # empty ids: no exemplar (the last one stays)
                    exemplars[bucket] = exemplar

    def add_counts(self, counts: Sequence[int], count: int, total: float, high: float) -> None:
        """Add points aggregated elsewhere over the same bounds (an agent heartbeat's
        event-loop lag): the exact merge of ``counts`` per bucket, their ``count``, their
        ``sum`` and their largest value ``high``. Their smallest is not known, so the
        series' minimum stays unknown (exported without ``min``). ``counts`` must have
        one entry per bucket (the caller checks)."""
        self.count += count
        self.sum += total
        self.bucket_counts = list(map(add, self.bucket_counts, counts))
        if count and high > self.win_max:
            self.win_max = high

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
        on_overflow: Callable[[tuple[str, ...], int], None],
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

    def get(self, resource_key: bytes, attrs: Attrs, points: int = 1) -> HistogramSeries:
        """The series for this key, creating it (or routing to overflow) if new.

        ``points``: how many points are about to be added; routed to overflow, each of
        them is counted as an overflowed point.
        """
        s = self.series.get((resource_key, attrs))
        if s is None:
            s = self._admit(resource_key, attrs, points)
        return s

    def _admit(self, resource_key: bytes, attrs: Attrs, points: int) -> HistogramSeries:
        if self._regular < self.limit - 1:
            self._regular += 1
            remember_resource(self.resources, resource_key)
            s = HistogramSeries(resource_key, attrs, self.n_buckets, self._clock_ns())
            self.series[(resource_key, attrs)] = s
            return s
        self._on_overflow(self.metric_names, points)
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
        on_overflow: Callable[[tuple[str, ...], int], None],
        resources: dict[bytes, Resource],
    ) -> None:
        self.resources = resources
        self.limit = cardinality_limit
        self.windows: dict[bytes, RateWindow] = {}
        self._overflow: RateWindow | None = None
        self._on_overflow = on_overflow

    def get(self, resource_key: bytes, points: int = 1) -> RateWindow:
        """The window of this resource, creating it (or routing to overflow) if new;
        ``points`` as in :meth:`HistogramTable.get`."""
        w = self.windows.get(resource_key)
        if w is None:
            w = self._admit(resource_key, points)
        return w

    def _admit(self, resource_key: bytes, points: int) -> RateWindow:
        if len(self.windows) < self.limit - 1:
            remember_resource(self.resources, resource_key)
            w = RateWindow(resource_key, ())
            self.windows[resource_key] = w
            return w
        self._on_overflow((semconv.METRIC_VERIFY_SUCCESS_RATE,), points)
        if self._overflow is None:
            self._overflow = RateWindow(OVERFLOW_RESOURCE, OVERFLOW_ATTRS)
        return self._overflow

    def __iter__(self) -> Iterator[RateWindow]:
        yield from self.windows.values()
        if self._overflow is not None:
            yield self._overflow


class CounterSeries:
    """A cumulative monotonic sum of one series (``gym.http.client.*``)."""

    __slots__ = ("attrs", "prev_time_ns", "prev_value", "resource_key", "start_time_ns", "value")

    def __init__(self, resource_key: bytes, attrs: Attrs, now_ns: int) -> None:
        self.resource_key = resource_key
        self.attrs = attrs
        self.start_time_ns = now_ns
        self.value = 0
        self.prev_value = 0
        """What the last successful export carried (a delta export's base)."""
        self.prev_time_ns = now_ns


class CounterTable:
    """All series of one sum metric, bounded by the cardinality limit (as
    :class:`HistogramTable`)."""

    def __init__(
        self,
        *,
        metric_name: str,
        cardinality_limit: int,
        clock_ns: Callable[[], int],
        on_overflow: Callable[[tuple[str, ...], int], None],
        resources: dict[bytes, Resource],
    ) -> None:
        self.resources = resources
        self.metric_names = (metric_name,)
        self.limit = cardinality_limit
        self.series: dict[SeriesKey, CounterSeries] = {}
        self._clock_ns = clock_ns
        self._on_overflow = on_overflow

    def add(self, resource_key: bytes, attrs: Attrs, amount: int) -> None:
        """Add ``amount`` to the series (creating it, or routing to overflow, if new);
        an overflowed amount counts as that many points."""
        s = self.series.get((resource_key, attrs))
        if s is None:
            if len(self.series) < self.limit - 1:
                remember_resource(self.resources, resource_key)
                s = CounterSeries(resource_key, attrs, self._clock_ns())
                self.series[(resource_key, attrs)] = s
            else:
                self._on_overflow(self.metric_names, amount)
                key = (OVERFLOW_RESOURCE, OVERFLOW_ATTRS)
                s = self.series.get(key)
                if s is None:
                    s = CounterSeries(OVERFLOW_RESOURCE, OVERFLOW_ATTRS, self._clock_ns())
                    self.series[key] = s
        s.value += amount

    def __iter__(self) -> Iterator[CounterSeries]:
        return iter(self.series.values())


OTHER_VALUE: Final = "_OTHER"
"""What a capped label set's free values become (:class:`LabelCap`)."""


class LabelCap:
    """The label-set cap of one RL metric: the first ``cap`` distinct point-attribute
    sets are kept; a later new one has its free values (strings other than
    ``fixed`` keys' values) replaced by :data:`OTHER_VALUE`. Not thread-safe (the store's
    lock guards it)."""

    __slots__ = ("cap", "fixed", "overflowed", "seen")

    def __init__(self, cap: int, fixed: frozenset[str] = frozenset()) -> None:
        self.cap = cap
        self.fixed = fixed
        """Keys whose values are a small closed set (``gen_ai.token.type``): kept."""
        self.seen: set[Attrs] = set()
        self.overflowed = 0
        """Points whose attributes were capped."""

    def admit(self, attrs: Attrs, points: int) -> Attrs:
        """``attrs`` itself, or (a new tuple) its capped form when it is new, the cap is
        reached and it has a free value to replace; ``points`` are then counted in
        :attr:`overflowed`. (A set differing from the kept ones in fixed values only
        stays as it is: there are few.)"""
        if attrs in self.seen:
            return attrs
        if len(self.seen) < self.cap:
            self.seen.add(attrs)
            return attrs
        fixed = self.fixed
        if not any(isinstance(v, str) and k not in fixed and v != OTHER_VALUE for k, v in attrs):
            return attrs
        self.overflowed += points
        return tuple(
            (key, OTHER_VALUE if isinstance(value, str) and key not in fixed else value)
            for key, value in attrs
        )
