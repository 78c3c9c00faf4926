"""A real downstream stage that keeps what reaches it, and reading OTLP metrics back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gym_sidecar.pipeline.stage import Backpressure, Batch, Signal, Stage
from gym_sidecar.selfmetrics import SelfMetrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from tests.support.sink import attrs


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


@dataclass
class Point:
    resource: dict[str, Any]
    scope: str
    metric: str
    unit: str
    kind: str
    temporality: int
    attrs: dict[str, Any]
    point: Any


def points(req: ExportMetricsServiceRequest, name: str | None = None) -> list[Point]:
    """Every data point of ``req`` (of metric ``name`` if given), flattened."""
    out: list[Point] = []
    for rm in req.resource_metrics:
        res = attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if name is not None and m.name != name:
                    continue
                kind = m.WhichOneof("data")
                data = getattr(m, kind)
                temporality = getattr(data, "aggregation_temporality", 0)
                for dp in data.data_points:
                    out.append(
                        Point(
                            res,
                            sm.scope.name,
                            m.name,
                            m.unit,
                            kind,
                            temporality,
                            attrs(dp.attributes),
                            dp,
                        )
                    )
    return out
