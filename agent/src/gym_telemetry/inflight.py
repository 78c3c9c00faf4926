"""The rollouts in flight in this process: what the live events announce (issue 41).

The request path does only this:

- a recorded ``gym.rollout`` span starts: :func:`begin` makes its :class:`InFlight`
  record and inserts it into :data:`IN_FLIGHT` (one dict store; keyed by the span's trace
  id, since one rollout is one trace);
- a hop starts inside a rollout: :meth:`InFlight.hop` writes the step fields and counts a
  turn when the hop is a model call;
- the span ends: :func:`end` removes the record (one dict delete).

Everything else (announcing starts and steps, counting what is in flight) is done by the
live reporter's thread (``gym_telemetry._live``), which reads :func:`snapshot`. No lock:
each dict operation and each field store is atomic under the GIL. The step fields are
written with ``step_ns`` last and the reporter reads ``step_ns`` first, so a step it
sends is never older than the ``step_ns`` it records as sent; a hop that starts while it
reads is sent at the next interval.

A rollout started while another one of the same trace is in flight here (a ``/run``
relayed back into this process) shadows it until it ends; both are in flight.
:func:`for_trace` gives the latest of a trace: the SERVER layer makes it current for a
request relayed from inside the rollout (an agent calling its own ``/v1/responses``), so
the model calls made there count as the rollout's turns.

A rollout that relays its ``/run`` to another agent (a hop to a ``/run`` route) is marked
``relayed``: the rollout span it reaches carries the turns and tokens, its own does not
(one span per rollout carries them). Standard library only.
"""

from __future__ import annotations

import time
from typing import Any, Final

_time_ns = time.time_ns


class InFlight:
    """One in-flight rollout. ``span`` is its ``gym.rollout`` span (the reporter reads its
    ids and start time); the step fields describe its latest outbound hop."""

    __slots__ = (
        "announced",
        "ended",
        "nested",
        "relayed",
        "rollout_id",
        "sent_step_ns",
        "shadowed",
        "span",
        "step",
        "step_ns",
        "target",
        "trace_id",
        "turns",
    )

    def __init__(self, span: Any, trace_id: int, rollout_id: str | None, nested: bool) -> None:
        self.span = span
        self.trace_id = trace_id
        self.rollout_id = rollout_id
        self.nested = nested
        self.step: str | None = None
        self.target: str | None = None
        self.step_ns = 0
        self.turns = 0
        self.relayed = False
        self.ended = False
        #: The reporter's: whether the start was sent, and the ``step_ns`` last sent.
        self.announced = False
        self.sent_step_ns = 0
        #: The record of the same trace this one shadows in ``IN_FLIGHT`` (or None).
        self.shadowed: InFlight | None = None

    def hop(self, step: str, target: str | None, model_call: bool, relay: bool) -> None:
        """A hop named ``step`` to Gym server ``target`` starts now (request path)."""
        if model_call:
            self.turns += 1
        if relay:
            self.relayed = True
        self.step = step
        self.target = target
        self.step_ns = _time_ns()  # last: the reporter reads it first


#: Trace id -> the latest in-flight rollout of that trace in this process.
IN_FLIGHT: Final[dict[int, InFlight]] = {}


def begin(span: Any, rollout_id: str | None, nested: bool) -> InFlight:
    """Register the rollout whose (recording) span is ``span``; returns its record."""
    trace_id: int = span.get_span_context().trace_id
    record = InFlight(span, trace_id, rollout_id, nested)
    shadowed = IN_FLIGHT.get(trace_id)
    if shadowed is not None:
        record.shadowed = shadowed
    IN_FLIGHT[trace_id] = record
    return record


def end(record: InFlight) -> None:
    """The rollout's span ended: it is no longer in flight."""
    record.ended = True
    trace_id = record.trace_id
    if IN_FLIGHT.get(trace_id) is not record:
        return  # shadowed, and it ended first: the reporter skips ended records
    shadowed = record.shadowed
    while shadowed is not None and shadowed.ended:
        shadowed = shadowed.shadowed
    if shadowed is None:
        IN_FLIGHT.pop(trace_id, None)
    else:
        IN_FLIGHT[trace_id] = shadowed


def for_trace(trace_id: int) -> InFlight | None:
    """The latest in-flight rollout of trace ``trace_id`` here, or None."""
    return IN_FLIGHT.get(trace_id)


def snapshot() -> list[InFlight]:
    """Every rollout in flight now (shadowed ones included), in the order they started
    per trace; for the reporter's thread."""
    out: list[InFlight] = []
    for latest in tuple(IN_FLIGHT.values()):
        chain: list[InFlight] = []
        record: InFlight | None = latest
        while record is not None:
            if not record.ended:
                chain.append(record)
            record = record.shadowed
        out.extend(reversed(chain))
    return out


def in_flight() -> int:
    """How many rollouts are in flight (the heartbeat's count)."""
    return len(snapshot())
