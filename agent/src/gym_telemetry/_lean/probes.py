"""Probe spans of every shape the lean span encoder must reproduce exactly.

``probe_spans()`` returns ended spans built with the installed SDK: SDK spans (events,
links, remote and local parents, trace state, error status with a description, every
attribute type, long values), a lean-recorded span (``gym_telemetry._lean.recorder``), raw
``ReadableSpan`` objects carrying values the SDK's attribute cleaning would reject
(maps, ``None``, bytes, negative and large integers), a span class that overrides a
property, two equal but distinct resources, scopes with and without version, schema URL
and attributes, and a span without a scope. ``grpc_exporter.self_check`` and the tests
compare the lean encoding of these with the stock ``encode_spans``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
_REMOTE_PARENT = SpanContext(
    _TRACE_ID,
    0x00F067AA0BA902B7,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
    trace_state=trace_api.TraceState([("vendor", "v1"), ("other", "x-y")]),
)
_LONG_TEXT = "grüße " * 40  # longer than 127 bytes: multi-byte length prefixes
_HUGE_TEXT = "x" * 20_000  # three-byte length prefixes


class _RenamingSpan(ReadableSpan):
    """A span class that computes a property instead of reading the field."""

    @property
    def name(self) -> str:
        return "renamed " + self._name


def _sdk_spans(provider: TracerProvider) -> list[ReadableSpan]:
    done: list[ReadableSpan] = []
    provider.add_span_processor(_Collect(done))
    server = provider.get_tracer("gym_telemetry.server")
    scoped = provider.get_tracer(
        "gym_telemetry.verify",
        "1.2.3",
        schema_url="https://opentelemetry.io/schemas/1.21.0",
        attributes={"scope.attr": "s", "scope.n": 3},
    )
    parent_ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(_REMOTE_PARENT))
    root = server.start_span(
        "POST /verify",
        context=parent_ctx,
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "http.route": "/verify",
            "http.response.status_code": 200,
            "nemo.gym.rollout.id": "12-3",
            "flag": True,
            "off": False,
            "ratio": 0.25,
            "negative": -7,
            "big": 2**62,
            "zero": 0,
            "empty": "",
            "long": _LONG_TEXT,
            "huge": _HUGE_TEXT,
            "strings": ("a", "b"),
            "ints": [1, -2, 300],
            "floats": (0.5, 1.5),
            "bools": (True, False),
            "empty.list": (),
        },
    )
    root.add_event("started", {"k": "v", "n": 1}, timestamp=1_700_000_000_000_000_001)
    root.add_event("bare")
    root.set_status(Status(StatusCode.ERROR, "went wrong"))
    child = scoped.start_span(
        "gym.verify",
        context=trace_api.set_span_in_context(root),
        links=[
            Link(_REMOTE_PARENT, {"link.attr": "l"}),
            Link(SpanContext(_TRACE_ID, 0x1234, is_remote=False)),
        ],
        attributes={"nemo.gym.reward": 1.0},
    )
    child.set_status(Status(StatusCode.OK))
    child.end()
    root.end()
    lone = server.start_span("internal", kind=SpanKind.CLIENT)
    lone.end()
    for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
        server.start_span(kind.name.lower(), kind=kind).end()
    return done


def _lean_span(provider: TracerProvider, done: list[ReadableSpan]) -> None:
    from gym_telemetry._lean.recorder import recorder_for

    recorder = recorder_for(provider.get_tracer("gym_telemetry.rollout"))
    span, token = recorder.start("gym.rollout", {"nemo.gym.rollout.id": "12-3", "n": 4})
    span.set_attribute("nemo.gym.reward", 0.5)
    span.add_event("turn", {"i": 1})
    span.end()
    from opentelemetry import context as context_api

    context_api.detach(token)  # type: ignore[arg-type]


def _raw_spans(resource: Resource) -> list[ReadableSpan]:
    context = SpanContext(_TRACE_ID, 0xABCDEF, is_remote=False)
    values: dict[str, Any] = {
        "map": {"a": 1, "b": "two", 3: [True, None]},
        "none": None,
        "bytes": b"\x00\xff",
        "min": -(2**63),
        "max": 2**63 - 1,
        "nested": [[1, 2], ["x"]],
    }
    scope = InstrumentationScope("raw.scope", None)
    raw = ReadableSpan(
        "raw",
        context=context,
        parent=SpanContext(_TRACE_ID, 0x99, is_remote=False),
        resource=resource,
        attributes=values,
        events=(Event("e", MappingProxyType({"x": 1.5}), 5),),
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR),
        start_time=1,
        end_time=2,
        instrumentation_scope=scope,
    )
    unscoped = ReadableSpan(
        "unscoped", context=context, resource=resource, start_time=3, end_time=4
    )
    renamed = _RenamingSpan("span", context=context, resource=resource, start_time=5, end_time=6)
    return [raw, unscoped, renamed]


class _Collect(SpanProcessor):
    """A span processor that keeps what ended (no export)."""

    def __init__(self, into: list[ReadableSpan]) -> None:
        self.into = into

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return

    def _on_ending(self, span: Any) -> None:
        return

    def on_end(self, span: ReadableSpan) -> None:
        self.into.append(span)

    def shutdown(self) -> None:
        return

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def probe_spans() -> list[ReadableSpan]:
    """The probe spans (module docstring). Sets no global state."""
    resource = Resource(
        {"service.name": "probe", "nemo.gym.server.type": "resources_servers", "n": 1},
        schema_url="https://opentelemetry.io/schemas/1.21.0",
    )
    twin = Resource(dict(resource.attributes), schema_url=resource.schema_url)
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    spans = _sdk_spans(provider)
    _lean_span(provider, spans)
    spans.extend(_raw_spans(twin))
    spans.extend(_raw_spans(Resource({"service.name": "other"})))
    return spans
