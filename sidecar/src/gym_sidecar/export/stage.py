"""The pipeline's last stage: put batches into the export queue, or push back.

:class:`QueueStage` serializes each batch and enqueues it (a trace request from which
no stage removed anything as its pieces, ``TraceRequest.parts``, joined with its batch
by the sender: one copy instead of two); the client is acknowledged as soon as
``consume`` returns. When the bytes would pass the queue's
bound it raises :class:`Backpressure` (the receiver answers RESOURCE_EXHAUSTED with
RetryInfo, or HTTP 429 with Retry-After, and counts the items as refused) and counts
the limit hit. It never grows past the bound and never drops silently.

:class:`NoBackendStage` stands in when no backend is configured: it warns once and
counts everything as dropped with reason ``no_backend``.
"""

from __future__ import annotations

import logging

from gym_sidecar.core.stage import Backpressure, Batch, Signal, Stage
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.export import reasons
from gym_sidecar.export.queue import ExportQueue, Payload, payload_size
from gym_sidecar.export.sender import Sender
from gym_sidecar.selfmetrics import CounterChild, SelfMetrics

logger = logging.getLogger(__name__)

PIECE_MIN_BYTES = 4096
"""A trace request is queued as its pieces only when they average at least this many
bytes (see :meth:`QueueStage.consume`)."""


class QueueStage(Stage):
    """Enqueue serialized batches; a :class:`Sender` exports them in the background."""

    name = "queue"

    def __init__(
        self,
        queue: ExportQueue,
        sender: Sender,
        metrics: SelfMetrics,
        retry_after_s: float,
    ) -> None:
        super().__init__(None, metrics)
        self.queue = queue
        self.sender = sender
        self.retry_after_s = retry_after_s
        self._accepting = True
        metrics.queue_capacity_bytes.set(queue.capacity_bytes)
        # Read at each scrape: the queue's fill as it is then, without a gauge update
        # per request and per export.
        metrics.queue_bytes.set_function(lambda: queue.used_bytes)
        self._counters: dict[tuple[Signal, str], CounterChild] = {}

    def _count(self, signal: Signal, outcome: str, items: int) -> None:
        child = self._counters.get((signal, outcome))
        if child is None:  # created on first use, so /metrics shows only series in use
            child = self.metrics.stage_items.labels(self.name, signal.value, outcome)
            self._counters[(signal, outcome)] = child
        child.inc(items)

    def _refuse(self, batch: Batch, reason: str) -> Backpressure:
        # The receiver counts the refused items (refused{reason}) when it answers the
        # client; this stage counts the limit hit and its own view of the items.
        self.metrics.limit_hits.labels(f"export_queue.{reason}").inc()
        self._count(batch.signal, "refused", batch.items)
        return Backpressure(self.retry_after_s, reason)

    async def consume(self, batch: Batch) -> None:
        """Enqueue ``batch``; raise Backpressure if full or shutting down."""
        if batch.items <= 0:
            return  # every item was gated or rejected upstream: nothing to send
        self._count(batch.signal, "received", batch.items)
        if not self._accepting:
            raise self._refuse(batch, reasons.SHUTTING_DOWN)
        message = batch.message
        payload: Payload
        if isinstance(message, TraceRequest) and message.removed_nothing():
            # Kept as its pieces, the received bytes are copied once, when the batch is
            # joined. Only when nothing was removed, so what the pieces keep referenced
            # is (but for replaced resources) what the queue counts; and only when they
            # are large, so the pieces' own objects (~200 bytes each) stay small beside.
            parts = message.parts()
            size = payload_size(parts)
            payload = parts if size >= PIECE_MIN_BYTES * len(parts) else b"".join(parts)
        else:
            payload = message.SerializeToString()
            size = len(payload)
        if size > self.queue.capacity_bytes:
            # It can never fit: retrying would loop forever, so reject it outright (the
            # receiver reports it in partial_success and counts it as refused).
            self.metrics.limit_hits.labels(f"export_queue.{reasons.LARGER_THAN_QUEUE}").inc()
            self._count(batch.signal, "dropped", batch.items)
            batch.reject(
                batch.items,
                f"request of {size} bytes exceeds the export queue "
                f"({self.queue.capacity_bytes} bytes)",
            )
            return
        if not await self.queue.put(batch.signal, payload, batch.items):
            raise self._refuse(batch, reasons.QUEUE_FULL)
        self._count(batch.signal, "passed", batch.items)

    async def start(self) -> None:
        await self.sender.start()

    async def shutdown(self, deadline_s: float) -> None:
        """Refuse new data, send what is queued within ``deadline_s``, close the exporter."""
        self._accepting = False
        await self.sender.shutdown(deadline_s)


class NoBackendStage(Stage):
    """No backend configured: count every item as dropped (reason ``no_backend``)."""

    name = "queue"

    def __init__(self, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self._warned = False

    async def start(self) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "no backend configured (backend.url is not set): every span, metric point "
                "and log record received is dropped and counted as dropped{reason=%s}",
                reasons.NO_BACKEND,
            )

    async def consume(self, batch: Batch) -> None:
        if batch.items <= 0:
            return
        self.metrics.stage_items.labels(self.name, batch.signal.value, "dropped").inc(batch.items)
        self.metrics.dropped.labels(batch.signal.value, reasons.NO_BACKEND).inc(batch.items)
