"""The lean span: a recording ``opentelemetry.trace.Span`` that is its own ``ReadableSpan``.

``LeanSpan`` fills the fields ``ReadableSpan.__init__`` sets (``_name``, ``_context``,
``_kind``, ``_parent``, ``_start_time``, ``_end_time``, ``_attributes``, ``_events``,
``_links``, ``_resource``, ``_status``, ``_instrumentation_scope``,
``_instrumentation_info``) itself, keeps its attributes in a plain dict already cleaned
by ``clean_value``, and is handed to the processors' ``on_end`` as is (it ignores writes
after ``end``). ``recorder.LeanRecorder`` makes them; its one-time self-check compares a
probe with the SDK's own span before any is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Protocol

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE
from opentelemetry.util import types as otel_types

from gym_telemetry._lean.context import TUPLE_LAYOUT

_time_ns = time.time_ns
UNSET_STATUS: Final = Status(StatusCode.UNSET)
_ERROR_STATUS: Final = Status(StatusCode.ERROR)
MAX_ATTRIBUTES: Final = 128
MAX_EVENTS: Final = 128


class SpanOwner(Protocol):
    """What a ``LeanSpan`` takes from the recorder that started it."""

    instrumentation_info: Any
    instrumentation_scope: Any
    resource: Resource

    #: What ``ended`` would call for the span, when nothing else: set (only by a
    #: recorder whose ``processor`` has ``_span_processors``) for ``seen_processors``.
    direct_end: Callable[[LeanSpan], Any] | None
    processor: Any
    seen_processors: object

    def ended(self, span: LeanSpan) -> None:
        """Hand the ended span to the processors."""


_SCALAR_KINDS: Final = frozenset((bool, str, int, float))


def clean_value(value: Any) -> Any:
    """An attribute value OpenTelemetry accepts, or None to drop it: a bool, str, int or
    float, or a homogeneous sequence of one of those (returned as a tuple)."""
    kind = value.__class__
    if kind is tuple or kind is list:  # the usual sequences, without the ABC check
        items = tuple(value)
    elif isinstance(value, bool | str | int | float):
        return value
    elif isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        items = tuple(value)
    else:
        return None
    kinds = set(map(type, items))
    if not kinds or (len(kinds) == 1 and kinds <= _SCALAR_KINDS):
        return items
    return None


class LeanSpan(trace_api.Span, ReadableSpan):
    """A recording span that is its own ``ReadableSpan`` (see the module docstring).

    Made by ``new_span``. Not thread-safe for concurrent writers (one request's code
    writes to it); writes after ``end`` are ignored.
    """

    #: ``get_span_context`` returns the ``_context`` field, as ``ReadableSpan``'s does: the
    #: lean encoder may read the fields directly (``span_encoding._is_plain``).
    span_context_is_field: Final = True

    # ReadableSpan fields every new span starts with (see new_span).
    _end_time: int | None = None
    _events: tuple[Event, ...] = ()
    _links: tuple[trace_api.Link, ...] = ()
    _status: Status = UNSET_STATUS
    #: No status, event or link was ever set: the span's record can be written in the
    #: encoder's one-expression form (``span_encoding.encode_lean_record``). Cleared by
    #: ``set_status`` (a status other than unset), ``add_event`` and ``add_link``.
    _plain: bool = True

    # The fields ReadableSpan.__init__ sets, set by ``new_span`` (checked by LeanRecorder's
    # self-check). _end_time, _events, _links and _status start as the class's defaults
    # above (fewer stores per span); a write makes them the instance's own. _resource,
    # _instrumentation_scope and _instrumentation_info are the recorder's, read through
    # it (below): the same for every span of a recorder.
    _attributes: dict[str, Any]
    _recorder: SpanOwner

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ReadableSpan.__init__ would take these arguments and fill other fields: a span
        # is made by ``new_span`` only.
        raise TypeError("a LeanSpan is made by gym_telemetry._lean.span.new_span")

    @property
    def _resource(self) -> Resource:  # type: ignore[override]
        return self._recorder.resource

    @property
    def _instrumentation_scope(self) -> Any:  # type: ignore[override]
        return self._recorder.instrumentation_scope

    @property
    def _instrumentation_info(self) -> Any:  # type: ignore[override]
        return self._recorder.instrumentation_info

    # --- trace_api.Span -------------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        return self._context  # type: ignore[return-value]

    def is_recording(self) -> bool:
        return self._end_time is None

    def set_attribute(self, key: str, value: otel_types.AttributeValue) -> None:
        if self._end_time is not None or not key:
            return
        cleaned = clean_value(value)
        if cleaned is None:
            return
        attributes = self._attributes
        if key in attributes or len(attributes) < MAX_ATTRIBUTES:
            attributes[key] = cleaned

    def set_attributes(self, attributes: Mapping[str, otel_types.AttributeValue]) -> None:
        if self._end_time is not None:
            return
        own = self._attributes
        if (
            len(own) + len(attributes) <= MAX_ATTRIBUTES
            and set(map(type, attributes.values())) <= _SCALAR_KINDS
            and all(attributes)
        ):
            own.update(attributes)  # plain scalars under non-empty keys: clean as they are
            return
        for key, value in attributes.items():
            kind = value.__class__
            if key and (kind is str or kind is int or kind is bool or kind is float):
                if key in own or len(own) < MAX_ATTRIBUTES:
                    own[key] = value  # a plain scalar: clean as it is
            else:
                self.set_attribute(key, value)

    def add_clean(self, attributes: Mapping[str, Any]) -> None:
        """``set_attributes`` for attributes already clean (``clean_value``'s values under
        non-empty str keys, as the agent's own readers build them): no check per value.
        Ignored once the span has ended; past ``MAX_ATTRIBUTES`` new keys are dropped."""
        if self._end_time is not None:
            return
        own = self._attributes
        if len(own) + len(attributes) <= MAX_ATTRIBUTES:
            own.update(attributes)
            return
        for key, value in attributes.items():
            if key in own or len(own) < MAX_ATTRIBUTES:
                own[key] = value

    def w3c_trace_context(self) -> tuple[str, str | None]:
        """The ``traceparent`` and ``tracestate`` (None when empty) header values of
        this span, as the W3C propagator writes them."""
        context: Any = self._context
        if TUPLE_LAYOUT:
            trace_id, span_id, _remote, flags, state, _valid = context
        else:
            trace_id, span_id = context.trace_id, context.span_id
            flags, state = context.trace_flags, context.trace_state
        # printf-style: a third cheaper than the f-string's format specs (one per hop)
        traceparent = "00-%032x-%016x-%02x" % (trace_id, span_id, flags)  # noqa: UP031
        if state is DEFAULT_TRACE_STATE or not state:
            return traceparent, None
        return traceparent, state.to_header()

    def add_event(
        self,
        name: str,
        attributes: otel_types.Attributes = None,
        timestamp: int | None = None,
    ) -> None:
        if self._end_time is not None:
            return
        events = self._events
        if len(events) >= MAX_EVENTS:
            return
        clean = {}
        for key, value in (attributes or {}).items():
            cleaned = clean_value(value)
            if cleaned is not None:
                clean[key] = cleaned
        # A new tuple per event (events are rare; at most MAX_EVENTS): the span ends
        # without converting a list.
        self._events = (*events, Event(name, MappingProxyType(clean), timestamp or _time_ns()))
        self._plain = False

    def add_link(self, context: SpanContext, attributes: otel_types.Attributes = None) -> None:
        if self._end_time is not None or not context.is_valid:
            return
        self._links = (*self._links, trace_api.Link(context, attributes))
        self._plain = False

    def update_name(self, name: str) -> None:
        if self._end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end_time is not None:
            return
        new = status if isinstance(status, Status) else Status(status, description)
        # Same precedence as the SDK: OK is final, UNSET never overrides.
        if self._status.status_code is StatusCode.OK or new.status_code is StatusCode.UNSET:
            return
        self._status = new
        self._plain = False

    def record_exception(
        self,
        exception: BaseException,
        attributes: otel_types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        import traceback  # only on the error path

        stacktrace = "".join(
            traceback.format_exception(type(exception), exception, exception.__traceback__)
        )
        event_attributes: dict[str, Any] = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": stacktrace,
            "exception.escaped": str(escaped),
        }
        if attributes:
            event_attributes.update(attributes)
        self.add_event("exception", event_attributes, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end_time is not None:
            return
        self._end_time = end_time if end_time is not None else _time_ns()
        self._recorder.ended(self)

    def set_if_absent(self, key: str, value: Callable[[], Any], kind: SpanKind) -> None:
        """Set ``key`` to ``value()`` (when that is not empty; clean) if the span is
        recording, of ``kind`` and lacks ``key``; ``value`` is called only then."""
        attributes = self._attributes
        if (
            self._end_time is None
            and self._kind is kind
            and key not in attributes
            and len(attributes) < MAX_ATTRIBUTES
        ):
            found = value()
            if found:
                found = found if found.__class__ is str else clean_value(found)
                if found is not None:
                    attributes[key] = found

    def end_with(
        self, attributes: Mapping[str, Any] | None, name: str | None = None, error: bool = False
    ) -> None:
        """Add ``attributes`` (already clean: str, int, bool values), rename to ``name``
        (when given), set status ERROR (``error``), then ``end()``: what the wrappers do
        as a span ends, in one call. Does nothing once the span has ended."""
        if self._end_time is not None:
            return
        if attributes:
            self._attributes.update(attributes)
        if name is not None:
            self._name = name
        if error:
            self.set_status(_ERROR_STATUS)
        self._end_time = _time_ns()
        recorder = self._recorder
        direct = recorder.direct_end
        if direct is not None and recorder.processor._span_processors is recorder.seen_processors:
            direct(self)  # LeanRecorder.ended's usual case, one call less per span
        else:
            recorder.ended(self)


def new_span(  # noqa: PLR0917 - positional: a call with keywords costs more on this path
    name: str,
    context: SpanContext,
    parent: SpanContext | None,
    recorder: SpanOwner,
    attributes: dict[str, Any],
    kind: SpanKind,
) -> LeanSpan:
    """A new ``LeanSpan``, started now: the only way one is made (the recorder's spans
    and its self-check probes). A function rather than the class's ``__init__``: calling
    a class builds the arguments of its ``__init__`` (a dict for keywords) and runs it in
    a frame of its own, where this function's call is inlined by the interpreter (~1.4 k
    instructions less per span, callgrind; docs/benchmarks.md)."""
    span: LeanSpan = _new(LeanSpan)
    span._name = name
    span._context = context
    span._kind = kind
    span._parent = parent
    span._start_time = _time_ns()
    span._attributes = attributes
    span._recorder = recorder
    return span


_new = object.__new__
