"""How the endpoint wrappers record a span: a lean path over the SDK's own pipeline.

(The span itself is ``span.LeanSpan``; this module chooses and runs the recorders.)

A stock SDK span (``Tracer.start_span`` + ``end``) spends most of its time on generality
the wrappers do not need: it copies and re-validates every attribute through
``BoundedAttributes`` (with a lock per write), builds a second ``ReadableSpan`` copy at
``end``, and runs the span-start and span-ending hooks of every processor.

``LeanRecorder`` records the same span through the same SDK objects (the provider's
sampler, id generator, resource, span processors and so the same batch queue and
exporter) with less work:

- attributes are validated once at wrap time; the span holds a plain dict;
- the span *is* a ``ReadableSpan`` and is handed to ``on_end`` as is (it ignores
  writes after ``end``), instead of being copied;
- processors whose ``on_start`` / ``_on_ending`` are known no-ops (the SDK's batch and
  simple processors, this package's processor) are not called for them;
- with the SDK's default sampler (parent-based, always-on root) the decision is taken
  inline; any other sampler is asked through ``should_sample`` as the SDK would.

``start`` takes a span kind and an explicit parent context too: the SERVER span layer
(``autoinstrument.server_span``) records its span of kind SERVER, child of the caller's
remote parent, through the same path.

The span it makes current is a full ``opentelemetry.trace.Span``: handler code may call
``trace.get_current_span().set_attribute(...)``, ``add_event``, ``record_exception``,
``set_status``; children started by any tracer parent on it.

The lean path is used only when the group's tracer is an SDK ``Tracer`` whose layout
passed a one-time self-check; otherwise (no SDK, an unusual SDK version, a foreign
tracer) ``SdkRecorder`` goes through ``tracer.start_span`` unchanged.
``GYM_TELEMETRY_RECORDER=sdk`` forces the SDK path.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any, Final

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from gym_telemetry import environment_variables as env_vars
from gym_telemetry._lean.context import TUPLE_LAYOUT
from gym_telemetry._lean.context import attach as _attach
from gym_telemetry._lean.context import get_current as _get_current
from gym_telemetry._lean.context import with_span as _with_span
from gym_telemetry._lean.sdk_hooks import SPAN_KEY
from gym_telemetry._lean.span import MAX_ATTRIBUTES, LeanSpan, new_span

_log = logging.getLogger(__name__)

_getrandbits = random.getrandbits
_SDK_IS_ENABLED: Final = getattr(sdk_trace.Tracer, "_is_enabled", None)
_tuple_new = tuple.__new__
_dict_setitem = dict.__setitem__
_Context = context_api.Context
_ROOT: Final = context_api.Context()
_INTERNAL: Final = SpanKind.INTERNAL
_RANDOM_BIT: Final = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))
_FLAGS_SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
_FLAGS_SAMPLED_RANDOM: Final = TraceFlags(TraceFlags.SAMPLED | _RANDOM_BIT)
# What the SDK gives a span without a parent's state (SpanContext's default).
_EMPTY_STATE: Final = DEFAULT_TRACE_STATE

# Processors whose on_start / _on_ending do nothing: the lean path skips calling them.
# A processor class of this package says so itself with ``quiet_span_hooks = True``
# (``_export.processor.GymSpanProcessor``), so this package imports nothing above it.
_QUIET_PROCESSORS: Final = (BatchSpanProcessor, SimpleSpanProcessor)


def _is_quiet(processor: object) -> bool:
    return isinstance(processor, _QUIET_PROCESSORS) or (
        getattr(type(processor), "quiet_span_hooks", False) is True
    )


class SdkRecorder:
    """Records through ``tracer.start_span`` (any OpenTelemetry tracer)."""

    lean = False

    def __init__(self, tracer: trace_api.Tracer, provisional: bool = False) -> None:
        self.tracer = tracer
        #: True while the tracer is a proxy with no SDK behind it yet: resolve again.
        self.provisional = provisional

    def start(
        self,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind = _INTERNAL,
        context: context_api.Context | None = None,
    ) -> tuple[trace_api.Span, object]:
        span = self.tracer.start_span(name, context=context, kind=kind, attributes=attributes)
        token = _attach(trace_api.set_span_in_context(span, context))
        return span, token

    def start_under(
        self,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind,
        parent: SpanContext | None,
    ) -> tuple[trace_api.Span, object]:
        """``start`` under an explicit remote ``parent`` (None: a new trace)."""
        return self.start(name, attributes, kind, _parent_context(parent))


class LeanRecorder:
    """Records spans for one SDK tracer (one span group) the lean way."""

    lean = True
    provisional = False

    def __init__(self, tracer: sdk_trace.Tracer) -> None:
        self.tracer = tracer
        self.sampler = tracer.sampler
        self.default_sampler = _is_default_sampler(tracer.sampler)
        self.id_generator = tracer.id_generator
        self.random_ids = bool(getattr(self.id_generator, "is_trace_id_random", lambda: False)())
        self.resource: Resource = tracer.resource
        self.instrumentation_info = getattr(tracer, "instrumentation_info", None)
        self.instrumentation_scope = tracer._instrumentation_scope
        self.processor = tracer.span_processor
        self.seen_processors: object = None
        self._quiet = False
        #: The only processor's ``on_end_lean`` (``_export.processor.GymSpanProcessor``)
        #: when it is the only one: ``ended`` calls it directly.
        self.direct_end: Any = None
        self.max_attributes = MAX_ATTRIBUTES
        #: The span record's registry prefix of this (resource, scope) pair, set by the
        #: encoder on first use (``span_encoding.encode_lean_record``).
        self.record_head: bytes | None = None
        # The common case in one straight path (``start`` / ``start_under``): the SDK's
        # default sampler, processors without start hooks, a tracer that can be disabled
        # only through ``_is_enabled``, and span contexts readable as tuples.
        self._is_enabled = getattr(tracer, "_is_enabled", None)
        # The SDK's own _is_enabled reads ``_tracer_config.is_enabled``: read it directly
        # (the config object may be replaced, so it is read through the tracer each time).
        self._config_read = (
            _SDK_IS_ENABLED is not None
            and type(tracer).__dict__.get("_is_enabled") is _SDK_IS_ENABLED
            and (
                isinstance(
                    getattr(getattr(tracer, "_tracer_config", None), "is_enabled", None), bool
                )
            )
        )
        self.fast = (
            self.default_sampler
            and TUPLE_LAYOUT
            and issubclass(_Context, dict)
            and hasattr(self.processor, "_span_processors")
            and callable(getattr(self.id_generator, "generate_span_id", None))
        )
        # RandomIdGenerator draws from ``random.getrandbits`` until the id is not 0; one
        # draw is inlined (a 0 goes back to the generator).
        self._own_random = type(self.id_generator) is RandomIdGenerator
        self._root_flags = _FLAGS_SAMPLED_RANDOM if self.random_ids else _FLAGS_SAMPLED

    def _processors_quiet(self) -> bool:
        processors = getattr(self.processor, "_span_processors", None)
        if processors is None:
            return False
        if processors is not self.seen_processors:
            self._quiet = all(_is_quiet(p) for p in processors)
            direct = None
            if self._quiet and self.fast and len(processors) == 1:
                direct = getattr(processors[0], "on_end_lean", None)
            self.direct_end = direct if callable(direct) else None
            self.seen_processors = processors
        return self._quiet

    def start(
        self,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind = _INTERNAL,
        context: context_api.Context | None = None,
    ) -> tuple[trace_api.Span, object]:
        """Start a span of ``kind`` with ``attributes`` (already clean; owned by the span
        from now on) as a child of the span in ``context`` (default: the current
        context), make it current and return it with the context token."""
        if not self.fast or context is not None:
            return self._start(name, attributes, kind, context)
        if self._config_read:
            if not self.tracer._tracer_config.is_enabled:
                return SdkRecorder(self.tracer).start(name, attributes, kind, context)
        elif self._is_enabled is not None and not self._is_enabled():
            return SdkRecorder(self.tracer).start(name, attributes, kind, context)
        ctx = _get_current()
        parent_span: Any = ctx.get(SPAN_KEY)
        parent: Any = None
        if parent_span is not None:
            parent = (
                parent_span._context
                if type(parent_span) is LeanSpan
                else parent_span.get_span_context()
            )
            trace_id, _span_id, _remote, flags, trace_state, valid = parent
            if not valid:
                parent = None
            elif not flags & 1:  # unsampled parent: the general path
                return self._start(name, attributes, kind, ctx)
        span_id = _getrandbits(64) if self._own_random else 0
        if not span_id:
            span_id = self.id_generator.generate_span_id()
        if parent is None:
            trace_id = _getrandbits(128) if self._own_random else 0
            if not trace_id:
                trace_id = self.id_generator.generate_trace_id()
            # A SpanContext as SpanContext.__new__ builds a valid one (context.TUPLE_LAYOUT)
            span_context = _tuple_new(
                SpanContext, (trace_id, span_id, False, self._root_flags, _EMPTY_STATE, True)
            )
        else:
            span_context = _tuple_new(
                SpanContext,
                (
                    trace_id,
                    span_id,
                    False,
                    _FLAGS_SAMPLED_RANDOM if flags & _RANDOM_BIT else _FLAGS_SAMPLED,
                    trace_state,
                    True,
                ),
            )
        lean = new_span(name, span_context, parent, self, attributes, kind)
        if self.processor._span_processors is not self.seen_processors:
            self._processors_quiet()
        if not self._quiet:
            self.processor.on_start(lean, parent_context=ctx)  # type: ignore[arg-type]
        new = _Context(ctx)
        _dict_setitem(new, SPAN_KEY, lean)
        return lean, _attach(new)

    def start_under(
        self,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind,
        parent: SpanContext | None,
    ) -> tuple[trace_api.Span, object]:
        """``start`` under an explicit ``parent`` (a remote caller's span context; None:
        a new trace), whatever the current context holds. The span's context is then
        the only value of the context made current, as when the parent comes from an
        extracted context (``propagation.extract_parent``)."""
        if not self.fast:
            return self._start(name, attributes, kind, _parent_context(parent))
        if self._config_read:
            if not self.tracer._tracer_config.is_enabled:
                return SdkRecorder(self.tracer).start(
                    name, attributes, kind, _parent_context(parent)
                )
        elif self._is_enabled is not None and not self._is_enabled():
            return SdkRecorder(self.tracer).start(name, attributes, kind, _parent_context(parent))
        span_id = _getrandbits(64) if self._own_random else 0
        if not span_id:
            span_id = self.id_generator.generate_span_id()
        if parent is None:
            trace_id = _getrandbits(128) if self._own_random else 0
            if not trace_id:
                trace_id = self.id_generator.generate_trace_id()
            span_context = _tuple_new(
                SpanContext, (trace_id, span_id, False, self._root_flags, _EMPTY_STATE, True)
            )
        else:
            trace_id, _span_id, _remote, flags, trace_state, valid = parent
            if not valid or not flags & 1:  # invalid or unsampled: the general path
                return self._start(name, attributes, kind, _parent_context(parent))
            span_context = _tuple_new(
                SpanContext,
                (
                    trace_id,
                    span_id,
                    False,
                    _FLAGS_SAMPLED_RANDOM if flags & _RANDOM_BIT else _FLAGS_SAMPLED,
                    trace_state,
                    True,
                ),
            )
        lean = new_span(name, span_context, parent, self, attributes, kind)
        if self.processor._span_processors is not self.seen_processors:
            self._processors_quiet()
        if not self._quiet:
            self.processor.on_start(lean, parent_context=_parent_context(parent))  # type: ignore[arg-type]
        return lean, _attach(_Context({SPAN_KEY: lean}))

    def _start(
        self,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind,
        context: context_api.Context | None,
    ) -> tuple[trace_api.Span, object]:
        """The general path: any sampler, processors with start hooks."""
        is_enabled = getattr(self.tracer, "_is_enabled", None)
        if is_enabled is not None and not is_enabled():
            return SdkRecorder(self.tracer).start(name, attributes, kind, context)
        ctx = _get_current() if context is None else context
        parent_span: trace_api.Span | None = ctx.get(SPAN_KEY)  # type: ignore[assignment]
        parent = parent_span.get_span_context() if parent_span is not None else None
        if parent is not None and parent.is_valid:
            trace_id = parent.trace_id
            parent_random = int(parent.trace_flags) & _RANDOM_BIT
            sampled = parent.trace_flags.sampled
            trace_state = parent.trace_state
        else:
            parent = None
            trace_id = self.id_generator.generate_trace_id()
            parent_random = _RANDOM_BIT if self.random_ids else 0
            sampled = True
            trace_state = _EMPTY_STATE
        if not self.default_sampler:
            result = self.sampler.should_sample(ctx, trace_id, name, kind, attributes, ())
            sampled = result.decision.is_sampled()  # type: ignore[no-untyped-call]
            if not result.decision.is_recording():  # type: ignore[no-untyped-call]
                sampled = False
            elif result.attributes:
                attributes.update(result.attributes)
            trace_state = result.trace_state or trace_state
        if not sampled:
            flags = TraceFlags(parent_random)
            span_context = SpanContext(
                trace_id, self.id_generator.generate_span_id(), False, flags, trace_state
            )
            span: trace_api.Span = trace_api.NonRecordingSpan(span_context)
            return span, _attach(_with_span(span, ctx))
        flags = _FLAGS_SAMPLED_RANDOM if parent_random else _FLAGS_SAMPLED
        span_context = SpanContext(
            trace_id, self.id_generator.generate_span_id(), False, flags, trace_state
        )
        lean = new_span(name, span_context, parent, self, attributes, kind)
        if not self._processors_quiet():
            self.processor.on_start(lean, parent_context=ctx)  # type: ignore[arg-type]
        return lean, _attach(_with_span(lean, ctx))

    def ended(self, span: LeanSpan) -> None:
        """Hand an ended span to the processors (only sampled spans are ``LeanSpan``s).
        ``direct_end`` (the only processor's ``on_end_lean``) while the processors are
        still ``seen_processors``: a span checks that and calls it itself."""
        processor = self.processor
        if (
            self.direct_end is not None
            and getattr(processor, "_span_processors", None) is self.seen_processors
        ):
            self.direct_end(span)
            return
        if not self._processors_quiet():
            on_ending = getattr(processor, "_on_ending", None)
            if on_ending is not None:
                on_ending(span)
        processor.on_end(span)


def _parent_context(parent: SpanContext | None) -> context_api.Context:
    """The context ``start_under`` stands for: the remote parent alone, or nothing."""
    if parent is None:
        return _ROOT
    return _with_span(trace_api.NonRecordingSpan(parent), _ROOT)


def _is_default_sampler(sampler: Any) -> bool:
    """True for ParentBased(ALWAYS_ON) with the default delegates (the SDK default)."""
    if not isinstance(sampler, sampling.ParentBased):
        return False
    root = getattr(sampler, "_root", None)
    delegates = (
        getattr(sampler, "_remote_parent_sampled", None),
        getattr(sampler, "_remote_parent_not_sampled", None),
        getattr(sampler, "_local_parent_sampled", None),
        getattr(sampler, "_local_parent_not_sampled", None),
    )
    return root is sampling.ALWAYS_ON and delegates == (
        sampling.ALWAYS_ON,
        sampling.ALWAYS_OFF,
        sampling.ALWAYS_ON,
        sampling.ALWAYS_OFF,
    )


def _layout_ok(recorder: LeanRecorder) -> bool:
    """One-time check that a LeanSpan reads, through the SDK's own public accessors and
    encoder, exactly like an SDK span with the same content; False on any difference or
    surprise (the SDK path is then used). This is what keeps a new SDK release whose
    ``ReadableSpan`` internals changed from silently breaking export."""
    try:
        reference = set(vars(ReadableSpan("probe", resource=recorder.resource)))
        parent = SpanContext(3, 4, True, _FLAGS_SAMPLED, _EMPTY_STATE)
        probe_context = SpanContext(3, 5, False, _FLAGS_SAMPLED, _EMPTY_STATE)
        # Made as the recorder makes its spans (``new_span``), so this checks that path.
        probe = new_span(
            "probe", probe_context, parent, recorder, {"k": "v", "n": 1}, SpanKind.SERVER
        )
        missing = {field for field in reference if not hasattr(probe, field)}
        if missing:
            _log.info("gym_telemetry: SDK span layout changed (%s); using the SDK path", missing)
            return False
        # The same span through the SDK's own path: a throwaway provider with the same
        # resource and fixed ids, its tracer's scope shared with the lean probe.
        # (Sampler given: OTEL_TRACES_SAMPLER must not turn the probe into a no-op.)
        provider = sdk_trace.TracerProvider(
            sampler=sampling.ALWAYS_ON,
            resource=recorder.resource,
            id_generator=_FixedIds(3, 5),
            shutdown_on_exit=False,
        )
        tracer = provider.get_tracer("gym_telemetry.self_check")
        if not isinstance(tracer, sdk_trace.Tracer):
            return False
        probe = new_span(
            "probe",
            probe_context,
            parent,
            LeanRecorder(tracer),
            {"k": "v", "n": 1},
            SpanKind.SERVER,
        )
        stock = tracer.start_span(
            "probe",
            context=trace_api.set_span_in_context(trace_api.NonRecordingSpan(parent)),
            kind=SpanKind.SERVER,
            attributes={"k": "v", "n": 1},
            start_time=1_000,
        )
        if not isinstance(stock, ReadableSpan):
            return False
        probe._start_time = 1_000
        for span in (probe, stock):
            span.set_attribute("late", True)
            span.add_event("e", {"x": 1.5}, timestamp=1_500)
            span.set_status(Status(StatusCode.ERROR, "probe"))
        probe._end_time = 2_000  # not end(): the probe must not reach the processors
        stock.end(end_time=2_000)
        if _public_view(probe) != _public_view(stock) or probe.to_json() != stock.to_json():
            _log.info("gym_telemetry: lean span reads differently here; using the SDK path")
            return False
        if not _encodes_alike(probe, stock):
            _log.info("gym_telemetry: lean span encodes differently here; using the SDK path")
            return False
        return True
    except Exception as exc:  # any surprise: use the SDK's own path
        _log.info("gym_telemetry: lean span self-check failed (%r); using the SDK path", exc)
        return False


class _FixedIds(IdGenerator):
    """Ids for the self-check's SDK span (the same as the lean probe's)."""

    def __init__(self, trace_id: int, span_id: int) -> None:
        self.trace_id, self.span_id = trace_id, span_id

    def generate_trace_id(self) -> int:
        return self.trace_id

    def generate_span_id(self) -> int:
        return self.span_id


def _public_view(span: ReadableSpan) -> tuple[Any, ...]:
    """What exporters read from a finished span, through the SDK's public accessors."""
    return (
        span.name,
        span.context,
        span.kind,
        span.parent,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        [(e.name, dict(e.attributes or {}), e.timestamp) for e in span.events],
        list(span.links),
        (span.status.status_code, span.status.description),
        span.resource,
        span.instrumentation_scope,
        span.dropped_attributes,
        span.dropped_events,
        span.dropped_links,
    )


