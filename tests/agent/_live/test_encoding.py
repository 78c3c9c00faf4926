"""issue 41: the live events' hand-written OTLP logs request is exactly the SDK's.

``_live.encoding.encode_request`` is compared byte for byte with what the SDK's own log
encoder (``encode_logs``) serializes for the same records, and parsed back with
``opentelemetry-proto``'s ``ExportLogsServiceRequest``.
"""

from __future__ import annotations

from typing import Any

import pytest
from gym_telemetry._lean.otlp_wire import UnsupportedValue
from gym_telemetry._live.encoding import Event, encode_request
from gym_telemetry_semconv import live
from opentelemetry import trace
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

RESOURCE = Resource.create(
    {"service.name": "nemo-gym/agent", "nemo.gym.server.name": "agent", "service.instance.id": "x"}
)
OBSERVED_NS = 1_700_000_000_123_456_789
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331

EVENTS = [
    Event(
        live.EVENT_ROLLOUT_START,
        1_700_000_000_000_000_001,
        {"nemo.gym.rollout.id": "3-1", "nemo.gym.rollout.nested": True},
        TRACE_ID,
        SPAN_ID,
        1,
    ),
    Event(
        live.EVENT_ROLLOUT_STEP,
        1_700_000_000_500_000_000,
        {
            live.ROLLOUT_STEP: "POST /ng-rollout/{rollout_id}/v1/responses",
            live.ROLLOUT_STEP_TARGET: "policy_model",
            "nemo.gym.rollout.turns": 2,
        },
        TRACE_ID,
        SPAN_ID,
        1,
    ),
    Event(
        live.EVENT_HEARTBEAT,
        1_700_000_002_000_000_000,
        {
            live.ROLLOUTS_IN_FLIGHT: 1,
            live.LIVE_INTERVAL_S: 2.0,
            live.LAG_COUNT: 4,
            live.LAG_SUM: 3.25,
            live.LAG_MAX: 2.5,
            live.LAG_BUCKET_COUNTS: (1, 2, 1) + (0,) * (len(live.EVENT_LOOP_LAG_BOUNDS_MS) - 2),
        },
    ),
    Event(live.EVENT_STOP, 1_700_000_003_000_000_000, {live.ROLLOUTS_IN_FLIGHT: 0}),
]


def _sdk_record(event: Event, resource: Resource) -> ReadableLogRecord:
    context = None
    if event.trace_id:
        span_context = SpanContext(
            event.trace_id, event.span_id, False, TraceFlags(event.trace_flags)
        )
        context = trace.set_span_in_context(NonRecordingSpan(span_context))
    attributes: dict[str, Any] = {**event.attributes, live.EVENT_NAME: event.name}
    record = LogRecord(
        timestamp=event.time_ns,
        observed_timestamp=OBSERVED_NS,
        context=context,
        attributes=attributes,
        event_name=event.name,
    )
    return ReadableLogRecord(
        log_record=record,
        resource=resource,
        instrumentation_scope=InstrumentationScope(live.SCOPE),
    )


@pytest.mark.parametrize("resource", [RESOURCE, Resource.create({}, schema_url="https://x/1")])
def test_bytes_are_the_sdk_encoders(resource: Resource) -> None:
    ours = encode_request(resource, EVENTS, OBSERVED_NS)
    stock = encode_logs([_sdk_record(e, resource) for e in EVENTS]).SerializeToString()
    assert ours == stock


def test_parsed_back_with_opentelemetry_proto() -> None:
    request = ExportLogsServiceRequest.FromString(encode_request(RESOURCE, EVENTS, OBSERVED_NS))
    (resource_logs,) = request.resource_logs
    assert {kv.key for kv in resource_logs.resource.attributes} >= {
        "service.name",
        "service.instance.id",
    }
    (scope_logs,) = resource_logs.scope_logs
    assert scope_logs.scope.name == "gym_telemetry.live"
    records = scope_logs.log_records
    assert [r.event_name for r in records] == list(live.EVENTS)
    start, step, heartbeat, stop = records
    assert start.trace_id == TRACE_ID.to_bytes(16, "big")
    assert start.span_id == SPAN_ID.to_bytes(8, "big")
    assert start.flags == 1 and start.time_unix_nano == EVENTS[0].time_ns
    assert start.observed_time_unix_nano == OBSERVED_NS
    assert {kv.key: kv.value.string_value for kv in start.attributes}[
        "event.name"
    ] == "gym.rollout.start"
    step_attrs = {kv.key: kv.value for kv in step.attributes}
    assert step_attrs["nemo.gym.rollout.turns"].int_value == 2
    assert step_attrs[live.ROLLOUT_STEP_TARGET].string_value == "policy_model"
    beat = {kv.key: kv.value for kv in heartbeat.attributes}
    assert [v.int_value for v in beat[live.LAG_BUCKET_COUNTS].array_value.values][:3] == [1, 2, 1]
    assert beat[live.LAG_SUM].double_value == 3.25
    assert heartbeat.trace_id == b"" and heartbeat.span_id == b"" and heartbeat.flags == 0
    assert stop.event_name == "gym.agent.stop"


def test_a_value_otlp_cannot_carry_is_refused() -> None:
    with pytest.raises(UnsupportedValue):
        encode_request(RESOURCE, [Event("e", 1, {"k": object()})], OBSERVED_NS)
