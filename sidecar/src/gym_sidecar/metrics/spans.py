"""From OTLP trace requests to derived-metric points: the derive stage's hot path.

Only ScopeSpans blocks whose scope is the rollout or the verify group's scope
(``semconv.scope_name``) are walked span by span; every other block costs one scope-name
lookup. The resource of a block that is walked is identified by its serialized bytes
(one serialization per ResourceSpans, and only if it holds such a block).

Per span:

- ``gym.rollout`` (rollout scope): duration in ms from start/end unix nanos.
- ``gym.verify`` (verify scope): duration, and ``succeeded`` from the span's boolean
  attribute; without it, from the status (ERROR: False). A failed verification also
  carries ``error.type`` (the span's attribute, else ``_OTHER``), truncated to
  ``max_error_type_chars``.
- Spans with another name in those scopes are ignored. Spans whose end precedes their
  start, or with no start, are counted in ``invalid_spans`` and skipped.

No other attribute (the rollout id in particular) becomes a dimension. The request is
never modified.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from gym_telemetry import semconv
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from gym_sidecar.metrics.series import VERIFY_OK_ATTRS, Attrs
from gym_sidecar.metrics.store import DerivedMetrics

ERROR_TYPE_OTHER: Final = "_OTHER"
"""``error.type`` of a failed verification whose span names no error type (semconv's
fallback value)."""

_STATUS_ERROR: Final = Status.STATUS_CODE_ERROR
_NS_PER_MS: Final = 1_000_000.0

_ROLLOUT: Final = 1
_VERIFY: Final = 2


class SpanDeriver:
    """Records the rollout and verify spans of trace requests into a store."""

    def __init__(self, store: DerivedMetrics) -> None:
        self.store = store
        self._scopes: dict[str, int] = {
            semconv.scope_name(semconv.GROUP_ROLLOUT): _ROLLOUT,
            semconv.scope_name(semconv.GROUP_VERIFY): _VERIFY,
        }
        self._exemplars = store.cfg.exemplars
        self._max_error_chars = store.cfg.max_error_type_chars

    def derive(self, request: ExportTraceServiceRequest) -> int:
        """Record every derivable span of ``request``; return how many were recorded."""
        scopes = self._scopes
        recorded = 0
        for rs in request.resource_spans:
            resource: Resource | None = None
            resource_key = b""
            for ss in rs.scope_spans:
                kind = scopes.get(ss.scope.name)
                if kind is None:
                    continue
                if resource is None:
                    resource = rs.resource
                    resource_key = resource.SerializeToString()
                if kind == _ROLLOUT:
                    recorded += self._rollouts(resource_key, resource, ss.spans)
                else:
                    recorded += self._verifications(resource_key, resource, ss.spans)
        return recorded

    def _rollouts(self, resource_key: bytes, resource: Resource, spans: Iterable[Span]) -> int:
        store = self.store
        table = store.rollout
        bounds = table.bounds
        series = None
        n = 0
        with store.lock:
            for span in spans:
                if span.name != semconv.SPAN_ROLLOUT:
                    continue
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                if start == 0 or end < start:
                    store.invalid_spans += 1
                    continue
                if series is None:
                    series = table.get(resource_key, (), resource)
                if self._exemplars and span.trace_id and span.span_id:
                    series.record(
                        bounds, (end - start) / _NS_PER_MS, end, span.trace_id, span.span_id
                    )
                else:
                    series.record(bounds, (end - start) / _NS_PER_MS, end, None, None)
                n += 1
            store.spans[semconv.SPAN_ROLLOUT] += n
        return n

    def _verifications(self, resource_key: bytes, resource: Resource, spans: Iterable[Span]) -> int:
        store = self.store
        table = store.verify
        bounds = table.bounds
        window = None
        n = 0
        with store.lock:
            for span in spans:
                if span.name != semconv.SPAN_VERIFY:
                    continue
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                if start == 0 or end < start:
                    store.invalid_spans += 1
                    continue
                attrs = self._verify_attrs(span)
                series = table.get(resource_key, attrs, resource)
                if self._exemplars and span.trace_id and span.span_id:
                    series.record(
                        bounds, (end - start) / _NS_PER_MS, end, span.trace_id, span.span_id
                    )
                else:
                    series.record(bounds, (end - start) / _NS_PER_MS, end, None, None)
                if window is None:
                    window = store.rates.get(resource_key, resource)
                window.total += 1
                if attrs is VERIFY_OK_ATTRS:
                    window.ok += 1
                n += 1
            store.spans[semconv.SPAN_VERIFY] += n
        return n

    def _verify_attrs(self, span: Span) -> Attrs:
        succeeded: bool | None = None
        error_type = ""
        for kv in span.attributes:
            key = kv.key
            if key == semconv.VERIFY_SUCCEEDED:
                if kv.value.WhichOneof("value") == "bool_value":
                    succeeded = kv.value.bool_value
            elif key == semconv.ERROR_TYPE:
                error_type = kv.value.string_value
        if succeeded is None:
            succeeded = span.status.code != _STATUS_ERROR
        if succeeded:
            return VERIFY_OK_ATTRS
        return (
            (semconv.ERROR_TYPE, error_type[: self._max_error_chars] or ERROR_TYPE_OTHER),
            (semconv.VERIFY_SUCCEEDED, False),
        )
