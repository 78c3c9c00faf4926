"""The sender: workers that take batches from the queue, export them and retry.

``max_in_flight`` workers each loop: lease a batch, export it, retry retryable
failures in place with jittered exponential backoff (or the server's hint), then ack.
A full set of workers stuck retrying stops draining the queue, so the queue fills and
the queue stage pushes back on clients: the bound in bytes holds however long the
backend is down. Permanent errors are dropped and counted at once, never retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gym_telemetry_semconv.ratelimit import rate_limit

from gym_sidecar.core.exporter import Exporter, ExportResult, Outcome
from gym_sidecar.core.stage import Signal
from gym_sidecar.export import reasons
from gym_sidecar.export.backoff import Backoff
from gym_sidecar.export.config import QueueConfig
from gym_sidecar.export.queue import ExportQueue, Lease
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

#: Permanent errors and retries repeat per batch while the backend is down or refuses:
#: their own logger, so the rate limit (one line per message per 10 s) spares the others.
_failure_log = rate_limit(logging.getLogger(__name__ + ".failures"), 10.0)


class Sender:
    """Exports what the queue holds. Lifecycle: ``start`` once, ``shutdown`` once or more."""

    def __init__(
        self,
        queue: ExportQueue,
        exporter: Exporter,
        config: QueueConfig,
        metrics: SelfMetrics,
        backoff: Backoff | None = None,
    ) -> None:
        self.queue = queue
        self.exporter = exporter
        self.config = config
        self.metrics = metrics
        self.backoff = backoff or Backoff(config)
        self._workers: list[asyncio.Task[None]] = []
        self._abort = asyncio.Event()
        self._closed = False

    async def start(self) -> None:
        if self._workers or self._closed:
            return
        self._workers = [
            asyncio.create_task(self._worker(), name=f"export-sender-{i}")
            for i in range(self.config.max_in_flight)
        ]

    async def _worker(self) -> None:
        while not self._abort.is_set():
            lease = await self.queue.get(self.config.batch_max_bytes, self.config.batch_timeout_s)
            if lease is None:
                return
            if await self._send(lease):
                await self.queue.ack(lease)

    async def _sleep(self, delay_s: float) -> bool:
        """Sleep unless the shutdown deadline passes first; False if it did."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._abort.wait(), delay_s)
        return not self._abort.is_set()

    async def _export_once(
        self, signal: Signal, parts: list[bytes | memoryview], items: int
    ) -> ExportResult:
        self.metrics.export_attempts.labels(signal.value).inc()
        try:
            return await self.exporter.export_parts(signal, parts, items)
        except Exception as err:
            # Boundary: a bug in an exporter must cost this batch, not the sender.
            logger.exception("exporter %s raised", self.exporter.name)
            return ExportResult.permanent(f"exporter raised {type(err).__name__}")

    async def _send(self, lease: Lease) -> bool:
        """Export one batch until it is settled; False if shutdown cut it short."""
        # The batch's pieces, never joined here (exporters send or compress them as they
        # are); the same list on every attempt.
        signal, parts, items = lease.signal, lease.parts(), lease.items
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            result = await self._export_once(signal, parts, items)
            if result.outcome is Outcome.SUCCESS:
                self.metrics.exported.labels(signal.value).inc(items - result.rejected_items)
                if result.rejected_items:
                    self._drop(signal, result.rejected_items, reasons.BACKEND_REJECTED)
                    _failure_log.warning(
                        "backend rejected %d of %d %s items: %s",
                        result.rejected_items,
                        items,
                        signal.value,
                        result.message,
                    )
                return True
            kind = result.outcome.value
            self.metrics.export_errors.labels(signal.value, kind).inc()
            if result.outcome is Outcome.PERMANENT:
                self._drop(signal, items, reasons.PERMANENT_ERROR)
                _failure_log.warning(
                    "dropped %d %s items, permanent export error: %s",
                    items,
                    signal.value,
                    result.message,
                )
                return True
            delay = result.retry_after_s
            if delay is None:
                delay = self.backoff.delay_s(attempt)
            limit = self.config.retry_max_elapsed_s
            if limit is not None and time.monotonic() - started + delay > limit:
                self._drop(signal, items, reasons.RETRY_EXHAUSTED)
                logger.warning(
                    "dropped %d %s items after %d attempts over %.1fs: %s",
                    items,
                    signal.value,
                    attempt,
                    time.monotonic() - started,
                    result.message,
                )
                return True
            _failure_log.warning(
                "export of %d %s items failed (attempt %d), retrying in %.2fs: %s",
                items,
                signal.value,
                attempt,
                delay,
                result.message,
            )
            if not await self._sleep(delay):
                return False

    def _drop(self, signal: Signal, items: int, reason: str) -> None:
        self.metrics.dropped.labels(signal.value, reason).inc(items)

    async def shutdown(self, deadline_s: float) -> dict[Signal, int]:
        """Send what is queued until empty or ``deadline_s`` passes, then stop.

        Returns the items per signal that could not be sent (counted as dropped with
        reason ``shutdown``, and logged). Closes the exporter. Safe to call twice.
        """
        if self._closed:
            return {}
        self._closed = True
        self.queue.drain()
        if self._workers:
            _, pending = await asyncio.wait(self._workers, timeout=max(0.0, deadline_s))
            if pending:
                self._abort.set()
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        lost = dict(await self.queue.close())
        for signal, n in lost.items():
            self._drop(signal, n, reasons.SHUTDOWN)
        if lost:
            logger.warning(
                "shutdown deadline of %.1fs passed: %s could not be sent",
                deadline_s,
                ", ".join(f"{n} {s.value} items" for s, n in lost.items()),
            )
        elif self.queue.used_bytes:  # a persistent queue keeps the rest for replay
            logger.info("export queue closed, %d bytes kept for replay", self.queue.used_bytes)
        else:
            logger.info("export queue drained")
        await self.exporter.close()
        return lost
