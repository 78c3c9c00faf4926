"""Building OTLP trace requests for gating tests."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


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
