"""Real gRPC clients of the sidecar's receiver (HTTP/2 on ``h2``, not grpc core): each
sends spans with typed attributes to a real ``gym-sidecar`` process, which forwards
them to the recording sink; what arrives must be what was sent.

- the agent's exporter (``gym_telemetry._lean.grpc_exporter``: the SDK's grpcio
  exporter with the lean encoder), plain and gzip;
- the sidecar's own h2 exporter, one sidecar forwarding to another, plain and gzip;
- rotel's OTLP exporter (Rust: tonic over hyper), plain and gzip (``-m peer``).

Elsewhere: the OpenTelemetry SDK's grpcio exporters (traces, metrics, logs, plain and
gzip) in ``test_receivers.py``, their RetryInfo handling in
``test_concurrency_limits.py``; the Collector's exporter (grpc-go) in
``tests/gateway/test_collector_to_sidecar.py`` (``-m gateway``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from testkit.otlp_samples import grpc_export, trace_request
from testkit.rotel import RotelForwarder
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

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


def send_spans(exporter: SpanExporter, tag: str, count: int = 5) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{tag}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer(f"tests.interop.{tag}")
    for i in range(count):
        with tracer.start_as_current_span(f"{tag}-{i}", attributes={**ATTRIBUTES, "index": i}):
            pass
    provider.shutdown()


def assert_arrived(sink: RecordingSink, tag: str, count: int = 5) -> None:
    names = {f"{tag}-{i}" for i in range(count)}
    assert sink.wait_for(lambda: names <= {s.span.name for s in sink.spans()}, 60)
    for recorded in sink.spans():
        if recorded.span.name in names:
            index = int(recorded.span.name.rsplit("-", 1)[1])
            assert recorded.attributes == {**ATTRIBUTES, "index": index}
            assert recorded.scope == f"tests.interop.{tag}"
            assert recorded.resource["service.name"] == f"svc-{tag}"


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_the_agents_grpc_exporter(
    sidecar: SidecarProcess,
    sink: RecordingSink,
    compression: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gym_telemetry._lean import grpc_exporter

    if compression == "gzip":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    exporter = grpc_exporter.make_grpc_exporter(sidecar.grpc_endpoint, insecure=True)
    assert isinstance(exporter, OTLPSpanExporter)
    lean_batches = grpc_exporter.STATS.batches
    tag = f"agent-{compression}"
    send_spans(exporter, tag)
    assert_arrived(sink, tag)
    assert grpc_exporter.STATS.batches > lean_batches, "the lean encoder did not run"


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_one_sidecar_forwarding_to_another(
    sidecar: SidecarProcess, sink: RecordingSink, compression: str
) -> None:
    """The h2 exporter (the default gRPC client) into the h2 receiver."""
    tag = f"relay-{compression}"
    with SidecarProcess(
        backend=sidecar.grpc_endpoint, extra_args=["--backend-compression", compression]
    ) as front:
        grpc_export(front.grpc_endpoint, "traces", trace_request(tag, 5))
        assert sink.wait_for(
            lambda: {f"{tag}-{i}" for i in range(5)} <= {s.span.name for s in sink.spans()}, 60
        )
    assert front.returncode == 0


@pytest.mark.peer
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_rotels_exporter(
    sidecar: SidecarProcess, sink: RecordingSink, compression: str, tmp_path: Path
) -> None:
    rotel = RotelForwarder(tmp_path, f"http://{sidecar.grpc_endpoint}", compression).start()
    try:
        tag = f"rotel-{compression}"
        send_spans(OTLPSpanExporter(endpoint=rotel.grpc_endpoint, insecure=True), tag)
        assert_arrived(sink, tag)
    finally:
        rotel.stop()
    assert sidecar.metric("gym_sidecar_http2_refusals_total") == 0, rotel.output()[-2000:]
