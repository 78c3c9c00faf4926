"""The live stage: consumes the agents' live events and runs the tracker's clock.

Placement: receive -> enrich -> **live** -> derive -> gate -> queue -> export (after
enrichment, so a sender is identified by its enriched resource, as its spans are).

- Logs: the ScopeLogs of scope ``gym_telemetry.live`` are read into the tracker and, unless
  ``rollouts.forward_events``, removed (counted as ``dropped`` by this stage and in
  ``gym_sidecar_dropped_items{signal="logs",reason="live_events"}``); a request left
  empty ends here, answered OK. Other log records pass unchanged. Events are applied
  once per request: at once when nothing of the request goes further, else once the
  stages behind accepted it (a request refused for backpressure is retried by its
  client and must count once: the heartbeats' lag is added up).
- Every request (traces, metrics, logs) is a sign of life of the process that sent it
  (:meth:`LiveTracker.seen`): a dict lookup per resource, only while instances are known.
- A timer runs :meth:`LiveTracker.sweep` every ``rollouts.check_interval_s``.

Without a tracker (``rollouts.enabled`` false, or no derive stage to report rollout
ends), the stage only consumes (or forwards) the live events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from gym_telemetry_semconv import live
from gym_telemetry_semconv.ratelimit import rate_limit
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.core.stage import Batch, ProcessorStage, Signal, Stage
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.live.config import RolloutsConfig
from gym_sidecar.live.events import LiveEvent, read_event, sender_of
from gym_sidecar.live.tracker import LiveTracker
from gym_sidecar.metrics.stage import DeriveStage
from gym_sidecar.selfmetrics import SelfMetrics

_log = logging.getLogger(__name__)
_failure_log = rate_limit(logging.getLogger(__name__ + ".failures"), 60.0)

DROP_REASON: Final = "live_events"
Found = list[tuple[Resource, list[LiveEvent]]]


class LiveStage(ProcessorStage["Found | None"]):
    """See the module docstring. ``start``/``shutdown`` run the sweep timer."""

    name = "live"

    def __init__(
        self,
        cfg: RolloutsConfig,
        next_stage: Stage | None,
        metrics: SelfMetrics,
        tracker: LiveTracker | None,
    ) -> None:
        # Without a tracker only the live events are this stage's business.
        self.signals = frozenset(Signal) if tracker is not None else frozenset({Signal.LOGS})
        super().__init__(next_stage, metrics)
        self.cfg = cfg
        self.tracker = tracker
        self._consumed = metrics.dropped.labels(Signal.LOGS.value, DROP_REASON)
        self._timer: asyncio.Task[None] | None = None

    def process(self, batch: Batch) -> Found | None:
        message = batch.message
        tracker = self.tracker
        if isinstance(message, TraceRequest):
            if tracker is not None and tracker.instances:
                for block in message.blocks:
                    tracker.seen(block.current_resource)
            return None
        if isinstance(message, ExportMetricsServiceRequest):
            if tracker is not None and tracker.instances:
                for rm in message.resource_metrics:
                    tracker.seen_sender(sender_of(rm.resource))
            return None
        assert isinstance(message, ExportLogsServiceRequest)
        found = self._take_events(batch, message)
        if not found or tracker is None:
            return None
        if batch.items == 0 and not message.resource_logs:
            self._apply(found)  # the request ends here: nothing behind can refuse it
            return None
        return found

    def _take_events(self, batch: Batch, message: ExportLogsServiceRequest) -> Found:
        found: Found = []
        consumed = 0
        forward = self.cfg.forward_events
        tracker = self.tracker
        for i in reversed(range(len(message.resource_logs))):
            rl = message.resource_logs[i]
            events: list[LiveEvent] = []
            others = removed = False
            for j in reversed(range(len(rl.scope_logs))):
                sl = rl.scope_logs[j]
                if sl.scope.name != live.SCOPE:
                    others = True
                    continue
                events[:0] = [read_event(record) for record in sl.log_records]
                if not forward:
                    consumed += len(sl.log_records)
                    del rl.scope_logs[j]
                    removed = True
            if events:  # a copy: the block may leave the request below
                found.insert(0, (_copy(rl.resource), events))
            elif others and tracker is not None and tracker.instances:
                tracker.seen_sender(sender_of(rl.resource))
            if removed and not rl.scope_logs:
                del message.resource_logs[i]
        if consumed:
            batch.items -= consumed
            self._consumed.inc(consumed)
        return found

    def nothing_left(self, batch: Batch) -> bool:
        message = batch.message
        return isinstance(message, ExportLogsServiceRequest) and not message.resource_logs

    def accepted(self, batch: Batch, token: Found | None) -> None:
        if token:
            self._apply(token)

    def _apply(self, found: Found) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        for resource, events in found:
            tracker.receive(resource, events)

    async def start(self) -> None:
        if self.tracker is not None and self._timer is None:
            self._timer = asyncio.create_task(self._run(), name="rollouts-live-sweep")

    async def _run(self) -> None:
        assert self.tracker is not None
        while True:
            await asyncio.sleep(self.cfg.check_interval_s)
            try:
                self.tracker.sweep()
            except Exception as exc:  # boundary: a bug in one sweep must not stop the clock
                _failure_log.warning("rollouts live: sweep failed: %r", exc)

    async def shutdown(self, deadline_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None


def _copy(resource: Resource) -> Resource:
    out = Resource()
    out.CopyFrom(resource)
    return out


def build_live_stage(
    cfg: RolloutsConfig, next_stage: Stage, metrics: SelfMetrics
) -> tuple[LiveStage, LiveTracker | None]:
    """The live stage in front of ``next_stage``, and its tracker (None when
    ``cfg.enabled`` is false, or ``next_stage`` is not the derive stage, which reports
    where rollouts end: the derived metrics are off)."""
    tracker: LiveTracker | None = None
    if cfg.enabled:
        if isinstance(next_stage, DeriveStage):
            tracker = LiveTracker(cfg, next_stage.store, metrics)
            next_stage.connect_rollout_ends(tracker.rollouts_ended)
        else:
            _log.warning(
                "rollouts live is off: it needs the derived metrics (metrics.enabled), "
                "which tell it where rollouts end; live events are %s",
                "forwarded" if cfg.forward_events else "consumed",
            )
    return LiveStage(cfg, next_stage, metrics, tracker), tracker
