"""Reading the live events: OTLP log records of scope ``gym_telemetry.live`` into plain
values, and the identity of the process that sent them.

A record's event is ``LogRecord.event_name`` (proto field 12), else its ``event.name``
attribute (receivers older than that field). Only scalar attribute values and arrays
of integers (the lag buckets) are read; anything else of an attribute reads as absent.
What the events mean is the tracker's business (:mod:`.tracker`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, TypeAlias

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv import live
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

EventValue: TypeAlias = str | int | float | bool | tuple[int, ...]

SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
UNKNOWN_SERVICE: Final = "unknown_service"
"""Server name of a resource with neither ``nemo.gym.server.name`` nor ``service.name``."""
PER_PROCESS_PREFIXES: Final = ("process.",)
"""Resource attributes that differ per process, left out of a server's resource."""


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One live event as received."""

    name: str
    time_ns: int
    """``time_unix_nano``: when it happened, on the sender's clock (0: not given)."""
    observed_ns: int
    """``observed_time_unix_nano``: when the sender wrote the request (0: not given)."""
    trace_id: bytes
    span_id: bytes
    attributes: dict[str, EventValue]


def _value(value: AnyValue) -> EventValue | None:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "array_value":
        items = value.array_value.values
        if all(item.WhichOneof("value") == "int_value" for item in items):
            return tuple(item.int_value for item in items)
    return None


def read_event(record: LogRecord) -> LiveEvent:
    """``record`` as a :class:`LiveEvent` (its name ``""`` when it names none)."""
    attributes: dict[str, EventValue] = {}
    for kv in record.attributes:
        value = _value(kv.value)
        if value is not None:
            attributes[kv.key] = value
    name = record.event_name
    if not name:
        fallback = attributes.get(live.EVENT_NAME)
        name = fallback if isinstance(fallback, str) else ""
    return LiveEvent(
        name,
        record.time_unix_nano,
        record.observed_time_unix_nano,
        record.trace_id,
        record.span_id,
        attributes,
    )


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sent an OTLP request: a process of a Gym server."""

    server: str
    """``nemo.gym.server.name``, else ``service.name``, else :data:`UNKNOWN_SERVICE`."""
    instance: str
    """``service.instance.id`` (``""`` when the resource has none: then every process of
    the server reads as one instance)."""
    server_resource: bytes
    """The resource without ``service.instance.id`` and ``process.*``, serialized: the
    resource of the server's live metrics (stable across restarts)."""


def sender_of(resource: Resource) -> Sender:
    """The :class:`Sender` of a request with ``resource``."""
    gym_name = service = instance = ""
    kept = Resource()
    for kv in resource.attributes:
        key = kv.key
        if key == SERVICE_INSTANCE_ID:
            instance = kv.value.string_value
            continue
        if key.startswith(PER_PROCESS_PREFIXES):
            continue
        if key == semconv.SERVER_NAME:
            gym_name = kv.value.string_value
        elif key == SERVICE_NAME:
            service = kv.value.string_value
        kept.attributes.append(kv)
    server = gym_name or service or UNKNOWN_SERVICE
    return Sender(server, instance, kept.SerializeToString(deterministic=True))
