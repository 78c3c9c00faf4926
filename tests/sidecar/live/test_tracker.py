"""The live tracker's every transition, its caps and its gauges, on a hand-driven clock
(no real time anywhere)."""

from __future__ import annotations

from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.rollout_end import RolloutEnd
from gym_sidecar.live.api import build_view
from gym_sidecar.live.config import RolloutsConfig
from gym_sidecar.live.events import sender_of
from gym_sidecar.live.tracker import Clock, LiveTracker
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.derived import DerivedMetrics
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_semconv import live

from testkit.live_events import (
    T0,
    HandClock,
    S,
    event,
    heartbeat,
    ids,
    resource,
    start,
    step,
    stop,
)

CFG = {"stall_after_s": 10.0, "lost_after_s": 30.0, "stop_grace_s": 5.0}


class World:
    """A tracker on a hand clock, with its derived metrics and counters."""

    def __init__(self, **cfg: Any) -> None:
        self.clock = HandClock()
        self.metrics = SelfMetrics()
        self.derived = DerivedMetrics(MetricsConfig(), self.metrics, clock_ns=self.clock.wall_ns)
        self.cfg = RolloutsConfig(**{**CFG, **cfg})
        self.tracker = LiveTracker(
            self.cfg, self.derived, self.metrics, Clock(self.clock.wall_ns, self.clock.mono_ns)
        )

    def send(self, *events: Any, res: Any = None) -> None:
        self.tracker.receive(res if res is not None else resource(), list(events))

    def end(self, *ns: int, res: Any = None) -> None:
        key = (res if res is not None else resource()).SerializeToString()
        self.tracker.rollouts_ended([RolloutEnd(key, *ids(n)) for n in ns])

    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.tracker.sweep()

    def in_flight(self) -> dict[str, Any]:
        view = build_view(self.tracker)
        return {r.rollout_id or r.trace_id: r for r in view.in_flight}

    def lost(self) -> list[tuple[str | None, str]]:
        return [(r.rollout_id, r.lost_reason or "") for r in build_view(self.tracker).lost]

    def gauges(self) -> dict[str, tuple[int, int, int]]:
        """Per agent server name: (in flight, stalled, lost) as the next export carries."""
        snap = self.derived.collect()
        out: dict[str, list[int]] = {}
        for name, points in (
            ("in_flight", snap.rollout_in_flight),
            ("stalled", snap.rollout_stalled),
            ("lost", snap.rollout_lost),
        ):
            for p in points:
                server = _server(snap.resources[p.resource_key])
                out.setdefault(server, [0, 0, 0])[("in_flight", "stalled", "lost").index(name)] = (
                    int(p.value)
                )
        return {k: (v[0], v[1], v[2]) for k, v in out.items()}

    def events(self, name: str, outcome: str) -> int:
        return self.tracker.counters.events.get((name, outcome), 0)


def _server(res: Any) -> str:
    return next(kv.value.string_value for kv in res.attributes if kv.key == semconv.SERVER_NAME)


def test_a_start_puts_a_rollout_in_flight() -> None:
    w = World()
    w.send(start(1, T0 - 3 * S, rollout_id="7-0"), heartbeat(1))
    [r] = w.in_flight().values()
    assert (r.rollout_id, r.server, r.instance) == ("7-0", "agent_a", "i-1")
    assert r.started_unix_nano == T0 - 3 * S and r.start_seen
    assert r.last_activity_unix_nano == T0 - 3 * S
    assert (r.step, r.step_target, r.turns, r.stalled) == (None, None, None, False)
    assert w.events(live.EVENT_ROLLOUT_START, "applied") == 1
    w.tracker.sweep()
    assert w.gauges() == {"agent_a": (1, 0, 0)}


def test_a_step_sets_what_the_rollout_is_doing() -> None:
    w = World()
    w.send(start(1, T0 - 5 * S, rollout_id="r"))
    w.clock.advance(2)
    w.send(step(1, T0 + S, "POST /verify", "weather", 2))
    r = w.in_flight()["r"]
    assert (r.step, r.step_target, r.turns) == ("POST /verify", "weather", 2)
    assert r.last_activity_unix_nano == T0 + S
    assert r.started_unix_nano == T0 - 5 * S


