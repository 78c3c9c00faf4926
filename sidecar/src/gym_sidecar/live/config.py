"""Configuration of rollouts live (owned by live/): the ``rollouts`` section.

Every bound here is explicit and counted when it engages: a start or a step refused by
``max_rollouts`` and an event of a new instance refused by ``max_instances`` are counted in
``gym_sidecar_limit_hits{limit="rollouts.max_rollouts" | "rollouts.max_instances"}`` and
``gym_sidecar_live_events_total{outcome="refused"}``.
"""

from __future__ import annotations

from gym_sidecar.configmodel import Field, Section

DEFAULT_STALL_AFTER_S = 300.0
"""A model call generating a long answer on a busy inference engine, or a sandboxed tool
run, can take minutes without anything being wrong; five minutes without a new step is
past what a healthy rollout shows (lower it where steps are short)."""
DEFAULT_LOST_AFTER_S = 30.0
"""Fifteen heartbeats at the agent's default interval (2 s) missed in a row."""


class RolloutsConfig(Section):
    """The ``rollouts`` section: how live events become rollouts in flight, stalled and
    lost (docs/sidecar.md, "Rollouts live")."""

    enabled: bool = True
    """False: no tracking, no live gauges, no ``/v1/rollouts/live`` data. The live events
    are still consumed (or forwarded, see ``forward_events``). The tracker also needs
    the derive stage (``metrics.enabled``), which tells it where rollouts end."""
    stall_after_s: float = Field(default=DEFAULT_STALL_AFTER_S, gt=0)
    """An in-flight rollout with no activity (its start, a new step) for this long is
    stalled (env ``GYM_SIDECAR_ROLLOUTS__STALL_AFTER_S``)."""
    lost_after_s: float = Field(default=DEFAULT_LOST_AFTER_S, gt=0)
    """A server instance from which nothing (no heartbeat, no other OTLP) arrived for this
    long is gone: its in-flight rollouts are lost (env
    ``GYM_SIDECAR_ROLLOUTS__LOST_AFTER_S``). Also how long an ended rollout is remembered,
    so that a start or step arriving after its span is not taken for a new rollout."""
    stop_grace_s: float = Field(default=5.0, ge=0)
    """After ``gym.agent.stop``, the instance's rollouts still in flight this much later are
    lost. The agent sends the stop before it flushes its last spans, so without a grace
    the rollouts that ended just before the shutdown would be counted lost; 0: at once."""
    check_interval_s: float = Field(default=1.0, gt=0)
    """How often stalls and silences are checked and the live gauges updated (a silent
    instance is declared gone at most this long after ``lost_after_s``)."""
    max_rollouts: int = Field(default=100_000, ge=1)
    """Most rollouts tracked in flight (all instances together); a new one past it is
    refused and counted. Also the most ended rollouts remembered."""
    max_instances: int = Field(default=10_000, ge=1)
    """Most server instances (processes) tracked; events of a new one past it are
    refused and counted."""
    recent_lost: int = Field(default=100, ge=0, le=10_000)
    """How many lost rollouts the live view keeps (newest first)."""
    forward_events: bool = False
    """Also send the live events on to the backend. Off by default: they are control
    messages between the agent and this sidecar, and a backend may not accept logs."""
