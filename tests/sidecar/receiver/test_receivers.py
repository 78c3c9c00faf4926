"""A real sidecar process between real OTLP clients and a recording gRPC sink.

Every span must arrive with its attributes intact over gRPC, HTTP protobuf, HTTP JSON
and gzip (HTTP Content-Encoding and gRPC message compression); metrics and logs must
pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from testkit.otlp_samples import (
    grpc_export,
    http_post,
    json_bytes,
    logs_request,
    metrics_request,
    trace_request,
    trace_request_json,
)
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

ATTRS: dict[str, Any] = {"s": "text", "i": 42, "f": 2.5, "b": True, "arr": ("x", "y")}


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    with SidecarProcess(backend=sink.endpoint) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()


def _spans_named(sink: RecordingSink, prefix: str) -> dict[str, Any]:
    return {s.span.name: s for s in sink.spans() if s.span.name.startswith(prefix)}


def _send_with_sdk(exporter: SpanExporter, tag: str, n: int = 5) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{tag}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer(f"tests.{tag}")
    for i in range(n):
        with tracer.start_as_current_span(f"{tag}-{i}", attributes={**ATTRS, "index": i}):
            pass
    provider.shutdown()


@pytest.mark.parametrize(
    ("tag", "make_exporter"),
    [
        ("sdk-grpc", lambda sc: GrpcSpans(endpoint=sc.grpc_endpoint, insecure=True)),
        (
            "sdk-grpc-gzip",
            lambda sc: GrpcSpans(
                endpoint=sc.grpc_endpoint, insecure=True, compression=grpc.Compression.Gzip
            ),
        ),
        ("sdk-http", lambda sc: HttpSpans(endpoint=sc.http_url + "/v1/traces")),
        (
            "sdk-http-gzip",
            lambda sc: HttpSpans(
                endpoint=sc.http_url + "/v1/traces", compression=HttpCompression.Gzip
            ),
        ),
    ],
)
def test_sdk_exporters_spans_arrive_with_attributes(
    sidecar: SidecarProcess, sink: RecordingSink, tag: str, make_exporter: Any
) -> None:
    _send_with_sdk(make_exporter(sidecar), tag)
    assert sink.wait_for(lambda: len(_spans_named(sink, tag + "-")) == 5)
    got = _spans_named(sink, tag + "-")
    for i in range(5):
        rec = got[f"{tag}-{i}"]
        assert rec.attributes["s"] == "text"
        assert rec.attributes["i"] == 42
        assert rec.attributes["f"] == 2.5
        assert rec.attributes["b"] is True
        assert rec.attributes["arr"] == ["x", "y"]
        assert rec.attributes["index"] == i
        assert rec.resource["service.name"] == f"svc-{tag}"
        assert rec.scope == f"tests.{tag}"


def test_http_json_spans_arrive_with_ids_and_attributes(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    resp = http_post(
        sidecar.http_url,
        "traces",
        json_bytes(trace_request_json("json", 4)),
        content_type="application/json",
    )
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {}
    assert sink.wait_for(lambda: len(_spans_named(sink, "json-")) == 4)
    for i, name in enumerate(sorted(_spans_named(sink, "json-"))):
        rec = _spans_named(sink, "json-")[name]
        assert rec.span.trace_id.hex() == "5b8efff798038103d269b633813fc60c"
        assert rec.span.span_id.hex() == f"{i + 1:016x}"
        assert rec.span.parent_span_id.hex() == "eee19b7ec3c1b173"
        assert rec.span.kind == 2
        assert rec.span.start_time_unix_nano == 1544712660000000000
        assert rec.attributes == {"tag": "json", "index": i}
        assert rec.resource["service.name"] == "json-svc"


def test_http_json_snake_case_and_gzip(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    doc = {
        "resource_spans": [
            {
                "scope_spans": [
                    {
                        "spans": [
                            {
                                "trace_id": "00000000000000000000000000000001",
                                "span_id": "0000000000000002",
                                "name": "snake-0",
                                "kind": "SPAN_KIND_CLIENT",
                                "unknownField": 1,
                            }
                        ]
                    }
                ]
            }
        ]
    }
    resp = http_post(
        sidecar.http_url, "traces", json_bytes(doc), content_type="application/json", gzipped=True
    )
    assert resp.status_code == 200, resp.text
    assert sink.wait_for(lambda: "snake-0" in _spans_named(sink, "snake-"))
    span = _spans_named(sink, "snake-")["snake-0"].span
    assert span.span_id.hex() == "0000000000000002"
    assert span.kind == 3


def test_http_protobuf_plain_and_gzip(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    for tag, gz in (("pb-plain", False), ("pb-gzip", True)):
        body = trace_request(tag, 3).SerializeToString()
        resp = http_post(sidecar.http_url, "traces", body, gzipped=gz)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "application/x-protobuf"
        ExportTraceServiceResponse.FromString(resp.content)
        assert sink.wait_for(lambda t=tag: len(_spans_named(sink, t + "-")) == 3)
        assert _spans_named(sink, tag + "-")[f"{tag}-2"].attributes["index"] == 2


def test_metrics_and_logs_pass_through_unchanged(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    sent_metrics = [metrics_request("pass.grpc"), metrics_request("pass.http")]
    sent_logs = [logs_request("grpc-log"), logs_request("http-log")]
    grpc_export(sidecar.grpc_endpoint, "metrics", sent_metrics[0])
    grpc_export(sidecar.grpc_endpoint, "logs", sent_logs[0])
    assert http_post(sidecar.http_url, "metrics", sent_metrics[1].SerializeToString()).is_success
    assert http_post(sidecar.http_url, "logs", sent_logs[1].SerializeToString()).is_success

    def metric_named(name: str) -> Any:
        for req in sink.metric_requests():
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == name:
                            return m
        return None

    def log_bodies() -> set[str]:
        return {
            r.body.string_value
            for req in sink.log_requests()
            for rl in req.resource_logs
            for sl in rl.scope_logs
            for r in sl.log_records
        }

    for req in sent_metrics:
        name = req.resource_metrics[0].scope_metrics[0].metrics[0].name
        assert sink.wait_for(lambda n=name: metric_named(n) is not None)
        assert metric_named(name) == req.resource_metrics[0].scope_metrics[0].metrics[0]
    assert sink.wait_for(lambda: {"grpc-log-0", "grpc-log-1", "http-log-1"} <= log_bodies())


@pytest.mark.filterwarnings("ignore:.*LoggingHandler.*:DeprecationWarning")
def test_sdk_metric_and_log_exporters(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=sidecar.grpc_endpoint, insecure=True),
        export_interval_millis=60_000,
    )
    meter_provider = MeterProvider(metric_readers=[reader])
    meter_provider.get_meter("tests.sdk").create_counter("sdk.counter").add(7, {"k": "v"})
    meter_provider.force_flush()
    meter_provider.shutdown()

    def counter_value() -> float | None:
        for req in sink.metric_requests():
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == "sdk.counter":
                            return float(m.sum.data_points[0].as_int)
        return None

    assert sink.wait_for(lambda: counter_value() == 7.0)

    import logging

    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(
        SimpleLogRecordProcessor(OTLPLogExporter(endpoint=sidecar.grpc_endpoint, insecure=True))
    )
    from opentelemetry.sdk._logs import LoggingHandler

    log = logging.getLogger("tests.sidecar.sdk-logs")
    log.propagate = False
    log.addHandler(LoggingHandler(logger_provider=logger_provider))
    log.warning("hello from the sdk")
    logger_provider.shutdown()
    assert sink.wait_for(
        lambda: any(
            r.body.string_value == "hello from the sdk"
            for req in sink.log_requests()
            for rl in req.resource_logs
            for sl in rl.scope_logs
            for r in sl.log_records
        )
    )


def test_received_items_counted_by_signal_and_transport(sidecar: SidecarProcess) -> None:
    before = sidecar.metric("gym_sidecar_received_items_total", signal="traces", transport="grpc")
    grpc_export(sidecar.grpc_endpoint, "traces", trace_request("count", 6))
    after = sidecar.metric("gym_sidecar_received_items_total", signal="traces", transport="grpc")
    assert after - before == 6
