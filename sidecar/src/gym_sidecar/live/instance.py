"""The tracker's records: a server instance (one process) and a rollout in flight.

Plain mutable records, owned and changed by :class:`~gym_sidecar.live.tracker.LiveTracker`
on the event loop only.
"""

from __future__ import annotations

from gym_telemetry_semconv import live

from gym_sidecar.live.events import Sender

RolloutKey = tuple[bytes, bytes]
"""(trace id, span id) of a rollout's span."""
InstanceKey = tuple[str, str]
"""(server name, ``service.instance.id``)."""


class Rollout:
    """One rollout in flight. Times: ``*_ns`` on the sidecar's wall clock, ``*_mono`` on
    its monotonic clock."""

    __slots__ = (
        "instance_key",
        "key",
        "last_activity_ns",
        "rollout_id",
        "seen_mono",
        "server",
        "stalled",
        "start_seen",
        "started_ns",
        "step",
        "target",
        "turns",
    )

    def __init__(  # noqa: PLR0917 (one argument per field it is created with)
        self,
        key: RolloutKey,
        instance_key: InstanceKey,
        server: str,
        started_ns: int,
        start_seen: bool,
        seen_mono: int,
    ) -> None:
        self.key = key
        self.instance_key = instance_key
        self.server = server
        self.started_ns = started_ns
        """When it started (its start event's time); for a rollout first known from a
        step (``start_seen`` False), that step's time: it is at least this old."""
        self.start_seen = start_seen
        self.seen_mono = seen_mono
        """When the sidecar first heard of it."""
        self.rollout_id: str | None = None
        self.last_activity_ns = started_ns
        """Its start or the start of its latest step, whichever is later."""
        self.step: str | None = None
        """The latest step's name (the outbound hop span's, ``POST /v1/responses``)."""
        self.target: str | None = None
        """The Gym server that step is addressed to."""
        self.turns: int | None = None
        """Model calls so far (from the latest step event)."""
        self.stalled = False
        """Whether the last check found it stalled (set by the tracker's sweep only, so the
        live view and the gauges always agree)."""


class Instance:
    """One process of a Gym server, known from its live events."""

    __slots__ = (
        "idle_since_mono",
        "interval_s",
        "key",
        "last_seen_mono",
        "reported_in_flight",
        "rollouts",
        "sender",
        "stopped_mono",
        "superseded_mono",
    )

    def __init__(self, key: InstanceKey, sender: Sender, now_mono: int) -> None:
        self.key = key
        self.sender = sender
        self.last_seen_mono = now_mono
        self.interval_s = live.DEFAULT_INTERVAL_S
        """Its live-event interval (from its heartbeats; the default until one says)."""
        self.reported_in_flight: int | None = None
        """Rollouts in flight its latest heartbeat reported."""
        self.idle_since_mono: int | None = None
        """Since when its heartbeats report 0 rollouts in flight (None: not idle)."""
        self.stopped_mono: int | None = None
        """When its ``gym.agent.stop`` arrived."""
        self.superseded_mono: int | None = None
        """When a newer instance of the same server appeared (cleared by any sign of
        life from this one afterwards: then it is a replica, not a restart)."""
        self.rollouts: dict[RolloutKey, Rollout] = {}

    def alive(self, now_mono: int) -> None:
        """Something arrived from this instance now."""
        self.last_seen_mono = now_mono
        self.superseded_mono = None
