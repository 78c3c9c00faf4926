"""A real downstream stage for in-process pipeline tests: the tail that keeps what
reaches it."""

from __future__ import annotations

from gym_sidecar.core.stage import Backpressure, Batch, Signal, Stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)


class CollectStage(Stage):
    """The tail of a test pipeline: keeps batches; can push back ``refuse`` times."""

    name = "collect"

    def __init__(self, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self.batches: list[Batch] = []
        self.refuse = 0

    async def consume(self, batch: Batch) -> None:
        if self.refuse > 0:
            self.refuse -= 1
            raise Backpressure(1.0)
        self.batches.append(batch)

    def metric_requests(self) -> list[ExportMetricsServiceRequest]:
        return [b.message for b in self.batches if b.signal is Signal.METRICS]  # type: ignore[misc]
