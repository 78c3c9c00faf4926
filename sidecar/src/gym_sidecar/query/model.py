"""Stored spans as Jaeger's query API returns them (its ``structuredTrace`` JSON).

The mapping from OTLP is the one Jaeger v2 applies to what it stores: attributes become
typed tags; the span kind becomes ``span.kind`` (``server``, ``client``, ``internal``,
``producer``, ``consumer``); a status other than UNSET becomes ``otel.status_code``
(``OK`` / ``ERROR``) with ``otel.status_description`` for its message, and ERROR adds the
tag ``error=true``; the scope becomes ``otel.scope.name`` / ``otel.scope.version``; the
resource becomes the span's process (``serviceName`` plus the other resource attributes
as tags); events become logs (an ``event`` field with the name, then the attributes);
the parent becomes a ``CHILD_OF`` reference and links ``FOLLOWS_FROM`` ones. Times are
microseconds since the epoch, durations microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import gym_telemetry_semconv as semconv

from gym_sidecar.store.queries import STATUS_ERROR, SpanRecord

KIND_NAMES: Final = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS_NAMES: Final = {1: "OK", 2: "ERROR"}


def tag(key: str, value: Any) -> dict[str, Any]:
    """One Jaeger key-value: typed like Jaeger's (string, bool, int64, float64)."""
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    return {"key": key, "type": "string", "value": json.dumps(value, default=str)}


def span_tags(span: SpanRecord) -> dict[str, Any]:
    """The span's tags by key, as Jaeger derives them (see the module docstring)."""
    tags: dict[str, Any] = dict(span.attributes)
    if span.scope:
        tags["otel.scope.name"] = span.scope
    if span.scope_version:
        tags["otel.scope.version"] = span.scope_version
    kind = KIND_NAMES.get(span.kind)
    if kind is not None:
        tags["span.kind"] = kind
    status = STATUS_NAMES.get(span.status_code)
    if status is not None:
        tags["otel.status_code"] = status
        if span.status_message:
            tags["otel.status_description"] = span.status_message
    if span.status_code == STATUS_ERROR:
        tags["error"] = True
    return tags


def _process_key(span: SpanRecord) -> str:
    return json.dumps(
        [span.service, sorted(span.resource.items(), key=lambda kv: kv[0])], default=str
    )


def trace_json(trace_id: str, spans: Sequence[SpanRecord]) -> dict[str, Any]:
    """One trace: ``traceID``, ``spans``, ``processes`` (``p1``, ``p2``... in order of
    first appearance), ``warnings``."""
    processes: dict[str, dict[str, Any]] = {}
    ids: dict[str, str] = {}
    out_spans: list[dict[str, Any]] = []
    for span in spans:
        key = _process_key(span)
        pid = ids.get(key)
        if pid is None:
            pid = ids[key] = f"p{len(ids) + 1}"
            processes[pid] = {
                "serviceName": span.service,
                "tags": [tag(k, v) for k, v in span.resource.items() if k != semconv.SERVICE_NAME],
            }
        refs: list[dict[str, str]] = []
        if span.parent_span_id:
            refs.append({"refType": "CHILD_OF", "traceID": trace_id, "spanID": span.parent_span_id})
        refs.extend({"refType": "FOLLOWS_FROM", "traceID": t, "spanID": s} for t, s in span.links)
        out_spans.append(
            {
                "traceID": trace_id,
                "spanID": span.span_id,
                "flags": 1,
                "operationName": span.name,
                "references": refs,
                "startTime": span.start_ns // 1000,
                "duration": max(0, span.end_ns - span.start_ns) // 1000,
                "tags": [tag(k, v) for k, v in span_tags(span).items()],
                "logs": [
                    {
                        "timestamp": e.time_ns // 1000,
                        "fields": [
                            tag("event", e.name),
                            *(tag(k, v) for k, v in e.attributes.items()),
                        ],
                    }
                    for e in span.events
                ],
                "processID": pid,
                "warnings": None,
            }
        )
    return {"traceID": trace_id, "spans": out_spans, "processes": processes, "warnings": None}


def envelope(
    data: Any, *, total: int | None = None, errors: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Jaeger's response wrapper: ``data``, ``total``, ``limit``, ``offset``, ``errors``."""
    if total is None:
        total = len(data) if isinstance(data, list) else 0
    return {"data": data, "total": total, "limit": 0, "offset": 0, "errors": errors}
