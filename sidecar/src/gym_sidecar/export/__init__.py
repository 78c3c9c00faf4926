"""Export: the bounded queue, batching, retry and the OTLP exporters to the backend.

The pipeline builder calls :func:`build_export_stage` for the last stage.
"""

from __future__ import annotations

from gym_sidecar.export.base import Exporter, ExportResult, Outcome
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.export.disk_queue import DiskQueue, build_queue
from gym_sidecar.export.fanout import FanOutExporter
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter
from gym_sidecar.export.otlp_http import OtlpHttpExporter
from gym_sidecar.export.queue import ExportQueue, Lease, MemoryQueue
from gym_sidecar.export.sender import Sender
from gym_sidecar.export.stage import NoBackendStage, QueueStage
from gym_sidecar.pipeline.stage import Stage
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.store.config import LocalStoreConfig

__all__ = [
    "BackendConfig",
    "DiskQueue",
    "ExportQueue",
    "ExportResult",
    "Exporter",
    "FanOutExporter",
    "Lease",
    "MemoryQueue",
    "NoBackendStage",
    "OtlpGrpcExporter",
    "OtlpHttpExporter",
    "Outcome",
    "QueueConfig",
    "QueueStage",
    "Sender",
    "build_export_stage",
    "build_exporter",
]


def build_exporter(backend: BackendConfig) -> Exporter:
    """The OTLP exporter ``backend.protocol`` names. Call on the running event loop."""
    if backend.protocol == "grpc":
        return OtlpGrpcExporter(backend)
    return OtlpHttpExporter(backend)


def build_export_stage(
    backend: BackendConfig,
    queue: QueueConfig,
    metrics: SelfMetrics,
    local_store: LocalStoreConfig | None = None,
) -> Stage:
    """The pipeline's last stage: queue -> batch -> export with retry and backpressure.

    With ``local_store`` active (:meth:`LocalStoreConfig.active`: by default when
    ``backend.url`` is unset) the embedded store is an exporter too: the only one, or
    beside the backend behind a :class:`FanOutExporter`. With neither it returns a stage
    that drops and counts everything (reason ``no_backend``) and warns once at start.
    Opening the store may raise OSError. Call on the running event loop
    (the gRPC channel binds to it); then ``start()`` before traffic and
    ``shutdown(deadline_s)`` at the end, which drains the queue and closes the exporter.
    """
    exporters: list[Exporter] = []
    if backend.url is not None:
        exporters.append(build_exporter(backend))
    if local_store is not None and local_store.active(backend.url is not None):
        from gym_sidecar.store.exporter import LocalStoreExporter
        from gym_sidecar.store.writer import StoreMetrics

        store_metrics = StoreMetrics(metrics.registry)
        exporters.append(LocalStoreExporter(local_store.db_path(), local_store, store_metrics))
    if not exporters:
        return NoBackendStage(metrics)
    exporter = exporters[0] if len(exporters) == 1 else FanOutExporter(exporters)
    export_queue = build_queue(queue, metrics)  # in memory, or on disk (queue.persistent)
    sender = Sender(export_queue, exporter, queue, metrics)
    return QueueStage(export_queue, sender, metrics, queue.backpressure_retry_after_s)
