"""The rollouts in flight, per server instance, from the live events and the rollout ends.

A rollout is known from its ``gym.rollout.start`` (or, after a sidecar restart, from its
first ``gym.rollout.step``) until one of:

- **ended**: its rollout span arrived (:meth:`LiveTracker.rollouts_ended`, from the
  derive stage); a start or step arriving afterwards (spans and events travel apart) is
  ignored, the end being remembered for ``lost_after_s`` (at most ``max_rollouts`` ends);
- **lost**, with a reason, when its server instance (a process: ``service.instance.id``)
  - ``stopped``: sent ``gym.agent.stop``; its rollouts still in flight ``stop_grace_s``
    later are lost (the agent flushes its last spans after the stop);
  - ``restarted``: a new instance of the same server (``nemo.gym.server.name``, else
    ``service.name``) appeared and the old one then stayed silent for two of its
    heartbeat intervals (an old instance that keeps sending is a replica, not a restart);
  - ``silent``: nothing from it (a live event, or any OTLP request with its resource,
    :meth:`LiveTracker.seen`) for ``lost_after_s``;
- **vanished**: its instance kept reporting 0 rollouts in flight for ``lost_after_s``
  although the rollout was announced before that: it ended but its span never came
  (dropped on the way); counted apart, neither ended nor lost.

While in flight a rollout is **stalled** when its last activity (its start, the start of
its latest step) is ``stall_after_s`` old or older; a new step makes it active again.
Stalls are decided by :meth:`LiveTracker.sweep` (every ``check_interval_s``), which also
sets the gauges from the same decision: the live view and the gauges always agree.

Times: an event's time is the sender's clock, moved onto the sidecar's by the request's
own ``observed_time_unix_nano`` (written when the request was built: the offset is the
clock skew plus the transport delay) and never later than its arrival. Silences are
measured on the monotonic clock. Both clocks are injected (:class:`Clock`).

Bounded: ``max_rollouts`` rollouts in flight and ended ids remembered, ``max_instances``
instances, ``recent_lost`` lost rollouts kept for the view; refusals are counted
(:class:`LiveCounters`, ``limit_hits``). Rollouts that started and ended between two
sends of their agent are never announced, so never appear here.

Loop-confined: every method runs on the sidecar's event loop; the live gauges are
written into the derived metrics under their lock (:meth:`LiveTracker.sweep`).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import live
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.core.rollout_end import RolloutEnd
from gym_sidecar.live.config import RolloutsConfig
from gym_sidecar.live.counters import LiveCollector, LiveCounters
from gym_sidecar.live.events import EventValue, LiveEvent, Sender, sender_of
from gym_sidecar.live.instance import Instance, Rollout
from gym_sidecar.metrics.derived import DerivedMetrics
from gym_sidecar.selfmetrics import SelfMetrics

NS_PER_S: Final = 1_000_000_000
RESTART_GRACE_INTERVALS: Final = 2.0
"""An old instance silent this many of its heartbeat intervals after a new instance of
its server appeared has restarted."""
SENDER_CACHE_MAX: Final = 1024
"""Resources (as bytes) whose sender is remembered for :meth:`LiveTracker.seen`; the
cache is emptied when full."""
LOST_REASONS: Final = ("stopped", "restarted", "silent")
LIMIT_ROLLOUTS: Final = "rollouts.max_rollouts"
LIMIT_INSTANCES: Final = "rollouts.max_instances"


@dataclass(frozen=True, slots=True)
class Clock:
    """The tracker's clocks: wall time (event times, ages) and monotonic (silences)."""

    wall_ns: Callable[[], int] = time.time_ns
    mono_ns: Callable[[], int] = time.monotonic_ns


@dataclass(slots=True)
class LostRollout:
    rollout: Rollout
    lost_ns: int
    reason: str
    ended_after: bool = False
    """Its span arrived after it was declared lost (the server was not gone after all)."""


