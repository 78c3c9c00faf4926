"""Stored traces as API v3 answers them: OTLP ``TracesData`` in OTLP/JSON.

The store keeps each export request as it arrived, so a trace is cut out of its
requests unchanged: each ResourceSpans and ScopeSpans that holds spans of the trace,
with its resource, scope and schema URL, and those spans only. Unless ``raw``, a span
id seen twice in a trace is given once (a span exported twice; Jaeger v2's own
adjusters do the same); ``raw`` gives every stored copy.

The JSON is OTLP/JSON, as Jaeger v2's HTTP API v3 writes it (its ``GRPCGatewayWrapper``:
``{"result": {"resourceSpans": [...]}}``): field names in lowerCamelCase, trace and span
ids as hex strings (the OTLP spec's exception to proto3 JSON's base64), enums as
integers (``"kind": 2``), 64-bit integers as decimal strings, fields at their default
value left out.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any, Final

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, TracesData

_ID_FIELDS: Final = ("traceId", "spanId", "parentSpanId")


def cut_trace(payloads: Iterable[bytes], trace_id: bytes, *, raw: bool = False) -> TracesData:
    """The spans of ``trace_id`` in the stored requests ``payloads`` (in stored order)."""
    out = TracesData()
    seen: set[bytes] = set()
    for payload in payloads:
        request = ExportTraceServiceRequest.FromString(payload)
        for rs in request.resource_spans:
            out_rs: ResourceSpans | None = None
            for ss in rs.scope_spans:
                out_ss: ScopeSpans | None = None
                for span in ss.spans:
                    if span.trace_id != trace_id:
                        continue
                    if not raw:
                        if span.span_id in seen:
                            continue
                        seen.add(span.span_id)
                    if out_rs is None:
                        out_rs = out.resource_spans.add()
                        out_rs.resource.CopyFrom(rs.resource)
                        out_rs.schema_url = rs.schema_url
                    if out_ss is None:
                        out_ss = out_rs.scope_spans.add()
                        out_ss.scope.CopyFrom(ss.scope)
                        out_ss.schema_url = ss.schema_url
                    out_ss.spans.append(span)
    return out


def _hex(value: Any) -> Any:
    return base64.b64decode(value).hex() if isinstance(value, str) else value


def to_json(data: TracesData) -> dict[str, Any]:
    """``data`` as an OTLP/JSON object (see the module docstring)."""
    doc: dict[str, Any] = json_format.MessageToDict(data, use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for key in _ID_FIELDS:
                    if key in span:
                        span[key] = _hex(span[key])
                for link in span.get("links", ()):
                    for key in _ID_FIELDS:
                        if key in link:
                            link[key] = _hex(link[key])
    return doc
