"""The live events as OTLP logs: an ``ExportLogsServiceRequest`` written as wire bytes.

One request holds one ``ResourceLogs`` (the process's resource, as its spans carry it)
with one ``ScopeLogs`` (scope ``gym_telemetry.live``) holding the events in order. Each
``LogRecord`` has ``time_unix_nano`` (when it happened), its attributes (the event's,
then ``event.name``), ``flags`` / ``trace_id`` / ``span_id`` (the rollout span's, when the
event is about a rollout), ``observed_time_unix_nano`` (when the request was written)
and ``event_name``; an empty body (as the SDK writes a record without one), no severity.

The bytes are exactly what the SDK's own log encoder
(``opentelemetry.exporter.otlp.proto.common._log_encoder.encode_logs``) serializes for
the same records (fields in number order, as the protobuf runtime writes them;
``tests/agent/_live/test_encoding.py`` compares both, and parses them with
``opentelemetry-proto``). Written by hand because the reporter thread builds one request
per interval from plain values: the SDK's would need its logging pipeline's objects.
Raises ``otlp_wire.UnsupportedValue`` for a value OTLP cannot carry (the reporter
counts it and drops the request).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from gym_telemetry_semconv import live

from gym_telemetry._lean.otlp_wire import (
    attributes_field,
    key_value,
    len_prefixed,
    string_field,
)

_fixed64 = struct.Struct("<Q").pack
_fixed32 = struct.Struct("<I").pack

# ExportLogsServiceRequest / ResourceLogs / ScopeLogs
_T_RESOURCE_LOGS: Final = b"\x0a"  # 1, len
_T_RL_RESOURCE: Final = b"\x0a"  # 1, len
_T_RL_SCOPE_LOGS: Final = b"\x12"  # 2, len
_T_RL_SCHEMA_URL: Final = b"\x1a"  # 3, len
_T_SL_SCOPE: Final = b"\x0a"  # 1, len
_T_SL_LOG_RECORDS: Final = b"\x12"  # 2, len
# Resource / InstrumentationScope
_T_RESOURCE_ATTRIBUTES: Final = b"\x0a"  # 1, len
_T_SCOPE_NAME: Final = b"\x0a"  # 1, len
# LogRecord
_T_TIME: Final = b"\x09"  # 1, fixed64
_EMPTY_BODY: Final = b"\x2a\x00"  # 5, len 0: an empty AnyValue, as the SDK writes no body
_T_ATTRIBUTES: Final = b"\x32"  # 6, len
_T_FLAGS: Final = b"\x45"  # 8, fixed32
_T_TRACE_ID: Final = b"\x4a"  # 9, len
_T_SPAN_ID: Final = b"\x52"  # 10, len
_T_OBSERVED_TIME: Final = b"\x59"  # 11, fixed64
_T_EVENT_NAME: Final = b"\x62"  # 12, len

_EVENT_NAME_KEY: Final = live.EVENT_NAME


class Event(NamedTuple):
    """One live event, in plain values."""

    name: str
    time_ns: int
    attributes: Mapping[str, Any]
    trace_id: int = 0
    span_id: int = 0
    trace_flags: int = 0


def encode_record(event: Event, observed_ns: int) -> bytes:
    """The ``LogRecord`` payload of ``event``."""
    parts = [_T_TIME, _fixed64(event.time_ns), _EMPTY_BODY]
    parts.append(attributes_field(_T_ATTRIBUTES, event.attributes))
    parts.append(len_prefixed(_T_ATTRIBUTES, key_value(_EVENT_NAME_KEY, event.name)))
    if event.trace_flags:
        parts += (_T_FLAGS, _fixed32(event.trace_flags))
    if event.trace_id:
        parts.append(len_prefixed(_T_TRACE_ID, event.trace_id.to_bytes(16, "big")))
    if event.span_id:
        parts.append(len_prefixed(_T_SPAN_ID, event.span_id.to_bytes(8, "big")))
    parts += (_T_OBSERVED_TIME, _fixed64(observed_ns))
    parts.append(string_field(_T_EVENT_NAME, event.name))
    return b"".join(parts)


_resource_cache: list[tuple[Any, bytes]] = []


def resource_block(resource: Any) -> bytes:
    """``ResourceLogs.resource`` (tag, length, payload) of an SDK ``Resource`` (immutable:
    the last one's bytes are kept; the reporter sends the same one every interval)."""
    cached = _resource_cache[0] if _resource_cache else None
    if cached is not None and cached[0] is resource:
        return cached[1]
    block = len_prefixed(
        _T_RL_RESOURCE, attributes_field(_T_RESOURCE_ATTRIBUTES, resource.attributes)
    )
    _resource_cache[:] = [(resource, block)]
    return block


_SCOPE_BLOCK: Final = len_prefixed(_T_SL_SCOPE, string_field(_T_SCOPE_NAME, live.SCOPE))


def encode_request(resource: Any, events: Sequence[Event], observed_ns: int) -> bytes:
    """The ``ExportLogsServiceRequest`` bytes carrying ``events`` for ``resource``."""
    records = [len_prefixed(_T_SL_LOG_RECORDS, encode_record(e, observed_ns)) for e in events]
    scope_logs = len_prefixed(_T_RL_SCOPE_LOGS, _SCOPE_BLOCK + b"".join(records))
    schema = resource.schema_url
    schema_field = string_field(_T_RL_SCHEMA_URL, schema) if schema else b""
    return len_prefixed(_T_RESOURCE_LOGS, resource_block(resource) + scope_logs + schema_field)


__all__ = ["Event", "encode_record", "encode_request", "resource_block"]
