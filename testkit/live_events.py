"""Live events (``gym_telemetry_semconv.live``) built by hand, as OTLP log requests the way
the agent writes them, for the tests of the sidecar's rollouts tracker and for driving a
real sidecar without an agent; and a hand-driven clock for the tracker's unit tests."""

from __future__ import annotations

from dataclasses import dataclass

import gym_telemetry_semconv as semconv
from gym_sidecar.live.events import EventValue, LiveEvent
from gym_telemetry_semconv import live
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from testkit.otlp_samples import kv

S = 1_000_000_000
T0 = 1_800_000_000 * S
"""The wall clock's start in these tests (unix ns)."""


@dataclass
class HandClock:
    """Wall and monotonic clocks that move only when told, together."""

    wall: int = T0
    mono: int = 5 * S

    def wall_ns(self) -> int:
        return self.wall

    def mono_ns(self) -> int:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += int(seconds * S)
        self.mono += int(seconds * S)


def resource(server: str = "agent_a", instance: str = "i-1", **extra: str) -> Resource:
    """A Gym server process's resource, as the agent sets it."""
    r = Resource()
    r.attributes.extend(
        [
            kv("service.name", f"nemo-gym/{server}"),
            kv(semconv.SERVER_NAME, server),
            kv("service.instance.id", instance),
            kv("process.pid", 4242),
            *(kv(k, v) for k, v in extra.items()),
        ]
    )
    return r


def ids(n: int) -> tuple[bytes, bytes]:
    """The (trace id, span id) of test rollout ``n``."""
    return n.to_bytes(16, "big"), (n + 1000).to_bytes(8, "big")


def event(
    name: str,
    n: int | None = None,
    time_ns: int = 0,
    observed_ns: int = 0,
    **attributes: EventValue,
) -> LiveEvent:
    trace_id, span_id = ids(n) if n is not None else (b"", b"")
    return LiveEvent(name, time_ns, observed_ns, trace_id, span_id, dict(attributes))


def start(
    n: int, time_ns: int = 0, rollout_id: str | None = None, **attrs: EventValue
) -> LiveEvent:
    if rollout_id is not None:
        attrs[semconv.ROLLOUT_ID] = rollout_id
    return event(live.EVENT_ROLLOUT_START, n, time_ns, **attrs)


def step(
    n: int,
    time_ns: int = 0,
    name: str = "POST /v1/responses",
    target: str = "model",
    turns: int = 1,
) -> LiveEvent:
    return event(
        live.EVENT_ROLLOUT_STEP,
        n,
        time_ns,
        **{live.ROLLOUT_STEP: name, live.ROLLOUT_STEP_TARGET: target, semconv.ROLLOUT_TURNS: turns},
    )


def heartbeat(in_flight: int = 0, interval_s: float = 2.0, **attrs: EventValue) -> LiveEvent:
    return event(
        live.EVENT_HEARTBEAT,
        None,
        **{live.ROLLOUTS_IN_FLIGHT: in_flight, live.LIVE_INTERVAL_S: interval_s},
        **attrs,
    )


def stop() -> LiveEvent:
    return event(live.EVENT_STOP, None, **{live.ROLLOUTS_IN_FLIGHT: 0})


def logs_request(
    res: Resource, events: list[LiveEvent], scope: str = live.SCOPE
) -> ExportLogsServiceRequest:
    """An OTLP logs request carrying ``events`` as the agent writes them: the event name in
    ``event_name`` and in ``event.name``."""
    req = ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.CopyFrom(res)
    sl = rl.scope_logs.add()
    sl.scope.name = scope
    for ev in events:
        rec = sl.log_records.add()
        rec.time_unix_nano = ev.time_ns
        rec.observed_time_unix_nano = ev.observed_ns
        rec.event_name = ev.name
        rec.trace_id = ev.trace_id
        rec.span_id = ev.span_id
        rec.attributes.append(kv(live.EVENT_NAME, ev.name))
        for key, value in ev.attributes.items():
            if isinstance(value, tuple):
                attr = rec.attributes.add()
                attr.key = key
                for item in value:
                    attr.value.array_value.values.add().int_value = item
            else:
                rec.attributes.append(kv(key, value))
    return req
