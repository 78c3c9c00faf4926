"""The message shapes of Jaeger's query API, as protobuf descriptors, so that the tests
read the API's answers with protobuf's own JSON parser (``google.protobuf.json_format``,
strict: an unknown field, a wrong type or a malformed value is an error).

The shapes are Jaeger's IDL, restated field by field (names, numbers and types; no
Jaeger file is copied): API v3's ``jaeger.api_v3`` messages (``query_service.proto`` of
jaeger-idl: ``GetServicesResponse``, ``GetOperationsResponse``, ``Operation``,
``FindTraceSummariesResponse``, ``TraceSummary``, ``ServiceSummary``,
``GRPCGatewayWrapper`` around OTLP's ``TracesData``, ``GRPCGatewayError``) and the
metrics API's ``jaeger.api_v2.metrics.MetricFamily`` (``openmetrics.proto``, the part
the metrics readers fill: gauges).
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf import timestamp_pb2 as _timestamp  # noqa: F401  (in the pool)
from google.protobuf.message import Message
from opentelemetry.proto.trace.v1 import trace_pb2 as _trace  # noqa: F401  (in the pool)

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT32, _INT64, _UINT64, _FIXED64, _DOUBLE, _MESSAGE, _ENUM = (
    _F.TYPE_STRING,
    _F.TYPE_INT32,
    _F.TYPE_INT64,
    _F.TYPE_UINT64,
    _F.TYPE_FIXED64,
    _F.TYPE_DOUBLE,
    _F.TYPE_MESSAGE,
    _F.TYPE_ENUM,
)
_FILE: Final = "gym_tests/jaeger_query_api.proto"
_PACKAGE: Final = "gym_tests.jaeger"

# (message, [(field, number, type, repeated, type name, oneof index)])
_MESSAGES: Final[list[tuple[str, list[tuple[str, int, int, bool, str, int | None]]]]] = [
    ("GetServicesResponse", [("services", 1, _STRING, True, "", None)]),
    (
        "Operation",
        [("name", 1, _STRING, False, "", None), ("span_kind", 2, _STRING, False, "", None)],
    ),
    ("GetOperationsResponse", [("operations", 1, _MESSAGE, True, ".{p}.Operation", None)]),
    (
        "ServiceSummary",
        [
            ("name", 1, _STRING, False, "", None),
            ("span_count", 2, _INT32, False, "", None),
            ("error_span_count", 3, _INT32, False, "", None),
        ],
    ),
    (
        "TraceSummary",
        [
            ("trace_id", 1, _STRING, False, "", None),
            ("root_service_name", 2, _STRING, False, "", None),
            ("root_operation_name", 3, _STRING, False, "", None),
            ("min_start_time_unix_nano", 4, _FIXED64, False, "", None),
            ("max_end_time_unix_nano", 5, _FIXED64, False, "", None),
            ("span_count", 6, _INT32, False, "", None),
            ("error_span_count", 7, _INT32, False, "", None),
            ("orphan_span_count", 8, _INT32, False, "", None),
            ("services", 9, _MESSAGE, True, ".{p}.ServiceSummary", None),
        ],
    ),
    ("FindTraceSummariesResponse", [("summaries", 1, _MESSAGE, True, ".{p}.TraceSummary", None)]),
    (
        "GRPCGatewayWrapper",
        [("result", 1, _MESSAGE, False, ".opentelemetry.proto.trace.v1.TracesData", None)],
    ),
    (
        "GRPCGatewayErrorDetails",
        [
            ("grpcCode", 1, _INT32, False, "", None),
            ("httpCode", 2, _INT32, False, "", None),
            ("message", 3, _STRING, False, "", None),
            ("httpStatus", 4, _STRING, False, "", None),
        ],
    ),
    ("GRPCGatewayError", [("error", 1, _MESSAGE, False, ".{p}.GRPCGatewayErrorDetails", None)]),
    # jaeger.api_v2.metrics
    ("Label", [("name", 1, _STRING, False, "", None), ("value", 2, _STRING, False, "", None)]),
    (
        "GaugeValue",
        [("double_value", 1, _DOUBLE, False, "", 0), ("int_value", 2, _INT64, False, "", 0)],
    ),
    (
        "MetricPoint",
        [
            ("gauge_value", 2, _MESSAGE, False, ".{p}.GaugeValue", 0),
            ("timestamp", 8, _MESSAGE, False, ".google.protobuf.Timestamp", None),
        ],
    ),
    (
        "Metric",
        [
            ("labels", 1, _MESSAGE, True, ".{p}.Label", None),
            ("metric_points", 2, _MESSAGE, True, ".{p}.MetricPoint", None),
        ],
    ),
    (
        "MetricFamily",
        [
            ("name", 1, _STRING, False, "", None),
            ("type", 2, _ENUM, False, ".{p}.MetricType", None),
            ("unit", 3, _STRING, False, "", None),
            ("help", 4, _STRING, False, "", None),
            ("metrics", 5, _MESSAGE, True, ".{p}.Metric", None),
        ],
    ),
]
_ONEOFS: Final = {"GaugeValue": "value", "MetricPoint": "value"}
_METRIC_TYPES: Final = [
    "UNKNOWN",
    "GAUGE",
    "COUNTER",
    "STATE_SET",
    "INFO",
    "HISTOGRAM",
    "GAUGE_HISTOGRAM",
    "SUMMARY",
]


def _build() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_FILE)
        return pool
    except KeyError:
        pass
    f = descriptor_pb2.FileDescriptorProto(
        name=_FILE,
        package=_PACKAGE,
        syntax="proto3",
        dependency=[
            "google/protobuf/timestamp.proto",
            "opentelemetry/proto/trace/v1/trace.proto",
        ],
    )
    enum = f.enum_type.add(name="MetricType")
    for number, name in enumerate(_METRIC_TYPES):
        enum.value.add(name=name, number=number)
    for name, fields in _MESSAGES:
        msg = f.message_type.add(name=name)
        if name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[name])
        for fname, number, ftype, repeated, type_name, oneof in fields:
            field = msg.field.add(
                name=fname,
                number=number,
                type=ftype,  # type: ignore[arg-type]
                label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
            )
            if type_name:
                field.type_name = type_name.format(p=_PACKAGE)
            if oneof is not None:
                field.oneof_index = oneof
    pool.Add(f)
    return pool


_POOL: Final = _build()


def parse(message: str, doc: Any) -> Message:
    """``doc`` (a decoded JSON answer) parsed strictly as Jaeger's message ``message``."""
    cls = message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{_PACKAGE}.{message}"))
    out = cls()
    json_format.ParseDict(doc, out)
    return out
