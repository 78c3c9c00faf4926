"""The wire view's writing out (``TraceRequest.SerializeToString``): what it splices,
and that it copies the received bytes when nothing changed. Hypothesis runs the whole
pipeline against the message-based one in ``tests/sidecar/test_trace_pipeline_wire.py``;
these are the cases spelled out."""

from __future__ import annotations

from gym_sidecar.core.traces import ResourceBlock, ScopeBlock, TraceRequest, varint
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from testkit.otlp_samples import add_resource, kv, trace_view


def request() -> bytes:
    req = ExportTraceServiceRequest()
    add_resource(req, "a", {"s1": 2, "s2": 1}).schema_url = "https://example/1"
    req.resource_spans.add().scope_spans.add().scope.name = "s3"  # no resource
    add_resource(req, "c", {"s4": 1})
    # An unknown request-level field (number 99, wire type 0, value 7), after the blocks.
    return req.SerializeToString() + varint(99 << 3) + varint(7)


def parse(view: TraceRequest) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString(view.SerializeToString())


def test_varint() -> None:
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**32, 2**63):
        encoded = varint(n)
        value = sum((b & 0x7F) << (7 * i) for i, b in enumerate(encoded))
        assert value == n and all(b >= 0x80 for b in encoded[:-1]) and encoded[-1] < 0x80


def test_untouched_requests_go_out_as_received() -> None:
    data = request()
    view = trace_view(data)
    assert view.SerializeToString() is data
    assert [len(b.scopes) for b in view.blocks] == [2, 1, 1] and len(view.other) == 1


def test_an_edited_block_is_rebuilt_with_its_other_fields() -> None:
    data = request()
    view = trace_view(data)
    first = view.blocks[0]
    first.scopes = first.scopes[1:]
    first.edited = True
    out = parse(view)
    before = ExportTraceServiceRequest.FromString(data)
    del before.resource_spans[0].scope_spans[0]
    assert out == before  # schema_url, the other blocks and the unknown field kept
    assert out.resource_spans[0].schema_url == "https://example/1"


def test_resource_out_replaces_the_resource_and_adds_a_missing_one() -> None:
    data = request()
    view = trace_view(data)
    enriched = Resource(attributes=[kv("service.name", "x"), kv("k", "v")])
    view.blocks[0].resource_out = enriched.SerializeToString()
    view.blocks[1].resource_out = Resource(attributes=[kv("k", "v")]).SerializeToString()
    out = parse(view)
    assert out.resource_spans[0].resource == enriched
    assert out.resource_spans[1].HasField("resource")
    assert [kv.key for kv in out.resource_spans[1].resource.attributes] == ["k"]
    assert out.resource_spans[2] == ExportTraceServiceRequest.FromString(data).resource_spans[2]


def test_removed_blocks_are_left_out_and_long_blocks_get_long_lengths() -> None:
    req = ExportTraceServiceRequest()
    add_resource(req, "big", {"s": 300})  # a body far over 16 KiB: a 3-byte length
    add_resource(req, "gone", {"s": 1})
    data = req.SerializeToString()
    view = trace_view(data)
    del view.blocks[1]
    view.changed = True
    view.blocks[0].resource_out = Resource(attributes=[kv("service.name", "b")]).SerializeToString()
    out = parse(view)
    assert len(out.resource_spans) == 1 and len(out.resource_spans[0].scope_spans[0].spans) == 300
    assert view.span_count() == 300


def test_the_index_is_built_by_the_constructors() -> None:
    """The constructors a scanner calls (the native one included) and what they set."""
    scope = ScopeBlock(2, 10, "s", 3, None)
    block = ResourceBlock(0, 12, None, [scope], [(10, 12)])
    assert (scope.start, scope.end, scope.name, scope.spans, scope.derived) == (2, 10, "s", 3, None)
    assert block.resource_out is None and not block.edited and block.current_resource == b""
    assert block.span_count == 3
    view = TraceRequest(b"x" * 12, [block], [])
    assert view.span_count() == 3 and not view.changed
