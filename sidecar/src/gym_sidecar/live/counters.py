"""The live area's own counters, and their exposition on ``/metrics``.

- ``gym_sidecar_live_events_total{event, outcome}``: live events by name (``other`` for
  a name that is not a live event's) and what the tracker did with them;
- ``gym_sidecar_live_rollouts_total{outcome}``: rollouts ``started`` (first tracked),
  ``ended`` (their span arrived), ``lost``, ``vanished``, ``ended_after_lost``;
- ``gym_sidecar_live_tracked{what}`` (gauge): ``rollouts`` in flight, ``instances``,
  ``ended_remembered``, ``lost_kept``.

Counters are bumped on the event loop; the collector copies them at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gym_telemetry_semconv import live
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass
class LiveCounters:
    """What the tracker did, for ``/metrics`` (``gym_sidecar_live_*``)."""

    events: dict[tuple[str, str], int] = field(default_factory=dict)
    """(event name or ``other``, outcome) -> events: ``applied``, ``late`` (its rollout
    already ended), ``nested`` (a rollout inside another: not tracked), ``refused`` (a
    cap), ``malformed`` (no ids, bad values), ``unknown`` (not a live event name)."""
    rollouts: dict[str, int] = field(default_factory=dict)
    """outcome -> rollouts: ``started``, ``ended``, ``lost``, ``vanished``,
    ``ended_after_lost``."""

    def event(self, name: str, outcome: str) -> None:
        key = (name if name in live.EVENTS else "other", outcome)
        self.events[key] = self.events.get(key, 0) + 1

    def rollout(self, outcome: str, n: int = 1) -> None:
        self.rollouts[outcome] = self.rollouts.get(outcome, 0) + n


class LiveCollector:
    """Renders :class:`LiveCounters` and the tracker's sizes at each scrape."""

    def __init__(self, counters: LiveCounters, sizes: Callable[[], dict[str, int]]) -> None:
        self.counters = counters
        self.sizes = sizes

    def describe(self) -> list[Metric]:
        return [
            CounterMetricFamily("gym_sidecar_live_events", ""),
            CounterMetricFamily("gym_sidecar_live_rollouts", ""),
            GaugeMetricFamily("gym_sidecar_live_tracked", ""),
        ]

    def collect(self) -> Iterable[Metric]:
        events = CounterMetricFamily(
            "gym_sidecar_live_events",
            "Live events received, by event and what the tracker did with them.",
            labels=["event", "outcome"],
        )
        for (name, outcome), n in sorted(dict(self.counters.events).items()):
            events.add_metric([name, outcome], n)
        yield events
        rollouts = CounterMetricFamily(
            "gym_sidecar_live_rollouts",
            "Rollouts tracked live, by outcome.",
            labels=["outcome"],
        )
        for outcome, n in sorted(dict(self.counters.rollouts).items()):
            rollouts.add_metric([outcome], n)
        yield rollouts
        tracked = GaugeMetricFamily(
            "gym_sidecar_live_tracked", "What the live tracker holds now.", labels=["what"]
        )
        for what, n in self.sizes().items():
            tracked.add_metric([what], n)
        yield tracked
