"""The live reporter: a daemon thread that sends the live events every interval (issue 41).

Each interval (``GYM_TELEMETRY_LIVE_INTERVAL_S``, default 2 s) the thread builds one
``ExportLogsServiceRequest`` (``_live.encoding``) from what the request path left in
``gym_telemetry.inflight`` and sends it (``_lean.log_transport``):

- ``gym.rollout.start`` for each rollout in flight that was not announced yet;
- ``gym.rollout.step`` for each rollout whose step changed since the last one sent (the
  latest step only: the steps in between are coalesced);
- one ``gym.agent.heartbeat``: rollouts in flight, the interval, and the event-loop lag
  since the previous heartbeat when the lag probe runs (``_live.lag``).

Starts and steps derive from state, so a request that fails is not retried: the records
stay unannounced (or their step unsent) and the next interval sends the state as it is
then. The heartbeat's lag samples of a failed request are lost. Failures are counted
(``stats()``) and logged at most once a minute. At most ``MAX_EVENTS_PER_REQUEST`` events
go in one request; the rest wait for the next interval.

``stop(timeout_s)`` (at a clean shutdown, before the span exporter closes) ends the thread
and sends, from the caller, the state once more and ``gym.agent.stop``, within
``timeout_s``. The thread never touches a request: it only reads the records' fields.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import live
from gym_telemetry_semconv.ratelimit import rate_limit

from gym_telemetry import inflight
from gym_telemetry._lean.log_transport import Sender
from gym_telemetry._live import lag
from gym_telemetry._live.encoding import Event, encode_request

_log = logging.getLogger(__name__)
#: Failures are logged here, rate-limited (one line per minute, then the count).
_failure_log = logging.getLogger("gym_telemetry.live.failures")
rate_limit(_failure_log)

#: Most events in one request; the rest go at the next interval.
MAX_EVENTS_PER_REQUEST: Final = 4096
_time_ns = time.time_ns
_SAMPLED: Final = 1


class Stats:
    """The reporter's counters (read from any thread; written by the sender only)."""

    __slots__ = ("encode_failures", "events_sent", "requests_failed", "requests_sent")

    def __init__(self) -> None:
        self.requests_sent = 0
        self.events_sent = 0
        self.requests_failed = 0
        self.encode_failures = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


def _ids(span: Any) -> tuple[int, int, int]:
    context = span.get_span_context()
    return context.trace_id, context.span_id, int(context.trace_flags) & _SAMPLED


def _start_event(record: inflight.InFlight) -> Event:
    trace_id, span_id, flags = _ids(record.span)
    attributes: dict[str, Any] = {}
    if record.rollout_id is not None:
        attributes[semconv.ROLLOUT_ID] = record.rollout_id
    if record.nested:
        attributes[semconv.ROLLOUT_NESTED] = True
    start_ns = getattr(record.span, "start_time", None)
    return Event(
        live.EVENT_ROLLOUT_START,
        start_ns if type(start_ns) is int else _time_ns(),
        attributes,
        trace_id,
        span_id,
        flags,
    )


def _step_event(record: inflight.InFlight, step_ns: int) -> Event | None:
    step, target, turns = record.step, record.target, record.turns
    if step is None:
        return None
    trace_id, span_id, flags = _ids(record.span)
    attributes: dict[str, Any] = {live.ROLLOUT_STEP: step}
    if target is not None:
        attributes[live.ROLLOUT_STEP_TARGET] = target
    attributes[semconv.ROLLOUT_TURNS] = turns
    if record.rollout_id is not None:
        attributes[semconv.ROLLOUT_ID] = record.rollout_id
    return Event(live.EVENT_ROLLOUT_STEP, step_ns, attributes, trace_id, span_id, flags)


class LiveReporter:
    """The reporter (module doc). ``start`` once; ``stop`` once (later calls do nothing)."""

    def __init__(
        self,
        resource: Any,
        send: Sender,
        interval_s: float,
        probe: lag.LagProbe | None = None,
    ) -> None:
        self.resource = resource
        self.send = send
        self.interval_s = interval_s
        self.probe = probe
        self.stats = Stats()
        self._stop = threading.Event()
        self._send_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="gym-telemetry-live", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.report(timeout_s=self.interval_s)
            except Exception as exc:  # the thread must survive anything
                _failure_log.warning("gym_telemetry: live events failed: %r", exc)

    def _pending(
        self, records: list[inflight.InFlight]
    ) -> tuple[list[Event], list[tuple[inflight.InFlight, int]]]:
        """Events for the rollouts' state, and what to mark sent once delivered."""
        events: list[Event] = []
        marks: list[tuple[inflight.InFlight, int]] = []
        for record in records:
            if len(events) >= MAX_EVENTS_PER_REQUEST - 2:
                break
            step_ns = record.step_ns  # first: the step fields were written before it
            start = None if record.announced else _start_event(record)
            step = None
            if step_ns and step_ns != record.sent_step_ns:
                step = _step_event(record, step_ns)
            if start is None and step is None:
                continue
            if start is not None:
                events.append(start)
            if step is not None:
                events.append(step)
            marks.append((record, step_ns if step is not None else record.sent_step_ns))
        return events, marks

    def _heartbeat(self, now_ns: int, in_flight: int, final: bool) -> list[Event]:
        attributes: dict[str, Any] = {
            live.ROLLOUTS_IN_FLIGHT: in_flight,
            live.LIVE_INTERVAL_S: float(self.interval_s),
        }
        probe = self.probe
        if probe is not None and probe.running:
            attributes.update(lag.attributes(probe.take()))
        events = [Event(live.EVENT_HEARTBEAT, now_ns, attributes)]
        if final:
            stop_attributes = {live.ROLLOUTS_IN_FLIGHT: attributes[live.ROLLOUTS_IN_FLIGHT]}
            events.append(Event(live.EVENT_STOP, now_ns, stop_attributes))
        return events

    def report(self, timeout_s: float, final: bool = False) -> bool:
        """Build and send one request (module doc); True when it was delivered. Waits at
        most ``timeout_s`` for a request the thread is sending, then as long for its own."""
        if not self._send_lock.acquire(timeout=max(0.0, timeout_s)):
            return False
        try:
            now_ns = _time_ns()
            records = inflight.snapshot()
            events, marks = self._pending(records)
            events += self._heartbeat(now_ns, len(records), final)
            stats = self.stats
            try:
                data = encode_request(self.resource, events, _time_ns())
            except Exception as exc:  # an attribute OTLP cannot carry: dropped, counted
                stats.encode_failures += 1
                _failure_log.warning("gym_telemetry: live events not encoded: %r", exc)
                return False
            if not self.send(data, timeout_s):
                stats.requests_failed += 1
                _failure_log.warning(
                    "gym_telemetry: live events not delivered (%d requests so far)",
                    stats.requests_failed,
                )
                return False
            stats.requests_sent += 1
            stats.events_sent += len(events)
            for record, step_ns in marks:
                record.announced = True
                record.sent_step_ns = step_ns
            return True
        finally:
            self._send_lock.release()

    def stop(self, timeout_s: float) -> bool:
        """End the thread and send the final state with ``gym.agent.stop`` (module doc),
        within ``timeout_s``. True when the stop event was delivered."""
        if self._stopped:
            return True
        self._stopped = True
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, (deadline - time.monotonic()) / 2))
        if self.probe is not None:
            self.probe.stop()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        return self.report(timeout_s=remaining, final=True)


__all__ = ["MAX_EVENTS_PER_REQUEST", "LiveReporter", "Stats"]
