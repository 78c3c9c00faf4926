"""The derive stage: rollout, verify and env-step spans become metrics, every interval.

Placement: receive -> enrich -> **derive** -> gate -> queue -> export. It runs before
the gate so a span group in ``metrics`` mode still yields its metrics (the gate drops
its spans afterwards), and after enrichment so derived series carry the enriched
resource. Spans of a group that is ``off`` for their service (a stale agent) are not
derived: it asks the gate's policy (``enabled_groups``).

``consume`` (:class:`ProcessorStage`'s, which counts received / passed): for trace
batches, ``process`` reads the ``gym.rollout`` / ``gym.verify`` / ``gym.env.step`` spans
of both producers (see :mod:`gym_sidecar.metrics.spans`; the stage's ``trace_scan``
tells the receivers' scanner to extract them), the batch goes on unchanged, and
``accepted`` records the points once ``next`` accepted it. Metric batches arriving from
elsewhere have other producers' copies of the derived names renamed or dropped
(``metrics.owned``, :mod:`gym_sidecar.metrics.ownership`): one owner per name.
Backpressure (or any error)
from downstream propagates to the receiver and nothing is recorded, so the client's
retry of the same request is counted once. Other signals pass straight through.

Export: every ``interval_s`` the stage hands one
``Batch(Signal.METRICS, ExportMetricsServiceRequest)`` to ``next``. If ``next`` pushes
back (:class:`Backpressure`) or fails, the points stay and the next interval carries
them (counted in ``gym_sidecar_derived_exports_total{outcome}``).

Rollout ends: :meth:`DeriveStage.connect_rollout_ends` attaches a sink (the live
tracker's); from then on each accepted request's outermost rollout spans are handed to
it (:mod:`gym_sidecar.core.rollout_end`), read in the same pass as the metrics.

Shutdown: ``shutdown(deadline_s)`` stops the timer and flushes the last partial interval
into ``next`` before returning. The runtime shuts stages down in pipeline order, so this
happens before the queue drains; if the queue pushes back, the flush is retried for up
to half of the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.ratelimit import rate_limit
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gym_sidecar.core.rollout_end import RolloutEndSink
from gym_sidecar.core.stage import Backpressure, Batch, PassThrough, ProcessorStage, Signal, Stage
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.derived import DerivedMetrics
from gym_sidecar.metrics.fields import SCAN_SPEC
from gym_sidecar.metrics.live_series import LAG_BOUNDS_MS
from gym_sidecar.metrics.otlp_request import build_request
from gym_sidecar.metrics.ownership import MetricOwnership
from gym_sidecar.metrics.prometheus import DerivedCollector
from gym_sidecar.metrics.spans import EnabledGroups, Pending, SpanDeriver
from gym_sidecar.selfmetrics import SelfMetrics

_log = logging.getLogger(__name__)
#: Export failures repeat every interval while the pipeline pushes back or is broken:
#: their own logger, limited to one line per kind of failure per minute (each is counted
#: in ``store.exports``, shown as ``gym_sidecar_derived_exports_total``).
_failure_log = rate_limit(logging.getLogger(__name__ + ".failures"), 60.0)

SHUTDOWN_RETRY_S: Final = 0.05
"""Pause between flush attempts while the queue pushes back during shutdown."""
SHUTDOWN_SHARE: Final = 0.5
"""Share of the shutdown deadline the final flush may spend retrying."""


class DeriveStage(ProcessorStage["Pending | None"]):
    """Derives ``gym.rollout.*`` / ``gym.verify.*`` metrics; see the module docstring.

    The constructor registers a Prometheus collector on ``metrics.registry``: build one
    derive stage per :class:`SelfMetrics`. ``consume`` and ``flush`` run on the event
    loop; the collector may be read from any thread.
    """

    name = "derive"
    trace_scan = SCAN_SPEC

    def __init__(
        self,
        cfg: MetricsConfig,
        next_stage: Stage | None,
        metrics: SelfMetrics,
        enabled_groups: EnabledGroups | None = None,
    ) -> None:
        super().__init__(next_stage, metrics)
        self.cfg = cfg
        self.store = DerivedMetrics(cfg, metrics)
        self.collector = DerivedCollector(self.store)
        metrics.registry.register(self.collector)
        self._deriver = SpanDeriver(self.store, enabled_groups)
        self._ownership = MetricOwnership(cfg.owned, metrics)
        self._bounds = {
            semconv.METRIC_ROLLOUT_DURATION: self.store.rollout.bounds,
            semconv.METRIC_VERIFY_DURATION: self.store.verify.bounds,
            semconv.METRIC_ENV_STEP_DURATION: self.store.env_step.bounds,
            **{t.metric_names[0]: t.bounds for t in self.store.rl.histograms},
            semconv.METRIC_EVENT_LOOP_LAG: LAG_BOUNDS_MS,
        }
        self._enabled_groups = enabled_groups
        self._rollout_ends: RolloutEndSink | None = None
        self._timer: asyncio.Task[None] | None = None
        self._flush_lock = asyncio.Lock()
        self._stopped = False

    def process(self, batch: Batch) -> Pending | None:
        # Read before passing on (the gate removes metrics-mode blocks), record in
        # ``accepted``: a batch refused downstream is retried by its client and must
        # count once.
        message = batch.message
        if isinstance(message, TraceRequest):
            return self._deriver.extract(message)
        if isinstance(message, ExportMetricsServiceRequest):
            batch.items -= self._ownership.apply(message)
        return None

    def accepted(self, batch: Batch, token: Pending | None) -> None:
        if token is not None:
            self._deriver.record(token)
            if token.ended and self._rollout_ends is not None:
                self._rollout_ends(token.ended)

    def connect_rollout_ends(self, sink: RolloutEndSink) -> None:
        """Hand the rollout ends of every request accepted from now on to ``sink`` (see
        the module docstring). Call before traffic, on the event loop."""
        self._rollout_ends = sink
        self._deriver = SpanDeriver(self.store, self._enabled_groups, rollout_ends=True)

    async def start(self) -> None:
        if self._timer is None and not self._stopped:
            self._timer = asyncio.create_task(self._run(), name="derive-metrics-timer")

    async def _run(self) -> None:
        interval = self.cfg.interval_s
        next_at = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at += interval
            if next_at < time.monotonic():  # fell behind (long pause): skip, don't burst
                next_at = time.monotonic() + interval
            try:
                await self.flush()
            except Exception as exc:  # boundary: a bug in one export must not stop the timer
                self.store.exports["error"] += 1
                self._log_failure("crashed (%r); retrying next interval", exc)

    async def flush(self) -> bool:
        """Export what is due now. True if ``next`` accepted it (or there was nothing)."""
        async with self._flush_lock:
            store = self.store
            snap = store.collect()
            if snap.points == 0:
                store.commit(snap)
                return True
            request = build_request(snap, self._bounds)
            batch = Batch(Signal.METRICS, request, items=snap.points)
            try:
                if self.next is not None:
                    await self.next.consume(batch)
            except Backpressure as exc:
                store.exports["backpressure"] += 1
                self._log_failure("pushed back (%s); the points stay for the next interval", exc)
                return False
            except Exception as exc:  # boundary: a downstream bug must not kill the timer
                store.exports["error"] += 1
                self._log_failure("failed (%r); the points stay for the next interval", exc)
                return False
            store.commit(snap)
            store.exports["sent"] += 1
            return True

    def _log_failure(self, fmt: str, exc: BaseException) -> None:
        _failure_log.warning("derived metrics export " + fmt, exc)

    async def shutdown(self, deadline_s: float) -> None:
        """Stop the timer, then flush the last partial interval into ``next``.

        While ``next`` pushes back, the flush is retried for at most half of
        ``deadline_s``, so the queue behind keeps the rest of the deadline to drain. A
        downstream error other than backpressure is not retried.
        """
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
            self._timer = None
        deadline = time.monotonic() + deadline_s * SHUTDOWN_SHARE
        while True:
            refused_before = self.store.exports["backpressure"]
            remaining = deadline - time.monotonic()
            try:
                if await asyncio.wait_for(self.flush(), timeout=max(remaining, 0.001)):
                    return
            except TimeoutError:
                break
            pushed_back = self.store.exports["backpressure"] > refused_before
            if not pushed_back or time.monotonic() + SHUTDOWN_RETRY_S >= deadline:
                break
            await asyncio.sleep(SHUTDOWN_RETRY_S)
        _log.warning(
            "derived metrics: the last interval was not flushed (see earlier warnings); "
            "%d points not exported",
            self.store.collect().points,
        )


def build_derive_stage(
    cfg: MetricsConfig,
    next_stage: Stage,
    metrics: SelfMetrics,
    enabled_groups: EnabledGroups | None = None,
) -> Stage:
    """The derive stage for ``cfg`` (a pass-through when ``cfg.enabled`` is False).

    ``enabled_groups`` (the gate's :meth:`GateStage.enabled_groups`) keeps blocks of
    span groups that are ``off`` for their service out of the metrics.
    """
    if not cfg.enabled:
        return PassThrough("derive", next_stage, metrics)
    return DeriveStage(cfg, next_stage, metrics, enabled_groups)
