"""Reading OTLP metrics back: every data point of a request, flattened.

The collecting tail stage these tests pair it with is ``tests.support.collect_stage``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from testkit.sink import attrs


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
