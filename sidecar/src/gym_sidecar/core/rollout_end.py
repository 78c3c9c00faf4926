"""The end of a rollout, as the stage that recognises rollout spans reports it.

A rollout is live from its start event (``gym_sidecar.live``) until its rollout span
arrives: there is no end event (``gym_telemetry_semconv.live``). Which span is "the end
of a rollout, and whose" is decided in one place, where spans are already read per
producer: the derive stage's :class:`~gym_sidecar.metrics.spans.SpanDeriver` (today our
agent's outermost ``gym.rollout`` spans; a producer model that knows Gym's own telemetry
answers there too). It hands each accepted request's ends to a :data:`RolloutEndSink`,
which the assembly connects to the live tracker, so no stage walks the spans again.

This module is the contract between the two areas (neither imports the other for it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple


class RolloutEnd(NamedTuple):
    """One rollout span that ended (it was received and accepted downstream)."""

    resource: bytes
    """The span's serialized Resource as the pipeline holds it (received or enriched):
    whose rollout it was."""
    trace_id: bytes
    """The rollout span's trace id (16 bytes; empty when the span had none)."""
    span_id: bytes
    """The rollout span's span id (8 bytes; empty when the span had none): with the trace
    id, what the live events named the rollout by."""


RolloutEndSink = Callable[[Sequence[RolloutEnd]], None]
"""Receives the ends found in one accepted request, on the event loop. Must not raise
for any input (it is called after the request was accepted) and must not block."""
