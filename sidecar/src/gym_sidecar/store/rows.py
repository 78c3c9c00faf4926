"""From serialized OTLP export requests to the store's rows (runs on the writer thread).

Spans keep their resource and attributes as JSON objects (values converted from
``AnyValue``: strings, bools, ints, floats, lists, nested objects; bytes as hex).
Metric points are kept only for metrics whose name starts with ``gym.`` (the sidecar's
derived metrics); other metric requests and logs are not stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from gym_telemetry import semconv
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

GYM_METRIC_PREFIX: Final = "gym."

SpanRow = tuple[
    str, str, str | None, str, int, int, int, int, str, str, str, str | None, str, str, int
]
"""(trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code,
status_message, service, scope, rollout_id, attributes JSON, resource JSON, stored_ns)."""

PointRow = tuple[str, str, str, int, int, str, str, int]
"""(name, kind, service, start_ns, time_ns, attributes JSON, value JSON, stored_ns)."""


@dataclass(slots=True)
class Truncation:
    """Counts attribute values shortened to ``max_chars``."""

    max_chars: int
    truncated: int = 0


def any_value(value: AnyValue, trunc: Truncation) -> Any:
    """A plain Python value for an OTLP ``AnyValue``."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        text = value.string_value
        if len(text) > trunc.max_chars:
            trunc.truncated += 1
            return text[: trunc.max_chars] + "…"
        return text
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        return [any_value(v, trunc) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values, trunc)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return None


def attributes(kvs: Iterator[KeyValue] | Any, trunc: Truncation) -> dict[str, Any]:
    """A dict of OTLP key-values (later duplicates win)."""
    return {kv.key: any_value(kv.value, trunc) for kv in kvs}


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def span_rows(payload: bytes, stored_ns: int, trunc: Truncation) -> list[SpanRow]:
    """Rows of every span in a serialized ``ExportTraceServiceRequest``.

    Raises ``google.protobuf.message.DecodeError`` on bytes that do not parse.
    """
    request = ExportTraceServiceRequest.FromString(payload)
    rows: list[SpanRow] = []
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes, trunc)
        service = str(resource.get(semconv.SERVICE_NAME, "unknown_service"))
        resource_json = _json(resource)
        for ss in rs.scope_spans:
            scope = ss.scope.name
            for span in ss.spans:
                attrs = attributes(span.attributes, trunc)
                rollout = attrs.get(semconv.ROLLOUT_ID)
                rows.append(
                    (
                        span.trace_id.hex(),
                        span.span_id.hex(),
                        span.parent_span_id.hex() or None,
                        span.name,
                        int(span.kind),
                        int(span.start_time_unix_nano),
                        int(span.end_time_unix_nano),
                        int(span.status.code),
                        span.status.message,
                        service,
                        scope,
                        None if rollout is None else str(rollout),
                        _json(attrs),
                        resource_json,
                        stored_ns,
                    )
                )
    return rows


def _points(metric: Metric) -> tuple[str, list[tuple[int, int, dict[str, Any], Any]]]:
    """(kind, [(start_ns, time_ns, attributes, value)]) of one metric."""
    trunc = Truncation(1 << 30)
    kind = metric.WhichOneof("data") or ""
    out: list[tuple[int, int, dict[str, Any], Any]] = []
    if kind == "histogram":
        for hp in metric.histogram.data_points:
            value = {
                "count": hp.count,
                "sum": hp.sum,
                "bounds": list(hp.explicit_bounds),
                "buckets": list(hp.bucket_counts),
                "temporality": int(metric.histogram.aggregation_temporality),
            }
            out.append(
                (
                    hp.start_time_unix_nano,
                    hp.time_unix_nano,
                    attributes(hp.attributes, trunc),
                    value,
                )
            )
    elif kind in ("sum", "gauge"):
        points = metric.sum.data_points if kind == "sum" else metric.gauge.data_points
        for np_ in points:
            number = np_.as_int if np_.WhichOneof("value") == "as_int" else np_.as_double
            value = {"value": number}
            if kind == "sum":
                value["temporality"] = int(metric.sum.aggregation_temporality)
            out.append(
                (
                    np_.start_time_unix_nano,
                    np_.time_unix_nano,
                    attributes(np_.attributes, trunc),
                    value,
                )
            )
    return kind, out


def point_rows(payload: bytes, stored_ns: int) -> list[PointRow]:
    """Rows of the ``gym.*`` metric points in a serialized ``ExportMetricsServiceRequest``."""
    request = ExportMetricsServiceRequest.FromString(payload)
    rows: list[PointRow] = []
    trunc = Truncation(1 << 30)
    for rm in request.resource_metrics:
        service: str | None = None
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if not metric.name.startswith(GYM_METRIC_PREFIX):
                    continue
                if service is None:
                    resource = attributes(rm.resource.attributes, trunc)
                    service = str(resource.get(semconv.SERVICE_NAME, "unknown_service"))
                kind, points = _points(metric)
                for start_ns, time_ns, attrs, value in points:
                    rows.append(
                        (
                            metric.name,
                            kind,
                            service,
                            start_ns,
                            time_ns,
                            _json(attrs),
                            _json(value),
                            stored_ns,
                        )
                    )
    return rows
