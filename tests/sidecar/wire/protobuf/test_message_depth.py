"""``limits.max_message_depth``: OTLP/JSON and protobuf get the same verdict at every
limit, deep JSON never crashes the decoder, and the check does not recurse."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf import json_format
from gym_sidecar.core.signals import SPECS
from gym_sidecar.core.stage import Signal
from gym_sidecar.receiver.request import BadRequest, decode_json, decode_protobuf
from gym_sidecar.wire.protobuf.bounds import PARSER_MAX_DEPTH, rewrite_json_ids
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.otlp_samples import deep_json_text

SPEC = SPECS[Signal.TRACES]


def nested_json(levels: int, array: bool = False) -> dict[str, Any]:
    """A trace request whose one attribute nests ``levels`` kvlists (or arrays)."""
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(levels):
        if array:
            value = {"arrayValue": {"values": [value]}}
        else:
            value = {"kvlistValue": {"values": [{"key": "k", "value": value}]}}
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "s"}
    span["attributes"] = [{"key": "a", "value": value}]  # type: ignore[assignment]
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


def verdict(decode: Any, *args: Any) -> str:
    try:
        decode(*args)
    except BadRequest as exc:
        assert exc.reason == "too_deep", exc
        assert exc.limit == "max_message_depth"
        assert "message levels" in str(exc)
        return "too deep"
    return "ok"


# The deepest nesting upb itself parses: 31 kvlists or 47 arrays in a span attribute.
PARSER_MAX = {False: 31, True: 47}


@pytest.mark.parametrize("array", [False, True], ids=["kvlist", "array"])
def test_default_limit_is_the_parsers_own(array: bool) -> None:
    top = PARSER_MAX[array]
    for levels in (top - 1, top, top + 1, top + 5):
        doc = json.dumps(nested_json(levels, array)).encode()
        expected = "ok" if levels <= top else "too deep"
        assert verdict(decode_json, SPEC, doc) == expected, levels
    # The same requests as protobuf: the same verdicts (upb refuses beyond 100 levels).
    pb = ExportTraceServiceRequest()
    json_format.ParseDict(nested_json(top, array), pb)
    assert verdict(decode_protobuf, SPEC, pb.SerializeToString()) == "ok"


@pytest.mark.parametrize("limit", [8, 12, 20, 50, 99])
def test_json_and_protobuf_agree_at_every_limit(limit: int) -> None:
    for array in (False, True):
        for levels in range(PARSER_MAX[array] + 1):
            doc = nested_json(levels, array)
            pb = ExportTraceServiceRequest()
            json_format.ParseDict(json.loads(json.dumps(doc)), pb)
            as_json = verdict(decode_json, SPEC, json.dumps(doc).encode(), limit)
            as_pb = verdict(decode_protobuf, SPEC, pb.SerializeToString(), limit)
            assert as_json == as_pb, (limit, array, levels)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"a":' * 100_000,
        b'{"resourceSpans":' + b"[" * 5_000 + b"]" * 5_000 + b"}",
        deep_json_text(900),
    ],
    ids=["arrays 100k", "objects 100k", "arrays 5k in a field", "kvlist 900"],
)
def test_deep_json_refused_not_crashed(body: bytes) -> None:
    """Past json's own ~1000-level guard, and below it (where the old recursive id
    rewriting raised RecursionError: HTTP 500): a 400-class refusal either way."""
    assert verdict(decode_json, SPEC, body) == "too deep"


def test_id_rewriting_is_iterative_and_still_converts_ids() -> None:
    doc = nested_json(3)
    rewrite_json_ids(doc, PARSER_MAX_DEPTH)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == "q6urq6urq6urq6urq6urqw=="  # base64 of 16 x 0xab
    with pytest.raises(ValueError, match="hex"):
        rewrite_json_ids({"resourceSpans": [{"spanId": "zz"}]}, PARSER_MAX_DEPTH)
