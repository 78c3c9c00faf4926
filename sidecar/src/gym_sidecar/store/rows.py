"""From serialized OTLP export requests to what the store writes (on the writer thread).

A trace request is kept whole, as the OTLP bytes it arrived in: every span with its
resource, scope, attributes, events and links, decoded again only when a trace is
read. What queries need is extracted beside it:

- per distinct trace in the request, the number of its spans there and their services
  (:data:`TraceRow`), so ``rollouts`` counts spans and lists services without decoding;
- every rollout, verification and env step (``gym.rollout``, ``gym.verify``,
  ``gym.env.step``: the spans the derive stage reads too, from either producer,
  ``core.producers``) as a row with its columns and attributes as JSON
  (:data:`GymSpanRow`), so ``rollouts`` and ``stats`` never decode requests.

Only the scopes that can hold them (``core.producers.ROW_SCOPES``) are walked span by
span, plus one pass reading each span's trace id, which keeps writing several times
cheaper than a row per span. Metric points are kept
for metrics named ``gym.*`` and the GenAI ones (``STORED_METRIC_PREFIXES``: the derived
metrics); logs are not stored.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric

from gym_sidecar.core import producers

GYM_METRIC_PREFIX: Final = "gym."
STORED_METRIC_PREFIXES: Final = (GYM_METRIC_PREFIX, "gen_ai.client.", "gen_ai.server.")
"""Metric names whose points the store keeps: the ``gym.*`` metrics and the GenAI ones
(the sidecar derives ``gen_ai.client.token.usage``, ``gen_ai.client.operation.duration``
and ``gen_ai.server.time_to_first_token``: the web view's model-call figures)."""

TraceRow = tuple[bytes, int, str]
"""(trace_id, spans of it in the request, its services comma-separated)."""

GymSpanRow = tuple[bytes, bytes, bytes | None, str, int, int, int, str, str, str | None, str]
"""(trace_id, span_id, parent_span_id, name, start_ns, end_ns, status_code, status message,
service, rollout_id, attributes JSON)."""

PointRow = tuple[str, str, str, int, int, str, str]
"""(name, kind, service, start_ns, time_ns, attributes JSON, value JSON)."""


@dataclass(slots=True)
class Truncation:
    """Counts attribute values shortened to ``max_chars`` (in JSON columns only)."""

    max_chars: int
    truncated: int = 0


@dataclass(slots=True)
class TraceRows:
    """What one trace request adds besides its bytes."""

    spans: int = 0
    traces: list[TraceRow] = field(default_factory=list)
    gym_spans: list[GymSpanRow] = field(default_factory=list)


def any_value(value: AnyValue, trunc: Truncation) -> Any:
    """A plain Python value for an OTLP ``AnyValue`` (bytes as hex)."""
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


def to_json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)


def service_of(resource: Any) -> str:
    """``service.name`` of an OTLP resource (``unknown_service`` without one)."""
    for kv in resource.attributes:
        if kv.key == semconv.SERVICE_NAME:
            return str(any_value(kv.value, Truncation(1 << 30)))
    return "unknown_service"


def trace_rows(payload: bytes, trunc: Truncation) -> TraceRows:
    """The index rows of a serialized ``ExportTraceServiceRequest``.

    Raises ``google.protobuf.message.DecodeError`` on bytes that do not parse.
    """
    request = ExportTraceServiceRequest.FromString(payload)
    out = TraceRows()
    counts: Counter[bytes] = Counter()
    services: dict[bytes, set[str]] = {}
    for rs in request.resource_spans:
        service = service_of(rs.resource)
        for ss in rs.scope_spans:
            spans = ss.spans
            here = Counter(span.trace_id for span in spans)
            counts.update(here)
            for trace_id in here:
                services.setdefault(trace_id, set()).add(service)
            if ss.scope.name in producers.ROW_SCOPES:
                role = producers.scope_role(ss.scope.name)
                for span in spans:
                    if role.span(span.name).kind not in producers.ROW_KINDS:
                        continue
                    attrs = attributes(span.attributes, trunc)
                    rollout = attrs.get(semconv.ROLLOUT_ID)
                    out.gym_spans.append(
                        (
                            span.trace_id,
                            span.span_id,
                            span.parent_span_id or None,
                            span.name,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            span.status.code,
                            span.status.message,
                            service,
                            None if rollout is None else str(rollout),
                            to_json(attrs),
                        )
                    )
    out.spans = sum(counts.values())
    out.traces = [(t, n, ",".join(sorted(services[t]))) for t, n in counts.items()]
    return out


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
            # The exact extremes, when the producer gave them: they bound the quantiles
            # estimated from the buckets (stats.bucket_quantile).
            if hp.HasField("min"):
                value["min"] = hp.min
            if hp.HasField("max"):
                value["max"] = hp.max
            attrs = attributes(hp.attributes, trunc)
            out.append((hp.start_time_unix_nano, hp.time_unix_nano, attrs, value))
    elif kind in ("sum", "gauge"):
        points = metric.sum.data_points if kind == "sum" else metric.gauge.data_points
        for np_ in points:
            number = np_.as_int if np_.WhichOneof("value") == "as_int" else np_.as_double
            value = {"value": number}
            if kind == "sum":
                value["temporality"] = int(metric.sum.aggregation_temporality)
            attrs = attributes(np_.attributes, trunc)
            out.append((np_.start_time_unix_nano, np_.time_unix_nano, attrs, value))
    return kind, out


def point_rows(payload: bytes) -> list[PointRow]:
    """Rows of the points of the metrics the store keeps (:data:`STORED_METRIC_PREFIXES`)
    in a serialized ``ExportMetricsServiceRequest``."""
    request = ExportMetricsServiceRequest.FromString(payload)
    rows: list[PointRow] = []
    for rm in request.resource_metrics:
        service: str | None = None
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if not metric.name.startswith(STORED_METRIC_PREFIXES):
                    continue
                if service is None:
                    service = service_of(rm.resource)
                kind, points = _points(metric)
                for start_ns, time_ns, attrs, value in points:
                    rows.append(
                        (
                            metric.name,
                            kind,
                            service,
                            start_ns,
                            time_ns,
                            to_json(attrs),
                            to_json(value),
                        )
                    )
    return rows
