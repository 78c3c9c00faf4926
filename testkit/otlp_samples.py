"""Small OTLP requests (for the receiver tests and the receive/gate benchmarks), the
plain clients that send them, the attribute and resource builders other request
builders share, and trace requests as the sidecar's pipeline carries them (their wire
view: :func:`trace_view`, :func:`trace_batch`, :func:`parsed`)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc
import gym_telemetry_semconv as semconv
import httpx
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

if TYPE_CHECKING:  # the sidecar is imported only by the helpers that need it
    from gym_sidecar.core.stage import Batch
    from gym_sidecar.core.traces import ScanSpec, TraceRequest

SERVICES = {
    "traces": "opentelemetry.proto.collector.trace.v1.TraceService",
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
}


def kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def trace_view(
    request: ExportTraceServiceRequest | bytes, scan: ScanSpec | None = None
) -> TraceRequest:
    """``request`` as the receivers hand it to the default pipeline: its wire view (bytes
    plus index), with the spans the derive stage reads extracted and the gate's split
    scopes split (``scan``: something else)."""
    from dataclasses import replace

    from gym_sidecar.core.producers import SPLIT_SCOPES
    from gym_sidecar.metrics.spans import SCAN_SPEC
    from gym_sidecar.wire.protobuf.scan import scan_request

    data = request if isinstance(request, bytes) else request.SerializeToString()
    spec = replace(SCAN_SPEC, split_scopes=SPLIT_SCOPES) if scan is None else scan
    return scan_request(data, max_depth=100, max_messages=1_000_000, scan=spec)


def trace_batch(request: ExportTraceServiceRequest | bytes, peer: str | None = None) -> Batch:
    """A traces :class:`Batch` of ``request``'s wire view, counting its spans."""
    from gym_sidecar.core.stage import Batch, Signal

    view = trace_view(request)
    return Batch(Signal.TRACES, view, view.span_count(), peer=peer)


def parsed(message: object) -> ExportTraceServiceRequest:
    """A trace batch's message as it stands now, parsed (what the exporter would send)."""
    from gym_sidecar.core.traces import TraceRequest

    assert isinstance(message, TraceRequest), type(message)
    return ExportTraceServiceRequest.FromString(message.SerializeToString())


def trace_request(tag: str, spans: int = 3, service: str = "test-svc") -> ExportTraceServiceRequest:
    """``spans`` spans named ``{tag}-{i}`` with attributes tag/index/ratio/flag."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(kv("service.name", service))
    ss = rs.scope_spans.add()
    ss.scope.name = "tests.receiver"
    for i in range(spans):
        sp = ss.spans.add()
        sp.trace_id = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
        sp.span_id = (i + 1).to_bytes(8, "big")
        sp.name = f"{tag}-{i}"
        sp.kind = Span.SPAN_KIND_SERVER
        sp.start_time_unix_nano = 1_700_000_000_000_000_000 + i
        sp.end_time_unix_nano = 1_700_000_000_000_100_000 + i
        sp.attributes.extend([kv("tag", tag), kv("index", i), kv("ratio", 0.5), kv("flag", True)])
    return req


def trace_request_json(tag: str, spans: int = 3) -> dict[str, Any]:
    """The same shape in OTLP/JSON: hex ids, camelCase keys, enum as int, int64 as string."""
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "tests.receiver.json"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": f"{i + 1:016x}",
                                "parentSpanId": "eee19b7ec3c1b173",
                                "name": f"{tag}-{i}",
                                "kind": 2,
                                "startTimeUnixNano": "1544712660000000000",
                                "endTimeUnixNano": "1544712661000000000",
                                "attributes": [
                                    {"key": "tag", "value": {"stringValue": tag}},
                                    {"key": "index", "value": {"intValue": str(i)}},
                                ],
                                "status": {"code": 1},
                            }
                            for i in range(spans)
                        ],
                    }
                ],
            }
        ]
    }


def metrics_request(name: str, points: int = 2) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(kv("service.name", "test-svc"))
    sm = rm.scope_metrics.add()
    m: Metric = sm.metrics.add()
    m.name = name
    for i in range(points):
        dp: NumberDataPoint = m.gauge.data_points.add()
        dp.as_int = i
        dp.time_unix_nano = 1_700_000_000_000_000_000
        dp.attributes.append(kv("i", i))
    return req


def logs_request(body: str, records: int = 2) -> ExportLogsServiceRequest:
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.attributes.append(kv("service.name", "test-svc"))
    sl = rl.scope_logs.add()
    for i in range(records):
        rec: LogRecord = sl.log_records.add()
        rec.body.string_value = f"{body}-{i}"
        rec.severity_number = 9
    return req


def grpc_export(
    endpoint: str,
    signal: str,
    payload: bytes | Message,
    compression: grpc.Compression | None = None,
    timeout_s: float = 10,
) -> bytes:
    """One unary Export call with raw bytes; raises grpc.RpcError on a non-OK status."""
    data = payload if isinstance(payload, bytes) else payload.SerializeToString()
    with grpc.insecure_channel(
        endpoint, options=[("grpc.max_send_message_length", 256 * 1024 * 1024)]
    ) as channel:
        call = channel.unary_unary(f"/{SERVICES[signal]}/Export")
        result: bytes = call(data, timeout=timeout_s, compression=compression)
        return result


def http_post(
    base_url: str,
    signal: str,
    body: bytes,
    content_type: str = "application/x-protobuf",
    gzipped: bool = False,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    hdrs = {"Content-Type": content_type, **(headers or {})}
    if gzipped:
        body = gzip.compress(body)
        hdrs["Content-Encoding"] = "gzip"
    return httpx.post(f"{base_url}/v1/{signal}", content=body, headers=hdrs, timeout=10)


def json_bytes(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def deep_json_text(levels: int, shape: str = "kvlist") -> bytes:
    """An OTLP/JSON trace request whose one span attribute nests ``levels`` kvlist (or
    ``"array"``) AnyValues, or whose ``resourceSpans`` holds ``levels`` bare nested
    arrays (``"raw arrays"``) or objects (``"raw objects"``). Built as text, without
    recursion (json.dumps stops at Python's recursion limit)."""
    if shape == "raw arrays":
        return b'{"resourceSpans":' + b"[" * levels + b"]" * levels + b"}"
    if shape == "raw objects":
        return b'{"resourceSpans":' + b'{"a":' * levels + b"1" + b"}" * levels + b"}"
    if shape == "array":
        head, tail = b'{"arrayValue":{"values":[' * levels, b"]}}" * levels
    else:
        head, tail = b'{"kvlistValue":{"values":[{"key":"k","value":' * levels, b"}]}}" * levels
    value = head + b'{"stringValue":"leaf"}' + tail
    span = (
        b'{"traceId":"' + b"ab" * 16 + b'","spanId":"' + b"cd" * 8 + b'","name":"deep",'
        b'"attributes":[{"key":"a","value":' + value + b"}]}"
    )
    return b'{"resourceSpans":[{"scopeSpans":[{"spans":[' + span + b"]}]}]}"


def set_attrs(target: object, attrs: Mapping[str, object]) -> None:
    """Append ``attrs`` to a repeated ``KeyValue`` field, typed as :func:`kv` types them."""
    target.extend(kv(key, value) for key, value in attrs.items())  # type: ignore[attr-defined]


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
