"""The local store behind the :class:`~gym_sidecar.core.exporter.Exporter` interface.

``export`` resolves once the request is committed to SQLite, so the export queue holds
the data until it is stored, and a store that falls behind pushes back on clients
through the same bounded queue as a slow backend. Logs are acknowledged and not stored
(counted as ``gym_sidecar_store_failed_requests{reason="unsupported_signal"}``).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

from gym_sidecar.core.exporter import Exporter, ExportResult
from gym_sidecar.core.stage import Signal
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.db import StoreVersionError
from gym_sidecar.store.writer import StoreMetrics, StoreWriter

logger = logging.getLogger(__name__)


class StoreOpenError(OSError):
    """The store's file could not be opened (SQLite error, other schema version)."""


class LocalStoreExporter(Exporter):
    """Writes traces and ``gym.*`` metric points into the local store.

    Lifecycle: construct (opens the file and starts the writer thread; raises OSError --
    :class:`StoreOpenError` for SQLite's own errors -- when the store cannot be opened),
    ``export`` concurrently, ``close``.
    """

    name = "local_store"

    def __init__(self, path: Path, cfg: LocalStoreConfig, metrics: StoreMetrics) -> None:
        self.path = path
        self.writer = StoreWriter(path, cfg, metrics)
        self.metrics = metrics
        try:
            self.writer.start()
        except (sqlite3.Error, StoreVersionError) as exc:
            raise StoreOpenError(f"cannot open the local store {path}: {exc}") from exc
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