class LiveTracker:
    """Rollouts in flight, stalled and lost (see the module docstring)."""

    def __init__(
        self,
        cfg: RolloutsConfig,
        derived: DerivedMetrics,
        selfmetrics: SelfMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.cfg = cfg
        self.derived = derived
        self.clock = clock or Clock()
        self.instances: dict[tuple[str, str], Instance] = {}
        self.rollouts: dict[tuple[bytes, bytes], Rollout] = {}
        """Every rollout in flight, by (trace id, span id)."""
        self.ended: OrderedDict[tuple[bytes, bytes], int] = OrderedDict()
        """Ids of rollouts ended while not in flight here -> when (monotonic ns)."""
        self.lost: deque[LostRollout] = deque(maxlen=cfg.recent_lost)
        self._lost_index: dict[tuple[bytes, bytes], LostRollout] = {}
        self.lost_by_server: dict[str, int] = {}
        """Rollouts declared lost per server name (at most ``max_instances`` names; the
        rest under ``_OTHER``)."""
        self.counters = LiveCounters()
        if selfmetrics is not None:
            selfmetrics.registry.register(LiveCollector(self.counters, self._sizes))
        self._senders: dict[bytes, Sender] = {}
        self._stall_ns = int(cfg.stall_after_s * NS_PER_S)
        self._lost_ns = int(cfg.lost_after_s * NS_PER_S)
        self._stop_grace_ns = int(cfg.stop_grace_s * NS_PER_S)
        self._limit_hits = selfmetrics.limit_hits if selfmetrics is not None else None

    # -- input --------------------------------------------------------------------------
    def receive(self, resource: Resource, events: Sequence[LiveEvent]) -> None:
        """Apply the live events one process sent in one request, in order."""
        now_wall, now_mono = self.clock.wall_ns(), self.clock.mono_ns()
        inst = self._instance(sender_of(resource), now_mono)
        if inst is None:
            for ev in events:
                self.counters.event(ev.name, "refused")
            return
        for ev in events:
            self.counters.event(ev.name, self._apply(inst, ev, now_wall, now_mono))

    def seen(self, resource: bytes) -> None:
        """A request with this serialized resource arrived: a sign of its instance's life.
        Costs a dict lookup (the resource is parsed once, then cached)."""
        if not self.instances:
            return
        sender = self._senders.get(resource)
        if sender is None:
            if len(self._senders) >= SENDER_CACHE_MAX:
                self._senders.clear()
            sender = self._senders[resource] = sender_of(Resource.FromString(resource))
        self.seen_sender(sender)

    def seen_sender(self, sender: Sender) -> None:
        """As :meth:`seen`, for a sender already read."""
        inst = self.instances.get((sender.server, sender.instance))
        if inst is not None:
            inst.alive(self.clock.mono_ns())

    def rollouts_ended(self, ends: Sequence[RolloutEnd]) -> None:
        """Rollout spans arrived (the derive stage's sink): their rollouts end."""
        now_mono = self.clock.mono_ns()
        for end in ends:
            key = (end.trace_id, end.span_id)
            if not end.trace_id or not end.span_id:
                continue
            rollout = self.rollouts.pop(key, None)
            if rollout is not None:
                inst = self.instances.get(rollout.instance_key)
                if inst is not None:
                    inst.rollouts.pop(key, None)
                self.counters.rollout("ended")
                continue
            lost = self._lost_index.get(key)
            if lost is not None and not lost.ended_after:
                lost.ended_after = True
                self.counters.rollout("ended_after_lost")
            self._remember_end(key, now_mono)

    # -- events -------------------------------------------------------------------------
    def _apply(self, inst: Instance, ev: LiveEvent, now_wall: int, now_mono: int) -> str:
        if ev.name == live.EVENT_HEARTBEAT:
            return self._heartbeat(inst, ev, now_mono)
        if ev.name == live.EVENT_STOP:
            if inst.stopped_mono is None:
                inst.stopped_mono = now_mono
            return "applied"
        if ev.name not in (live.EVENT_ROLLOUT_START, live.EVENT_ROLLOUT_STEP):
            return "unknown"
        if len(ev.trace_id) != 16 or len(ev.span_id) != 8:
            return "malformed"
        key = (ev.trace_id, ev.span_id)
        if key in self.ended or key in self._lost_index:
            return "late"
        when = self._when(ev, now_wall)
        rollout = self.rollouts.get(key)
        is_start = ev.name == live.EVENT_ROLLOUT_START
        if rollout is None:
            if is_start and ev.attributes.get(semconv.ROLLOUT_NESTED) is True:
                return "nested"
            if len(self.rollouts) >= self.cfg.max_rollouts:
                self._hit(LIMIT_ROLLOUTS)
                return "refused"
            rollout = Rollout(key, inst.key, inst.sender.server, when, is_start, now_mono)
            self.rollouts[key] = rollout
            inst.rollouts[key] = rollout
            self.counters.rollout("started")
            with self.derived.lock:
                self.derived.live.add_server(inst.sender.server_resource)
        elif is_start and not rollout.start_seen:
            rollout.started_ns, rollout.start_seen = when, True
        rollout_id = ev.attributes.get(semconv.ROLLOUT_ID)
        if isinstance(rollout_id, str) and rollout_id:
            rollout.rollout_id = rollout_id
        rollout.last_activity_ns = max(rollout.last_activity_ns, when)
        if not is_start:
            step = ev.attributes.get(live.ROLLOUT_STEP)
            target = ev.attributes.get(live.ROLLOUT_STEP_TARGET)
            turns = ev.attributes.get(semconv.ROLLOUT_TURNS)
            rollout.step = step if isinstance(step, str) else None
            rollout.target = target if isinstance(target, str) else None
            if type(turns) is int and turns >= 0:
                rollout.turns = turns
        return "applied"

    def _heartbeat(self, inst: Instance, ev: LiveEvent, now_mono: int) -> str:
        attrs = ev.attributes
        interval = attrs.get(live.LIVE_INTERVAL_S)
        if (
            isinstance(interval, int | float)
            and not isinstance(interval, bool)
            and 0 < interval <= self.cfg.lost_after_s
        ):
            inst.interval_s = float(interval)
        in_flight = attrs.get(live.ROLLOUTS_IN_FLIGHT)
        if type(in_flight) is int and in_flight >= 0:
            inst.reported_in_flight = in_flight
            if in_flight > 0:
                inst.idle_since_mono = None
            elif inst.idle_since_mono is None:
                inst.idle_since_mono = now_mono
        if live.LAG_COUNT not in attrs:
            return "applied"
        lag = _lag(attrs)
        if lag is None:
            return "malformed"
        counts, count, total, high = lag
        if count:
            with self.derived.lock:
                self.derived.live.add_lag(inst.sender.server_resource, counts, count, total, high)
        return "applied"

    def _when(self, ev: LiveEvent, now_wall: int) -> int:
        """The event's time on the sidecar's wall clock (module docstring)."""
        when = ev.time_ns or now_wall
        if ev.observed_ns:
            when += now_wall - ev.observed_ns
        return max(0, min(when, now_wall))

    def _instance(self, sender: Sender, now_mono: int) -> Instance | None:
        key = (sender.server, sender.instance)
        inst = self.instances.get(key)
        if inst is not None:
            inst.alive(now_mono)
            return inst
        if len(self.instances) >= self.cfg.max_instances:
            self._hit(LIMIT_INSTANCES)
            return None
        for other in self.instances.values():
            if other.sender.server == sender.server and other.superseded_mono is None:
                other.superseded_mono = now_mono
        inst = self.instances[key] = Instance(key, sender, now_mono)
        return inst

    # -- time ---------------------------------------------------------------------------
    def sweep(self) -> None:
        """Apply the time-based transitions (stalled, stopped, restarted, silent,
        vanished), forget old ends, and set the live gauges. Run every
        ``check_interval_s``."""
        now_wall, now_mono = self.clock.wall_ns(), self.clock.mono_ns()
        for key, inst in list(self.instances.items()):
            reason = self._gone(inst, now_mono)
            if reason is not None:
                self._lose(inst, reason, now_wall)
                del self.instances[key]
                continue
            idle = inst.idle_since_mono
            if idle is not None and now_mono - idle >= self._lost_ns:
                gone = [r for r in inst.rollouts.values() if r.seen_mono < idle]
                for rollout in gone:
                    self._forget(inst, rollout)
                self.counters.rollout("vanished", len(gone))
            stall_before = now_wall - self._stall_ns
            for rollout in inst.rollouts.values():
                rollout.stalled = rollout.last_activity_ns <= stall_before
        horizon = now_mono - self._lost_ns
        while self.ended:
            ended_key, when = next(iter(self.ended.items()))
            if when > horizon:
                break
            del self.ended[ended_key]
        self._set_gauges()

    def _gone(self, inst: Instance, now_mono: int) -> str | None:
        if inst.stopped_mono is not None and now_mono - inst.stopped_mono >= self._stop_grace_ns:
            return "stopped"
        superseded = inst.superseded_mono
        if superseded is not None:
            grace = RESTART_GRACE_INTERVALS * inst.interval_s * NS_PER_S
            if now_mono - superseded >= min(grace, self._lost_ns):
                return "restarted"
        if now_mono - inst.last_seen_mono >= self._lost_ns:
            return "silent"
        return None

    def _lose(self, inst: Instance, reason: str, now_wall: int) -> None:
        rollouts = list(inst.rollouts.values())
        for rollout in rollouts:
            self._forget(inst, rollout)
            if self.lost.maxlen:
                if len(self.lost) == self.lost.maxlen:
                    evicted = self.lost[0]
                    self._lost_index.pop(evicted.rollout.key, None)
                record = LostRollout(rollout, now_wall, reason)
                self.lost.append(record)
                self._lost_index[rollout.key] = record
        if not rollouts:
            return
        self.counters.rollout("lost", len(rollouts))
        server = inst.sender.server
        if server not in self.lost_by_server and len(self.lost_by_server) >= self.cfg.max_instances:
            server = "_OTHER"
        self.lost_by_server[server] = self.lost_by_server.get(server, 0) + len(rollouts)
        with self.derived.lock:
            self.derived.live.add_lost(inst.sender.server_resource, len(rollouts))

    def _forget(self, inst: Instance, rollout: Rollout) -> None:
        inst.rollouts.pop(rollout.key, None)
        self.rollouts.pop(rollout.key, None)

    def _remember_end(self, key: tuple[bytes, bytes], now_mono: int) -> None:
        ended = self.ended
        ended[key] = now_mono
        ended.move_to_end(key)
        if len(ended) > self.cfg.max_rollouts:
            ended.popitem(last=False)
            self._hit(LIMIT_ROLLOUTS)

    def _sizes(self) -> dict[str, int]:
        return {
            "rollouts": len(self.rollouts),
            "instances": len(self.instances),
            "ended_remembered": len(self.ended),
            "lost_kept": len(self.lost),
        }

    def _hit(self, limit: str) -> None:
        if self._limit_hits is not None:
            self._limit_hits.labels(limit).inc()

    def per_server(self) -> dict[bytes, tuple[int, int]]:
        """(in flight, stalled) per agent server resource (stalled as last decided)."""
        values: dict[bytes, tuple[int, int]] = {}
        for inst in self.instances.values():
            if not inst.rollouts:
                continue
            stalled = sum(r.stalled for r in inst.rollouts.values())
            key = inst.sender.server_resource
            n, s = values.get(key, (0, 0))
            values[key] = (n + len(inst.rollouts), s + stalled)
        return values

    def _set_gauges(self) -> None:
        values = self.per_server()
        with self.derived.lock:
            self.derived.live.set_rollouts(values)


def _lag(attrs: dict[str, EventValue]) -> tuple[list[int], int, float, float] | None:
    """A heartbeat's lag histogram (counts per bucket, count, sum, max), or None when it
    does not hold together (wrong number of buckets, negative or inconsistent counts,
    values that are not finite and non-negative)."""
    counts = attrs.get(live.LAG_BUCKET_COUNTS)
    count = attrs.get(live.LAG_COUNT)
    total = attrs.get(live.LAG_SUM)
    high = attrs.get(live.LAG_MAX)
    if not isinstance(counts, tuple) or type(count) is not int:
        return None
    if len(counts) != len(live.EVENT_LOOP_LAG_BOUNDS_MS) + 1 or any(c < 0 for c in counts):
        return None
    if sum(counts) != count:
        return None
    values = []
    for v in (total, high):
        if isinstance(v, bool) or not isinstance(v, int | float):
            return None
        if not 0.0 <= v < float("inf"):
            return None
        values.append(float(v))
    return list(counts), count, values[0], values[1]
