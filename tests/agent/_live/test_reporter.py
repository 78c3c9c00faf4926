"""issue 41: the live reporter sends the in-flight state to a real OTLP receiver, over the
span exporter's own channel (gRPC, headers included) or its OTLP/HTTP endpoint.

The sinks are real servers (``testkit``: a grpc server, an aiohttp server) on free
loopback ports; the span exporters are the SDK's. Sends are driven with ``report()`` so
that no assertion depends on the thread's timing, except the thread test, which waits
for requests to arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from gym_telemetry import inflight
from gym_telemetry._lean.log_transport import sender_for
from gym_telemetry._live import lag
from gym_telemetry._live.reporter import LiveReporter
from gym_telemetry_semconv import live
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from testkit.http_sink import HttpSink
from testkit.sink import RecordingSink, attrs
from testkit.wait import wait_for

RESOURCE = Resource.create({"service.name": "nemo-gym/agent", "service.instance.id": "i-1"})
_PROVIDER = TracerProvider(resource=RESOURCE, shutdown_on_exit=False)
_TRACER = _PROVIDER.get_tracer("test")


@pytest.fixture(autouse=True)
def _empty_registry() -> Iterator[None]:
    inflight.IN_FLIGHT.clear()
    yield
    inflight.IN_FLIGHT.clear()


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as recording:
        yield recording


def _records(requests: list[Any]) -> list[LogRecord]:
    out = []
    for request in requests:
        for resource_logs in request.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                assert scope_logs.scope.name == live.SCOPE
                out.extend(scope_logs.log_records)
    return out


def _names(records: list[LogRecord]) -> list[str]:
    return [r.event_name for r in records]


def _reporter(send: Any, probe: lag.LagProbe | None = None) -> LiveReporter:
    assert send is not None
    return LiveReporter(RESOURCE, send, interval_s=60.0, probe=probe)


def test_starts_steps_and_heartbeats_over_the_span_channel(sink: RecordingSink) -> None:
    exporter = OTLPSpanExporter(endpoint=sink.endpoint, insecure=True, headers={"x-team": "rl"})
    reporter = _reporter(sender_for(exporter))
    span = _TRACER.start_span("gym.rollout")
    record = inflight.begin(span, "4-2", nested=False)

    assert reporter.report(timeout_s=5.0)
    first = _records(sink.log_requests())
    assert _names(first) == [live.EVENT_ROLLOUT_START, live.EVENT_HEARTBEAT]
    start, beat = first
    context = span.get_span_context()
    assert start.trace_id == context.trace_id.to_bytes(16, "big")
    assert start.span_id == context.span_id.to_bytes(8, "big")
    assert start.time_unix_nano == span.start_time
    assert attrs(start.attributes) == {
        "nemo.gym.rollout.id": "4-2",
        "event.name": live.EVENT_ROLLOUT_START,
    }
    assert attrs(beat.attributes)[live.ROLLOUTS_IN_FLIGHT] == 1
    assert attrs(beat.attributes)[live.LIVE_INTERVAL_S] == 60.0
    assert live.LAG_COUNT not in attrs(beat.attributes)  # no probe running
    assert sink.metadata["logs"]["x-team"] == "rl"
    resource = attrs(sink.log_requests()[0].resource_logs[0].resource.attributes)
    assert resource["service.instance.id"] == "i-1"

    # two hops before the next send: only the latest is sent, with the turns so far
    record.hop("POST /seed_session", "weather", model_call=False, relay=False)
    record.hop("POST /v1/responses", "policy_model", model_call=True, relay=False)
    hop_ns = record.step_ns
    assert reporter.report(timeout_s=5.0)
    step, _beat = _records(sink.log_requests()[1:])
    assert step.event_name == live.EVENT_ROLLOUT_STEP and step.time_unix_nano == hop_ns
    assert attrs(step.attributes) == {
        live.ROLLOUT_STEP: "POST /v1/responses",
        live.ROLLOUT_STEP_TARGET: "policy_model",
        "nemo.gym.rollout.turns": 1,
        "nemo.gym.rollout.id": "4-2",
        "event.name": live.EVENT_ROLLOUT_STEP,
    }
    assert step.trace_id == start.trace_id and step.span_id == start.span_id

    # nothing new: a heartbeat only; the rollout ends: none in flight
    assert reporter.report(timeout_s=5.0)
    assert _names(_records(sink.log_requests()[2:])) == [live.EVENT_HEARTBEAT]
    inflight.end(record)
    assert reporter.stop(timeout_s=5.0)
    last = _records(sink.log_requests()[3:])
    assert _names(last) == [live.EVENT_HEARTBEAT, live.EVENT_STOP]
    assert attrs(last[1].attributes)[live.ROLLOUTS_IN_FLIGHT] == 0
    assert reporter.stats.as_dict() == {
        "requests_sent": 4,
        "events_sent": 7,
        "requests_failed": 0,
        "encode_failures": 0,
    }


def test_a_failed_send_is_counted_and_the_state_sent_again(sink: RecordingSink) -> None:
    reporter = _reporter(sender_for(OTLPSpanExporter(endpoint=sink.endpoint, insecure=True)))
    record = inflight.begin(_TRACER.start_span("gym.rollout"), None, nested=False)
    record.hop("POST /verify", "weather", model_call=False, relay=False)
    sink.fail_next(1, grpc.StatusCode.UNAVAILABLE)
    assert not reporter.report(timeout_s=5.0)
    assert reporter.stats.requests_failed == 1 and not record.announced
    assert reporter.report(timeout_s=5.0)
    names = _names(_records(sink.log_requests()))
    assert names == [live.EVENT_ROLLOUT_START, live.EVENT_ROLLOUT_STEP, live.EVENT_HEARTBEAT]
    assert record.announced and record.sent_step_ns == record.step_ns


def test_no_receiver_at_all_is_counted_not_raised() -> None:
    port_without_server = RecordingSink().port
    reporter = _reporter(
        sender_for(OTLPSpanExporter(endpoint=f"127.0.0.1:{port_without_server}", insecure=True))
    )
    assert not reporter.report(timeout_s=2.0)
    assert not reporter.stop(timeout_s=2.0)
    assert reporter.stats.requests_failed == 2 and reporter.stats.requests_sent == 0


def test_the_heartbeat_carries_the_lag_since_the_last_one(sink: RecordingSink) -> None:
    probe = lag.LagProbe(0.5)
    probe._loop = object()  # type: ignore[assignment]  # running, without a loop to schedule on
    for sample_ms in (0.2, 3.0, 3.0, 700.0):
        probe.add(sample_ms)
    reporter = _reporter(sender_for(OTLPSpanExporter(endpoint=sink.endpoint, insecure=True)), probe)
    assert reporter.report(timeout_s=5.0)
    assert reporter.report(timeout_s=5.0)
    first, second = (attrs(r.attributes) for r in _records(sink.log_requests()))
    buckets = [0] * (len(live.EVENT_LOOP_LAG_BOUNDS_MS) + 1)
    buckets[0], buckets[2], buckets[9] = 1, 2, 1  # <=1 ms, (2, 5], (500, 1000]
    assert first[live.LAG_COUNT] == 4
    assert first[live.LAG_SUM] == pytest.approx(706.2)
    assert first[live.LAG_MAX] == 700.0
    assert list(first[live.LAG_BUCKET_COUNTS]) == buckets
    assert second[live.LAG_COUNT] == 0 and second[live.LAG_MAX] == 0.0


def test_the_thread_sends_every_interval_and_stops_with_the_stop_event(sink: RecordingSink) -> None:
    send = sender_for(OTLPSpanExporter(endpoint=sink.endpoint, insecure=True))
    assert send is not None
    reporter = LiveReporter(RESOURCE, send, interval_s=0.05)
    reporter.start()
    assert wait_for(lambda: len(sink.log_requests()) >= 3, 30)
    assert reporter.stop(timeout_s=5.0)
    names = _names(_records(sink.log_requests()))
    assert names[-1] == live.EVENT_STOP and names.count(live.EVENT_STOP) == 1
    assert set(names[:-1]) == {live.EVENT_HEARTBEAT}
    assert reporter.stop(timeout_s=1.0)  # twice: nothing more
    assert _names(_records(sink.log_requests())).count(live.EVENT_STOP) == 1


def test_over_otlp_http_to_the_logs_path() -> None:
    with HttpSink() as sink:
        exporter = HttpSpanExporter(endpoint=f"{sink.url}/v1/traces", headers={"x-team": "rl"})
        reporter = _reporter(sender_for(exporter))
        inflight.begin(_TRACER.start_span("gym.rollout"), "1-0", nested=False)
        assert reporter.report(timeout_s=5.0)
        assert _names(_records(sink.logs)) == [live.EVENT_ROLLOUT_START, live.EVENT_HEARTBEAT]
        assert sink.span_count == 0


def test_an_exporter_of_another_kind_has_no_sender() -> None:
    assert sender_for(object()) is None
