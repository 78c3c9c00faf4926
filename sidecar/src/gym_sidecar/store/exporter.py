"""The local store behind the :class:`~gym_sidecar.export.base.Exporter` interface.

``export`` resolves once the request is committed to SQLite, so the export queue holds
the data until it is stored, and a store that falls behind pushes back on clients
through the same bounded queue as a slow backend. Logs are acknowledged and not stored
(counted as ``gym_sidecar_store_failed_requests{reason="unsupported_signal"}``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from gym_sidecar.export.base import Exporter, ExportResult
from gym_sidecar.pipeline.stage import Signal
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.writer import StoreMetrics, StoreWriter

logger = logging.getLogger(__name__)


class LocalStoreExporter(Exporter):
    """Writes traces and ``gym.*`` metric points into the local store.

    Lifecycle: construct (opens the file and starts the writer thread, raising OSError or
    sqlite3.Error when the store cannot be opened), ``export`` concurrently, ``close``.
    """

    name = "local_store"

    def __init__(self, path: Path, cfg: LocalStoreConfig, metrics: StoreMetrics) -> None:
        self.path = path
        self.writer = StoreWriter(path, cfg, metrics)
        self.metrics = metrics
        self.writer.start()
        logger.info(
            "local store at %s (max_age_s=%g, max_bytes=%d)", path, cfg.max_age_s, cfg.max_bytes
        )

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        if signal is Signal.LOGS:
            self.metrics.failed.labels("unsupported_signal").inc()
            return ExportResult.success()
        error = await self.writer.write(signal, payload)
        if error is None:
            return ExportResult.success()
        if error.startswith("sqlite"):
            return ExportResult.retryable(error)
        return ExportResult.permanent(error)

    async def close(self) -> None:
        await self.writer.close()
