"""Export: the bounded queue, batching, retry and the OTLP exporters to the backend.

The pipeline builder calls :func:`build_export_stage` for the last stage.
"""

from __future__ import annotations

from gym_sidecar.export.base import Exporter, ExportResult, Outcome
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter
from gym_sidecar.export.otlp_http import OtlpHttpExporter
from gym_sidecar.export.queue import ExportQueue, Lease, MemoryQueue
from gym_sidecar.export.sender import Sender
from gym_sidecar.export.stage import NoBackendStage, QueueStage
from gym_sidecar.pipeline.stage import Stage
from gym_sidecar.selfmetrics import SelfMetrics

__all__ = [
    "BackendConfig",
    "ExportQueue",
    "ExportResult",
    "Exporter",
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


def build_export_stage(backend: BackendConfig, queue: QueueConfig, metrics: SelfMetrics) -> Stage:
    """The pipeline's last stage: queue -> batch -> export with retry and backpressure.

    With ``backend.url`` unset it returns a stage that drops and counts everything
    (reason ``no_backend``) and warns once at start. Call on the running event loop
    (the gRPC channel binds to it); then ``start()`` before traffic and
    ``shutdown(deadline_s)`` at the end, which drains the queue and closes the exporter.
    """
    if backend.url is None:
        return NoBackendStage(metrics)
    memory_queue = MemoryQueue(queue.max_bytes)
    sender = Sender(memory_queue, build_exporter(backend), queue, metrics)
    return QueueStage(memory_queue, sender, metrics, queue.backpressure_retry_after_s)