def test_stalled_once_idle_for_stall_after_s_and_active_again_on_a_step() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="r"))
    w.tick(9.999)
    assert not w.in_flight()["r"].stalled
    assert w.gauges() == {"agent_a": (1, 0, 0)}
    w.tick(0.001)
    assert w.in_flight()["r"].stalled
    assert w.gauges() == {"agent_a": (1, 1, 0)}
    w.send(step(1, w.clock.wall))
    w.tracker.sweep()
    assert not w.in_flight()["r"].stalled
    assert w.gauges() == {"agent_a": (1, 0, 0)}


def test_the_rollout_span_ends_it_and_the_gauges_return_to_zero() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="a"), start(2, T0, rollout_id="b"))
    w.tick(11)
    assert w.gauges() == {"agent_a": (2, 2, 0)}
    w.end(1, 2)
    w.tracker.sweep()
    assert w.in_flight() == {}
    assert w.gauges() == {"agent_a": (0, 0, 0)}
    assert w.tracker.counters.rollouts == {"started": 2, "ended": 2}


def test_an_event_after_the_rollouts_span_is_ignored_for_lost_after_s() -> None:
    w = World()
    w.end(1)  # its span came first (spans and events travel apart)
    w.send(start(1, T0), step(1, T0))
    assert w.in_flight() == {}
    assert w.events(live.EVENT_ROLLOUT_START, "late") == 1
    assert w.events(live.EVENT_ROLLOUT_STEP, "late") == 1
    w.tick(29.9)
    w.send(step(1, w.clock.wall))
    assert w.in_flight() == {}
    w.tick(0.1)  # forgotten after lost_after_s
    assert w.tracker.ended == {}
    w.send(start(1, w.clock.wall))
    assert len(w.in_flight()) == 1


def test_a_nested_rollout_is_not_tracked() -> None:
    w = World()
    w.send(start(1, T0, **{semconv.ROLLOUT_NESTED: True}))
    assert w.in_flight() == {}
    assert w.events(live.EVENT_ROLLOUT_START, "nested") == 1


def test_a_step_of_an_unknown_rollout_tracks_it_from_there() -> None:
    w = World()  # e.g. the sidecar restarted: the agent announced the start to the old one
    w.send(step(1, T0 - 2 * S))
    [r] = w.in_flight().values()
    assert not r.start_seen and r.started_unix_nano == T0 - 2 * S
    w.send(start(1, T0 - 9 * S, rollout_id="x"))  # a start after all: its time wins
    r = w.in_flight()["x"]
    assert r.start_seen and r.started_unix_nano == T0 - 9 * S


def test_events_without_ids_or_names_are_counted_not_applied() -> None:
    w = World()
    w.send(event(live.EVENT_ROLLOUT_START), event("gym.something.else", 1), event("", 2))
    assert w.in_flight() == {}
    assert w.events(live.EVENT_ROLLOUT_START, "malformed") == 1
    assert w.events("other", "unknown") == 2


def test_stop_loses_what_is_still_in_flight_after_the_grace() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="a"), start(2, T0, rollout_id="b"))
    w.clock.advance(1)
    w.send(stop())
    w.end(2)  # its span was flushed after the stop
    w.tick(4.9)
    assert list(w.in_flight()) == ["a"]
    w.tick(0.1)
    assert w.in_flight() == {}
    assert w.lost() == [("a", "stopped")]
    assert w.gauges() == {"agent_a": (0, 0, 1)}
    assert w.tracker.instances == {}


def test_stop_without_grace_loses_at_the_next_check() -> None:
    w = World(stop_grace_s=0)
    w.send(start(1, T0, rollout_id="a"), stop())
    w.tracker.sweep()
    assert w.lost() == [("a", "stopped")]


