"""Building OTLP trace requests for gating tests."""

from __future__ import annotations

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans


def add_resource(
    req: ExportTraceServiceRequest, service: str | None, scopes: dict[str, int]
) -> ResourceSpans:
    """Append a ResourceSpans for ``service`` with ``scopes`` (scope name -> span count)."""
    rs = req.resource_spans.add()
    if service is not None:
        rs.resource.attributes.append(
            KeyValue(key=semconv.SERVICE_NAME, value=AnyValue(string_value=service))
        )
    for scope, n in scopes.items():
        ss = rs.scope_spans.add()
        ss.scope.name = scope
        for i in range(n):
            sp = ss.spans.add()
            sp.name = f"{scope}-{i}"
            sp.trace_id = bytes(16)
            sp.span_id = (i + 1).to_bytes(8, "big")
    return rs


def scope_counts(req: ExportTraceServiceRequest) -> dict[tuple[str | None, str], int]:
    """(service, scope) -> spans left in ``req``."""
    out: dict[tuple[str | None, str], int] = {}
    for rs in req.resource_spans:
        service = next(
            (kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"),
            None,
        )
        for ss in rs.scope_spans:
            out[(service, ss.scope.name)] = out.get((service, ss.scope.name), 0) + len(ss.spans)
    return out
