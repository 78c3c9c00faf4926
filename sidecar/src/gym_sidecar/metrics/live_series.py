"""The live metrics' series: rollouts in flight, stalled and lost per agent server, and the
event-loop lag per server (issue 41).

The live tracker (``gym_sidecar.live``) computes the values; this module holds them the
way the derived metrics hold theirs, so that they leave by the same two paths (the
derive stage's OTLP export every ``metrics.interval_s``, and ``/metrics``):

- ``gym.rollout.in_flight``, ``gym.rollout.stalled``: gauges, one series per agent
  server, set as a whole by :meth:`LiveSeries.set_rollouts` (a server not named is 0:
  they return to 0 once every rollout ended or was declared lost);
- ``gym.rollout.lost``: a counter per agent server (:meth:`LiveSeries.add_lost`);
- ``gym.server.event_loop.lag_ms``: a histogram per server over
  ``gym_telemetry_semconv.live.EVENT_LOOP_LAG_BOUNDS_MS``, the heartbeats' pre-aggregated
  buckets merged exactly (:meth:`LiveSeries.add_lag`).

A series' resource is the server's (the tracker passes its serialized bytes: the
instance's resource without ``service.instance.id`` and ``process.*``, so a restart does
not start a new series). Servers are bounded by ``metrics.cardinality_limit`` like every
derived metric: past ``limit - 1`` servers, new ones share the overflow series (empty
resource, ``otel.metric.overflow=true``), each such server counted once in
``overflow_points`` (per metric) and ``limit_hits{limit="metrics.cardinality_limit"}``.

Thread-safety: none here; :class:`~gym_sidecar.metrics.derived.DerivedMetrics` guards it
with its lock (the tracker takes it around every call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import live
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.metrics.series import (
    OVERFLOW_ATTRS,
    OVERFLOW_RESOURCE,
    Attrs,
    HistogramTable,
    remember_resource,
)

ROLLOUT_METRICS: Final = (
    semconv.METRIC_ROLLOUT_IN_FLIGHT,
    semconv.METRIC_ROLLOUT_STALLED,
    semconv.METRIC_ROLLOUT_LOST,
)
LAG_BOUNDS_MS: Final[list[float]] = [float(b) for b in live.EVENT_LOOP_LAG_BOUNDS_MS]


class RolloutSeries:
    """One agent server's in-flight and stalled gauges and its lost counter."""

    __slots__ = (
        "attrs",
        "in_flight",
        "lost",
        "prev_lost",
        "prev_time_ns",
        "resource_key",
        "stalled",
        "start_time_ns",
    )

    def __init__(self, resource_key: bytes, attrs: Attrs, now_ns: int) -> None:
        self.resource_key = resource_key
        self.attrs = attrs
        self.start_time_ns = now_ns
        self.in_flight = 0
        self.stalled = 0
        self.lost = 0
        """Rollouts declared lost since the series was created (cumulative)."""
        self.prev_lost = 0
        """``lost`` as the last accepted export carried it (for delta temporality)."""
        self.prev_time_ns = now_ns


class LiveSeries:
    """The live metrics of one sidecar (see the module docstring)."""

    def __init__(
        self,
        *,
        cardinality_limit: int,
        clock_ns: Callable[[], int],
        on_overflow: Callable[[tuple[str, ...], int], None],
        resources: dict[bytes, Resource],
    ) -> None:
        self._limit = cardinality_limit
        self._clock_ns = clock_ns
        self._on_overflow = on_overflow
        self._resources = resources
        self.rollouts: dict[bytes, RolloutSeries] = {}
        """Per agent server resource (or :data:`OVERFLOW_RESOURCE`)."""
        self._overflowed: set[bytes] = set()
        """Servers routed to the overflow series and counted (at most the limit of them
        are remembered; past that each routing counts again)."""
        self.lag = HistogramTable(
            metric_names=(semconv.METRIC_EVENT_LOOP_LAG,),
            bounds=LAG_BOUNDS_MS,
            cardinality_limit=cardinality_limit,
            clock_ns=clock_ns,
            on_overflow=on_overflow,
            resources=resources,
        )

    def _series(self, resource_key: bytes) -> RolloutSeries:
        series = self.rollouts.get(resource_key)
        if series is not None:
            return series
        regular = len(self.rollouts) - (OVERFLOW_RESOURCE in self.rollouts)
        if regular < self._limit - 1:
            remember_resource(self._resources, resource_key)
            series = RolloutSeries(resource_key, (), self._clock_ns())
            self.rollouts[resource_key] = series
            return series
        if resource_key not in self._overflowed:
            self._on_overflow(ROLLOUT_METRICS, 1)
            if len(self._overflowed) < self._limit:
                self._overflowed.add(resource_key)
        overflow = self.rollouts.get(OVERFLOW_RESOURCE)
        if overflow is None:
            overflow = RolloutSeries(OVERFLOW_RESOURCE, OVERFLOW_ATTRS, self._clock_ns())
            self.rollouts[OVERFLOW_RESOURCE] = overflow
        return overflow

    def add_server(self, resource_key: bytes) -> None:
        """Make sure agent server ``resource_key`` has its series (0 in flight, 0 lost)."""
        self._series(resource_key)

    def set_rollouts(self, values: Mapping[bytes, tuple[int, int]]) -> None:
        """Set every server's gauges: ``values`` maps a server's resource to (in flight,
        stalled); servers not in it are set to 0. A server new here gets its series (or
        is added into the overflow series)."""
        for series in self.rollouts.values():
            series.in_flight = 0
            series.stalled = 0
        for key, (in_flight, stalled) in values.items():
            series = self._series(key)
            series.in_flight += in_flight
            series.stalled += stalled

    def add_lost(self, resource_key: bytes, count: int) -> None:
        """``count`` rollouts of agent server ``resource_key`` were declared lost."""
        self._series(resource_key).lost += count

    def add_lag(
        self, resource_key: bytes, counts: Sequence[int], count: int, total_ms: float, max_ms: float
    ) -> None:
        """Merge one heartbeat's lag histogram (``counts`` over :data:`LAG_BOUNDS_MS`, one
        per bucket, summing to ``count``; the caller checks) into server ``resource_key``'s."""
        self.lag.get(resource_key, (), count).add_counts(counts, count, total_ms, max_ms)

    def __iter__(self) -> Iterator[RolloutSeries]:
        return iter(self.rollouts.values())