def test_a_restart_loses_the_old_instances_rollouts() -> None:
    w = World()
    w.send(
        start(1, T0, rollout_id="old"), heartbeat(1, interval_s=1.0), res=resource(instance="i-1")
    )
    w.tick(2)
    w.send(start(2, w.clock.wall, rollout_id="new"), heartbeat(1), res=resource(instance="i-2"))
    w.tick(1.9)  # two of the old instance's intervals (1 s) after the new one appeared
    assert w.lost() == []
    w.tick(0.1)
    assert w.lost() == [("old", "restarted")]
    assert list(w.in_flight()) == ["new"]
    assert w.gauges() == {"agent_a": (1, 0, 1)}
    assert set(w.tracker.instances) == {("agent_a", "i-2")}


def test_a_replica_that_keeps_sending_is_not_a_restart() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="a"), heartbeat(1), res=resource(instance="i-1"))
    w.tick(1)
    w.send(start(2, w.clock.wall, rollout_id="b"), heartbeat(1), res=resource(instance="i-2"))
    for _ in range(10):
        w.tick(2)
        w.send(heartbeat(1), res=resource(instance="i-1"))
        w.send(heartbeat(1), res=resource(instance="i-2"))
    assert w.lost() == []
    assert set(w.in_flight()) == {"a", "b"}
    assert w.gauges() == {"agent_a": (2, 2, 0)}


def test_silence_loses_the_rollouts_after_lost_after_s() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="a"), heartbeat(1))
    w.send(start(9, T0, rollout_id="z"), heartbeat(1), res=resource("agent_b", "j-1"))
    w.tick(29.9)
    w.send(heartbeat(1), res=resource("agent_b", "j-1"))
    assert w.lost() == []
    w.tick(0.1)
    assert w.lost() == [("a", "silent")]
    assert w.gauges() == {"agent_a": (0, 0, 1), "agent_b": (1, 1, 0)}


def test_any_request_from_the_instance_keeps_it_alive() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="a"))
    for _ in range(5):
        w.tick(20)
        w.tracker.seen(resource().SerializeToString())  # e.g. a trace request of its spans
    assert w.lost() == [] and list(w.in_flight()) == ["a"]
    w.tracker.seen_sender(sender_of(resource("agent_a", "other")))  # not this instance
    w.tick(30)
    assert w.lost() == [("a", "silent")]


def test_a_rollout_the_agent_no_longer_has_but_whose_span_never_came_vanishes() -> None:
    w = World()
    w.send(start(1, T0, rollout_id="a"), heartbeat(1))
    w.tick(2)
    w.send(heartbeat(0))  # it ended; its span was lost on the way
    for _ in range(14):
        w.tick(2)
        w.send(heartbeat(0))
    assert list(w.in_flight()) == ["a"]
    w.tick(2)
    assert w.in_flight() == {} and w.lost() == []
    assert w.tracker.counters.rollouts == {"started": 1, "vanished": 1}
    assert w.gauges() == {"agent_a": (0, 0, 0)}


def test_max_rollouts_refuses_new_rollouts_and_counts() -> None:
    w = World(max_rollouts=2)
    w.send(start(1, T0), start(2, T0), start(3, T0), step(4, T0))
    assert len(w.in_flight()) == 2
    assert w.events(live.EVENT_ROLLOUT_START, "refused") == 1
    assert w.events(live.EVENT_ROLLOUT_STEP, "refused") == 1
    assert w.metrics.limit_hits.labels("rollouts.max_rollouts").value == 2
    w.end(1)
    w.send(start(3, T0))
    assert len(w.in_flight()) == 2


def test_max_rollouts_also_bounds_the_ended_ids_remembered() -> None:
    w = World(max_rollouts=3)
    w.end(1, 2, 3, 4)
    assert len(w.tracker.ended) == 3
    assert w.metrics.limit_hits.labels("rollouts.max_rollouts").value == 1


def test_max_instances_refuses_a_new_instance_and_counts() -> None:
    w = World(max_instances=1)
    w.send(heartbeat(0), res=resource("a", "1"))
    w.send(start(1, T0), heartbeat(1), res=resource("b", "1"))
    assert w.in_flight() == {}
    assert w.events(live.EVENT_ROLLOUT_START, "refused") == 1
    assert w.events(live.EVENT_HEARTBEAT, "refused") == 1
    assert w.metrics.limit_hits.labels("rollouts.max_instances").value == 1


