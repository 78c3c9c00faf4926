"""Items a stage rejects are reported to the client as OTLP ``partial_success``.

The export stage rejects a request that can never fit its queue (larger than
``queue.max_bytes``); a small queue makes that happen on purpose.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from testkit.otlp_samples import grpc_export, http_post, json_bytes, trace_request
from testkit.sink import RecordingSink
from tests.support.sidecar_proc import SidecarProcess

QUEUE = {"max_bytes": 4096, "batch_max_bytes": 4096}


@pytest.fixture(scope="module")
def sidecar() -> Iterator[tuple[SidecarProcess, RecordingSink]]:
    with (
        RecordingSink() as sink,
        SidecarProcess(backend=sink.endpoint, config={"queue": QUEUE}) as sc,
    ):
        yield sc, sink
    assert sc.returncode == 0, sc.log_text()


def test_grpc_partial_success(sidecar: tuple[SidecarProcess, RecordingSink]) -> None:
    sc, sink = sidecar
    big = trace_request("huge", 100)
    assert big.ByteSize() > QUEUE["max_bytes"]
    resp = ExportTraceServiceResponse.FromString(grpc_export(sc.grpc_endpoint, "traces", big))
    assert resp.partial_success.rejected_spans == 100
    assert "exceeds the export queue" in resp.partial_success.error_message
    # A request that fits is still accepted in full, and only it reaches the sink.
    ok = ExportTraceServiceResponse.FromString(
        grpc_export(sc.grpc_endpoint, "traces", trace_request("small", 2))
    )
    assert not ok.HasField("partial_success")
    assert sink.wait_for(lambda: {s.span.name for s in sink.spans()} >= {"small-0", "small-1"})
    assert not any(s.span.name.startswith("huge") for s in sink.spans())
    assert sc.metric("gym_sidecar_refused_items_total", signal="traces", reason="rejected") >= 100


def test_http_partial_success_protobuf_and_json(
    sidecar: tuple[SidecarProcess, RecordingSink],
) -> None:
    sc, _ = sidecar
    big = trace_request("hugeh", 60)
    resp = http_post(sc.http_url, "traces", big.SerializeToString())
    assert resp.status_code == 200
    parsed = ExportTraceServiceResponse.FromString(resp.content)
    assert parsed.partial_success.rejected_spans == 60

    from google.protobuf import json_format

    doc = json_format.MessageToDict(big)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp["traceId"] = bytes(16).hex()
                sp["spanId"] = bytes(8).hex()
    resp = http_post(sc.http_url, "traces", json_bytes(doc), content_type="application/json")
    assert resp.status_code == 200
    body = resp.json()
    assert body["partialSuccess"]["rejectedSpans"] == "60"  # int64 as a JSON string
    assert "exceeds the export queue" in body["partialSuccess"]["errorMessage"]