def _encodes_alike(lean: ReadableSpan, stock: ReadableSpan) -> bool:
    """Whether the OTLP exporters' stock encoder gives the same message for both (True
    when that encoder is not installed: nothing else exports them then)."""
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    except ImportError:
        return True
    return bool(encode_spans([lean]) == encode_spans([stock]))


_layout_checked: dict[str, bool] = {}


def recorder_for(tracer: trace_api.Tracer) -> LeanRecorder | SdkRecorder:
    """The recorder for ``tracer`` (lean when possible)."""
    real = tracer
    if isinstance(real, trace_api.ProxyTracer):
        inner = getattr(real, "_real_tracer", None)
        if inner is None:
            return SdkRecorder(tracer, provisional=True)  # no provider yet: resolve again
        real = inner
    if os.environ.get(env_vars.GYM_TELEMETRY_RECORDER, "").strip().lower() == "sdk":
        return SdkRecorder(real)
    if not isinstance(real, sdk_trace.Tracer):
        return SdkRecorder(real)
    try:
        recorder = LeanRecorder(real)
    except Exception as exc:  # an SDK without the attributes we read
        _log.info("gym_telemetry: lean recorder unavailable (%r); using the SDK path", exc)
        return SdkRecorder(real)
    ok = _layout_checked.get("ok")
    if ok is None:
        ok = _layout_checked["ok"] = _layout_ok(recorder)
    return recorder if ok else SdkRecorder(real)