def test_the_lost_list_keeps_the_newest_and_marks_late_ends() -> None:
    w = World(recent_lost=2)
    w.send(*(start(n, T0, rollout_id=f"r{n}") for n in range(1, 4)), stop())
    w.tick(5)
    assert [r for r, _ in w.lost()] == ["r3", "r2"]  # newest first, r1 dropped
    w.end(3)
    view = build_view(w.tracker)
    assert [(r.rollout_id, r.ended_after_lost) for r in view.lost] == [("r3", True), ("r2", False)]
    assert w.tracker.counters.rollouts["ended_after_lost"] == 1
    assert w.gauges() == {"agent_a": (0, 0, 3)}  # every loss counted, listed or not


def test_event_times_move_onto_the_sidecars_clock() -> None:
    w = World()
    skew = 3600 * S  # the agent's clock is an hour behind
    w.send(start(1, T0 - skew - 4 * S, observed_ns=T0 - skew - S))
    [r] = w.in_flight().values()
    assert r.started_unix_nano == T0 - 3 * S
    w.send(start(2, T0 + 99 * S))  # never later than its arrival
    assert {v.started_unix_nano for v in w.in_flight().values()} == {T0 - 3 * S, T0}


def test_heartbeats_lag_histograms_merge_exactly() -> None:
    w = World()
    n = len(live.EVENT_LOOP_LAG_BOUNDS_MS) + 1
    first = tuple([3] + [0] * (n - 2) + [1])
    second = tuple([0, 2] + [0] * (n - 2))
    lag = {
        live.LAG_COUNT: 4,
        live.LAG_SUM: 20_001.5,
        live.LAG_MAX: 20_000.0,
        live.LAG_BUCKET_COUNTS: first,
    }
    w.send(heartbeat(0, **lag), res=resource("model", "m-1"))
    w.send(
        heartbeat(
            0,
            **{
                live.LAG_COUNT: 2,
                live.LAG_SUM: 3.0,
                live.LAG_MAX: 1.75,
                live.LAG_BUCKET_COUNTS: second,
            },
        ),
        res=resource("model", "m-1"),
    )
    [p] = w.derived.collect().event_loop_lag
    assert p.bucket_counts == [a + b for a, b in zip(first, second, strict=True)]
    assert (p.count, p.sum, p.max, p.min) == (6, 20_004.5, 20_000.0, None)
    assert w.events(live.EVENT_HEARTBEAT, "applied") == 2


@pytest.mark.parametrize(
    "bad",
    [
        {live.LAG_BUCKET_COUNTS: (1, 2)},  # wrong number of buckets
        {live.LAG_COUNT: 5},  # counts do not add up
        {live.LAG_SUM: -1.0},
        {live.LAG_MAX: float("nan")},
        {live.LAG_BUCKET_COUNTS: tuple([-1, 2] + [0] * 12)},
    ],
)
def test_a_lag_histogram_that_does_not_hold_together_is_counted_and_skipped(
    bad: dict[str, Any],
) -> None:
    w = World()
    n = len(live.EVENT_LOOP_LAG_BOUNDS_MS) + 1
    lag: dict[str, Any] = {
        live.LAG_COUNT: 1,
        live.LAG_SUM: 1.0,
        live.LAG_MAX: 1.0,
        live.LAG_BUCKET_COUNTS: tuple([1] + [0] * (n - 1)),
        **bad,
    }
    w.send(heartbeat(0, **lag))
    assert w.derived.collect().event_loop_lag == []
    assert w.events(live.EVENT_HEARTBEAT, "malformed") == 1


def test_each_agent_server_has_its_own_series_and_a_restart_keeps_it() -> None:
    w = World()
    w.send(start(1, T0), res=resource("agent_a", "1"))
    w.send(start(2, T0), res=resource("agent_b", "1"))
    w.send(start(3, T0), stop(), res=resource("agent_b", "2"))  # b restarted, then stopped
    w.tick(5)
    assert w.gauges() == {"agent_a": (1, 0, 0), "agent_b": (0, 0, 2)}
    assert sorted(w.lost()) == [(None, "restarted"), (None, "stopped")]
    assert len(w.derived.live.rollouts) == 2  # instance and process ids are not in them
