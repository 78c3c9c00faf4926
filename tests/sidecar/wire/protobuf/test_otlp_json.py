"""OTLP/JSON decoding rules (spec "JSON Protobuf Encoding"), checked on the decoder."""

from __future__ import annotations

import json

import pytest
from gym_sidecar.core.signals import SPECS
from gym_sidecar.core.stage import Signal
from gym_sidecar.receiver.request import BadRequest, decode_json

TRACE_ID = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b173"


def test_ids_are_hex_everywhere_they_occur() -> None:
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE_ID,
                                "spanId": SPAN_ID,
                                "parentSpanId": "",
                                "links": [{"traceId": TRACE_ID, "spanId": "0102030405060708"}],
                                "attributes": [
                                    # An attribute *named* traceId is a value, not an id field.
                                    {"key": "traceId", "value": {"stringValue": "not-hex"}},
                                    {"key": "blob", "value": {"bytesValue": "AAEC"}},
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    req = decode_json(SPECS[Signal.TRACES], json.dumps(doc).encode())
    span = req.resource_spans[0].scope_spans[0].spans[0]  # type: ignore[union-attr]
    assert span.trace_id.hex() == TRACE_ID
    assert span.span_id.hex() == SPAN_ID
    assert span.parent_span_id == b""
    assert span.links[0].span_id.hex() == "0102030405060708"
    assert span.attributes[0].value.string_value == "not-hex"
    assert span.attributes[1].value.bytes_value == b"\x00\x01\x02"  # bytes values stay base64


def test_log_and_exemplar_ids() -> None:
    logs = {
        "resourceLogs": [
            {
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "traceId": TRACE_ID,
                                "spanId": SPAN_ID,
                                "severityNumber": 9,
                                "body": {"stringValue": "hi"},
                            }
                        ]
                    }
                ]
            }
        ]
    }
    req = decode_json(SPECS[Signal.LOGS], json.dumps(logs).encode())
    rec = req.resource_logs[0].scope_logs[0].log_records[0]  # type: ignore[union-attr]
    assert rec.trace_id.hex() == TRACE_ID
    assert rec.severity_number == 9
    metrics = {
        "resourceMetrics": [
            {
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "m",
                                "sum": {
                                    "aggregationTemporality": 2,
                                    "isMonotonic": True,
                                    "dataPoints": [
                                        {
                                            "asInt": "5",
                                            "exemplars": [
                                                {
                                                    "asInt": "1",
                                                    "traceId": TRACE_ID,
                                                    "spanId": SPAN_ID,
                                                }
                                            ],
                                        }
                                    ],
                                },
                            }
                        ]
                    }
                ]
            }
        ]
    }
    mreq = decode_json(SPECS[Signal.METRICS], json.dumps(metrics).encode())
    point = mreq.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0]  # type: ignore[union-attr]
    assert point.as_int == 5
    assert point.exemplars[0].span_id.hex() == SPAN_ID
    assert SPECS[Signal.METRICS].count(mreq) == 1


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\xff\xfe", "not valid JSON"),
        (b'"a string"', "JSON object"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "xyz"}]}]}]}', "hex"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
            "OTLP/JSON",
        ),
        (b'{"resourceSpans": 5}', "OTLP/JSON"),
        # json_format turns an enum given as an infinite number into an OverflowError
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": Infinity}]}]}]}', "OTLP/JSON"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"kind": -1e400}]}]}]}', "OTLP/JSON"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"status": {"code": 1e999}}]}]}]}',
            "OTLP/JSON",
        ),
    ],
)
def test_bad_json_is_bad_request(body: bytes, needle: str) -> None:
    with pytest.raises(BadRequest, match=needle):
        decode_json(SPECS[Signal.TRACES], body)
