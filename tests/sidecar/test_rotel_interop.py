"""Interop with an independent OTLP implementation: the sidecar forwards to rotel.

rotel (a Rust OpenTelemetry collector, installed from PyPI into a cached venv by
testkit/rotel.py) runs with the blackhole exporter and its detailed debug log;
the spans and attributes it prints are what the sidecar sent it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from testkit.rotel import RotelBlackhole
from tests.support.sidecar_proc import SidecarProcess

pytestmark = pytest.mark.peer


@pytest.fixture
def rotel(tmp_path: Path) -> Iterator[RotelBlackhole]:
    peer = RotelBlackhole(tmp_path).start()
    try:
        yield peer
    finally:
        peer.stop()


@pytest.mark.parametrize(
    ("protocol", "compression"),
    [("grpc", "none"), ("grpc", "gzip"), ("http/protobuf", "gzip")],
)
def test_rotel_prints_every_span_with_its_attributes(
    rotel: RotelBlackhole, protocol: str, compression: str
) -> None:
    backend = rotel.grpc_endpoint if protocol == "grpc" else rotel.http_endpoint
    tag = f"rotel-{protocol.split('/', maxsplit=1)[0]}-{compression}"
    with SidecarProcess(
        backend=backend,
        extra_args=["--backend-protocol", protocol, "--backend-compression", compression],
    ) as sc:
        provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{tag}"}))
        provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=sc.grpc_endpoint, insecure=True))
        )
        tracer = provider.get_tracer("tests.rotel")
        for i in range(6):
            with tracer.start_as_current_span(
                f"{tag}-{i}",
                attributes={"s": "text", "i": 42, "f": 2.5, "b": True, "index": i},
            ):
                pass
        provider.shutdown()
        spans = rotel.wait_spans(6)
    assert sc.returncode == 0, sc.log_text()
    got = {s.name: s for s in spans}
    assert set(got) == {f"{tag}-{i}" for i in range(6)}, rotel.output()[-3000:]
    for i in range(6):
        span = got[f"{tag}-{i}"]
        assert span.attributes == {
            "s": "Str(text)",
            "i": "Int(42)",
            "f": "Double(2.5)",
            "b": "Bool(true)",
            "index": f"Int({i})",
        }
        assert span.resource["service.name"] == f"Str(svc-{tag})"
        assert span.scope == "tests.rotel"
