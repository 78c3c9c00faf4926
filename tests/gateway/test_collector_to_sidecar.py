"""The project's Collector distribution (``scripts/otelcol_build.py``; its OTLP exporter is
grpc-go) exporting into the sidecar's gRPC receiver (HTTP/2 on ``h2``), plain and gzip:
traces, metrics and logs arrive at the sidecar's backend as they were sent to the
Collector, and the receiver refused nothing at the HTTP/2 level.

The Collector runs this module's own minimal config (OTLP in, batch, OTLP/gRPC out to the
sidecar) through :class:`testkit.otelcol.Collector`, so only its ``GATEWAY_*`` settings
and the exporter's target differ from the gateway tiers' way of running it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from testkit.otelcol import Collector
from testkit.otlp_samples import grpc_export, logs_request, metrics_request
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

# The first test to need the Collector builds it (about 5 minutes cold on a quiet two-core
# machine, more on a loaded one): the same hour as the other gateway modules, not the
# suite's default 300 s, which a cold run at load average 15 ran out of mid-build, failing
# every gateway test with it (the session fixture keeps its first error).
pytestmark = [pytest.mark.gateway, pytest.mark.timeout(3600)]

CONFIG = """
extensions:
  health_check:
    endpoint: ${env:GATEWAY_HEALTH_LISTEN}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: ${env:GATEWAY_OTLP_GRPC_LISTEN}
processors:
  batch:
    timeout: 100ms
exporters:
  otlp_grpc:
    endpoint: ${env:SIDECAR_OTLP_GRPC}
    compression: ${env:SIDECAR_COMPRESSION}
    tls:
      insecure: true
service:
  extensions: [health_check]
  telemetry:
    metrics:
      level: none
  pipelines:
    traces: {receivers: [otlp], processors: [batch], exporters: [otlp_grpc]}
    metrics: {receivers: [otlp], processors: [batch], exporters: [otlp_grpc]}
    logs: {receivers: [otlp], processors: [batch], exporters: [otlp_grpc]}
"""
ATTRIBUTES = {"s": "text", "i": 42, "f": 2.5, "b": True}


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def sidecar(sink: RecordingSink) -> Iterator[SidecarProcess]:
    with SidecarProcess(backend=sink.endpoint) as sc:
        yield sc
    assert sc.returncode == 0, sc.log_text()[-3000:]


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_the_collector_exports_into_the_sidecar(
    gateway_bin: Path,
    sidecar: SidecarProcess,
    sink: RecordingSink,
    compression: str,
    tmp_path: Path,
) -> None:
    config = tmp_path / "collector-to-sidecar.yaml"
    config.write_text(CONFIG)
    env = {"SIDECAR_OTLP_GRPC": sidecar.grpc_endpoint, "SIDECAR_COMPRESSION": compression}
    tag = f"otelcol-{compression}"
    with Collector(gateway_bin, config, tmp_path, f"to-sidecar-{compression}", env) as col:
        provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{tag}"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=col.grpc_endpoint, insecure=True))
        )
        tracer = provider.get_tracer(f"tests.{tag}")
        for i in range(5):
            with tracer.start_as_current_span(f"{tag}-{i}", attributes={**ATTRIBUTES, "index": i}):
                pass
        provider.shutdown()
        grpc_export(col.grpc_endpoint, "metrics", metrics_request(f"{tag}.metric"))
        grpc_export(col.grpc_endpoint, "logs", logs_request(f"{tag} log line"))

        names = {f"{tag}-{i}" for i in range(5)}
        assert sink.wait_for(lambda: names <= {s.span.name for s in sink.spans()}, 60), (
            col.log_tail()
        )
        for recorded in sink.spans():
            if recorded.span.name in names:
                index = int(recorded.span.name.rsplit("-", 1)[1])
                assert recorded.attributes == {**ATTRIBUTES, "index": index}
                assert recorded.resource["service.name"] == f"svc-{tag}"
        assert sink.wait_for(
            lambda: any(
                m.name == f"{tag}.metric"
                for req in sink.metric_requests()
                for rm in req.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            ),
            60,
        )
        assert sink.wait_for(
            lambda: any(
                lr.body.string_value.startswith(f"{tag} log line")
                for req in sink.log_requests()
                for rl in req.resource_logs
                for sl in rl.scope_logs
                for lr in sl.log_records
            ),
            60,
        )
    assert sidecar.metric("gym_sidecar_http2_refusals_total") == 0
    assert sidecar.metric("gym_sidecar_bad_requests_total", transport="grpc") == 0
