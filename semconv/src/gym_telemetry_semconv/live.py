"""The live events: how an agent tells the sidecar what is running now (issue 41).

A rollout is otherwise visible only once its ``gym.rollout`` span ends. Each process with
the agent active also sends OTLP **log records** (``ExportLogsServiceRequest``) to the
endpoint it sends spans to, from a daemon thread, every :data:`DEFAULT_INTERVAL_S`
(agent env ``GYM_TELEMETRY_LIVE_INTERVAL_S``):

- resource: the process's resource (the same as its spans', ``service.instance.id``
  included); instrumentation scope :data:`SCOPE`;
- each record names its event in ``LogRecord.event_name`` (proto field 12) **and** in the
  attribute :data:`EVENT_NAME` (for receivers older than that field);
  ``time_unix_nano`` is when it happened; ``trace_id`` / ``span_id`` are the rollout
  span's where the event is about a rollout.

The events, and their attributes:

- :data:`EVENT_ROLLOUT_START`: a ``gym.rollout`` span started (and was recorded).
  ``nemo.gym.rollout.id`` when known at start; ``nemo.gym.rollout.nested=true`` for a
  rollout started inside another recorded rollout (the sidecar's rollout metrics count
  the outermost only). A rollout that starts and ends between two sends is not announced:
  its span says everything.
- :data:`EVENT_ROLLOUT_STEP`: the rollout's current outbound hop changed (the latest step
  per rollout per interval). :data:`ROLLOUT_STEP` (the hop span's name, e.g. ``POST
  /v1/responses``), :data:`ROLLOUT_STEP_TARGET` (the target Gym server's name, when the
  hop has one), ``nemo.gym.rollout.turns`` (model calls so far); ``time_unix_nano`` is
  the hop's start.
- :data:`EVENT_HEARTBEAT`: once per interval from every process with the agent active.
  :data:`ROLLOUTS_IN_FLIGHT`, :data:`LIVE_INTERVAL_S`, and, when the event-loop probe
  runs, the loop's lag since the previous heartbeat pre-aggregated over
  :data:`EVENT_LOOP_LAG_BOUNDS_MS` (:data:`LAG_COUNT`, :data:`LAG_SUM`, :data:`LAG_MAX`,
  :data:`LAG_BUCKET_COUNTS`: ``len(bounds) + 1`` counts, bucket ``i`` holding the samples
  in ``(bounds[i-1], bounds[i]]``, as an OTLP explicit-bounds histogram).
- :data:`EVENT_STOP`: sent once at a clean shutdown (the flush): the sidecar turns the
  process's in-flight rollouts into lost at once. :data:`ROLLOUTS_IN_FLIGHT`.

The end of a rollout is its ``gym.rollout`` span: there is no end event. Spans and events
travel separately, so a receiver may see a start or step after the span of the rollout it
names; it keeps nothing in flight for a rollout whose span it has already seen.
"""

from __future__ import annotations

from typing import Final

SCOPE: Final = "gym_telemetry.live"
"""Instrumentation scope of every live event."""
EVENT_NAME: Final = "event.name"
"""Attribute carrying the event's name (also in ``LogRecord.event_name``)."""

EVENT_ROLLOUT_START: Final = "gym.rollout.start"
EVENT_ROLLOUT_STEP: Final = "gym.rollout.step"
EVENT_HEARTBEAT: Final = "gym.agent.heartbeat"
EVENT_STOP: Final = "gym.agent.stop"
EVENTS: Final[tuple[str, ...]] = (
    EVENT_ROLLOUT_START,
    EVENT_ROLLOUT_STEP,
    EVENT_HEARTBEAT,
    EVENT_STOP,
)

ROLLOUT_STEP: Final = "nemo.gym.rollout.step"
"""String: the name of the rollout's current outbound hop span (``POST /v1/responses``)."""
ROLLOUT_STEP_TARGET: Final = "nemo.gym.rollout.step.target"
"""String: the Gym server that hop is addressed to."""
ROLLOUTS_IN_FLIGHT: Final = "nemo.gym.rollouts.in_flight"
"""Int: the process's rollouts started and not ended."""
LIVE_INTERVAL_S: Final = "nemo.gym.live.interval_s"
"""Double: the sender's interval, so a receiver knows when a heartbeat is overdue."""

LAG_COUNT: Final = "nemo.gym.event_loop.lag_ms.count"
"""Int: event-loop lag samples since the previous heartbeat."""
LAG_SUM: Final = "nemo.gym.event_loop.lag_ms.sum"
"""Double: their sum, ms."""
LAG_MAX: Final = "nemo.gym.event_loop.lag_ms.max"
"""Double: the largest, ms."""
LAG_BUCKET_COUNTS: Final = "nemo.gym.event_loop.lag_ms.bucket_counts"
"""Int array: samples per bucket of :data:`EVENT_LOOP_LAG_BOUNDS_MS` (one more than bounds)."""

EVENT_LOOP_LAG_BOUNDS_MS: Final[tuple[float, ...]] = (
    1.0,
    2.0,
    5.0,
    10.0,
    25.0,
    50.0,
    100.0,
    250.0,
    500.0,
    1000.0,
    2500.0,
    5000.0,
    10000.0,
)
"""Upper bounds (inclusive), ms, of the event-loop lag histogram: agent and sidecar both use
these, so the heartbeat's counts merge into ``gym.server.event_loop.lag_ms`` unchanged."""

DEFAULT_INTERVAL_S: Final = 2.0
"""Default interval of the live events (agent env ``GYM_TELEMETRY_LIVE_INTERVAL_S``)."""
DEFAULT_LAG_PROBE_INTERVAL_S: Final = 0.5
"""Default period of the event-loop lag probe (agent env ``GYM_TELEMETRY_LAG_PROBE_INTERVAL_S``)."""
