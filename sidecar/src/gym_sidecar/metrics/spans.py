"""From OTLP trace requests to derived-metric points: the derive stage's hot path.

Two phases, so a request refused downstream (backpressure: the client will retry it)
is not counted twice:

1. :meth:`SpanDeriver.extract` reads the request and returns the :class:`Pending`
   points, touching no shared state;
2. :meth:`SpanDeriver.record` adds them to the store once the request was accepted.

The request is a trace request's wire view (:mod:`gym_sidecar.core.traces`). Only
ScopeSpans blocks whose scope is the rollout or the verify group's scope
(``semconv.scope_name``) are read span by span, from the fields the scanner extracted
for them (:data:`SCAN_SPEC`: each span's name, times, ids, status code and the values
of the three attributes read here); every other block costs one scope-name lookup. The
resource of a block that is read is identified by its serialized bytes as they now
stand (as received, or as enriched): those bytes are all a pending point keeps of it.

Per span:

- ``gym.rollout`` (rollout scope): duration in ms from start/end unix nanos. A span
  marked ``nemo.gym.rollout.nested=true`` (a ``/run`` relayed from inside another
  rollout, e.g. by ``legacy_agent``) is skipped and counted in ``nested``: each rollout
  gives one point, from its outermost span.
- ``gym.verify`` (verify scope): duration, and ``succeeded`` from the span's boolean
  attribute; without it (or when it is not a boolean), from the status (ERROR: False).
  A failed verification also carries ``error.type`` (the span's string attribute, else
  ``_OTHER``), truncated to ``max_error_type_chars``. A span holding one of these keys
  twice (the OpenTelemetry spec forbids it) is read by its last occurrence.
- ``gym.env.step`` (verify scope; a gymnasium-style ``/step``): the same as
  ``gym.verify``, into the ``gym.env.step.*`` series.
- Spans with another name in those scopes are ignored. Spans whose end precedes their
  start, or with no start, are counted in ``invalid_spans`` and skipped.
- With ``enabled_groups`` given, a block whose group is ``off`` for its resource (a
  stale agent still sending it) is not read: the derived metrics mean exactly what the
  span-group configuration says (docs/span-groups.md). The gate drops and counts it.

No other attribute (the rollout id in particular) becomes a dimension. The request is
never modified.

Exemplar ids (trace and span id) go with the spans that end up as a bucket's exemplar:
per block and series, the last span of each bucket (the series keeps the latest
exemplar per bucket).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from gym_sidecar.core.traces import AttrValue, DerivedSpan, ScanSpec, TraceRequest
from gym_sidecar.metrics.derived import NESTED_ROLLOUT_SPANS, DerivedMetrics
from gym_sidecar.metrics.series import OVERFLOW_ATTRS, VERIFY_OK_ATTRS, Attrs, HistogramTable

ERROR_TYPE_OTHER: Final = "_OTHER"
"""``error.type`` of a failed verification whose span names no error type (semconv's
fallback value)."""

_STATUS_ERROR: Final = Status.STATUS_CODE_ERROR
_NS_PER_MS: Final = 1_000_000.0

_ROLLOUT: Final = 1
_VERIFY: Final = 2

SCAN_SPEC: Final = ScanSpec(
    derive_scopes=frozenset(
        {semconv.scope_name(semconv.GROUP_ROLLOUT), semconv.scope_name(semconv.GROUP_VERIFY)}
    ),
    attr_keys=(semconv.ROLLOUT_NESTED, semconv.VERIFY_SUCCEEDED, semconv.ERROR_TYPE),
)
"""What the derive stage reads of a trace request beyond its index: the spans of the
rollout and verify scopes, with these three attributes (indexes below)."""
_NESTED: Final = 0
_SUCCEEDED: Final = 1
_ERROR_TYPE: Final = 2

EnabledGroups = Callable[[bytes], frozenset[str]]
"""The span groups not ``off`` for a serialized resource (the gate's policy answer for
its service)."""


PendingPoint = tuple[bytes, Attrs, float, int, bytes | None, bytes | None]
"""(resource key, attributes, value ms, end unix nanos, trace_id, span_id)."""


def _record_points(table: HistogramTable, points: list[PendingPoint]) -> None:
    """Record ``points`` into ``table`` (caller holds the store's lock).

    Points of one block share the same key objects: an identity test skips the series
    lookup (tuple hashing) for all but the first point of a run. Overflow series are
    never reused this way, so every overflowed point is counted.
    """
    bounds = table.bounds
    series = None
    last: tuple[bytes, Attrs] | None = None
    for key, attrs, value, end, trace_id, span_id in points:
        if series is None or last is None or key is not last[0] or attrs is not last[1]:
            series = table.get(key, attrs)
            last = None if series.attrs is OVERFLOW_ATTRS else (key, attrs)
        series.record(bounds, value, end, trace_id, span_id)


def _add_exemplar_ids(
    points: list[PendingPoint], candidates: Iterable[tuple[int, DerivedSpan]]
) -> None:
    """Give the points at these positions their span's trace and span id."""
    for pos, span in candidates:
        key, attrs, value, end, _, _ = points[pos]
        points[pos] = (key, attrs, value, end, span[3], span[4])


@dataclass(slots=True)
class Pending:
    """Points read from one request, not yet recorded."""

    rollouts: list[PendingPoint] = field(default_factory=list)
    verifications: list[PendingPoint] = field(default_factory=list)
    steps: list[PendingPoint] = field(default_factory=list)
    invalid: int = 0
    nested: int = 0


class SpanDeriver:
    """Reads rollout and verify spans from trace requests and records them in a store."""

    def __init__(self, store: DerivedMetrics, enabled_groups: EnabledGroups | None = None) -> None:
        self.store = store
        self._scopes: dict[str, int] = {
            semconv.scope_name(semconv.GROUP_ROLLOUT): _ROLLOUT,
            semconv.scope_name(semconv.GROUP_VERIFY): _VERIFY,
        }
        self._groups: Final = {_ROLLOUT: semconv.GROUP_ROLLOUT, _VERIFY: semconv.GROUP_VERIFY}
        self._enabled_groups = enabled_groups
        self._exemplars = store.cfg.exemplars
        self._max_error_chars = store.cfg.max_error_type_chars
        self._rollout_bounds = store.rollout.bounds
        self._verify_bounds = store.verify.bounds
        self._step_bounds = store.env_step.bounds

    def extract(self, request: TraceRequest) -> Pending | None:
        """The derivable points of ``request`` (None: it has no rollout/verify scope).

        Pure: reads ``request`` only. Safe from any thread.
        """
        scopes = self._scopes
        enabled_of = self._enabled_groups
        pending: Pending | None = None
        for block in request.blocks:
            resource_key: bytes | None = None
            enabled: frozenset[str] | None = None
            for scope in block.scopes:
                spans = scope.derived
                if spans is None:
                    continue  # not a scope the scan read (SCAN_SPEC)
                kind = scopes.get(scope.name)
                if kind is None:
                    continue
                if resource_key is None:
                    resource_key = block.current_resource
                if enabled_of is not None:
                    if enabled is None:
                        enabled = enabled_of(resource_key)
                    if self._groups[kind] not in enabled:
                        continue  # an off group: not derived (the gate drops it)
                if pending is None:
                    pending = Pending()
                if kind == _ROLLOUT:
                    self._rollouts(resource_key, spans, pending)
                else:
                    self._verifications(resource_key, spans, pending)
        return pending

    def _rollouts(self, resource_key: bytes, spans: Sequence[DerivedSpan], out: Pending) -> None:
        exemplars = self._exemplars
        bounds = self._rollout_bounds
        points = out.rollouts
        append = points.append
        # bucket -> (position in points, span): the exemplar candidates of this block
        last: dict[int, tuple[int, DerivedSpan]] = {}
        for span in spans:
            name, start, end, _, _, _, values = span
            if name != semconv.SPAN_ROLLOUT:
                continue
            if values[_NESTED] is True:
                out.nested += 1
                continue
            if start == 0 or end < start:
                out.invalid += 1
                continue
            value = (end - start) / _NS_PER_MS
            if exemplars:
                last[bisect_left(bounds, value)] = (len(points), span)
            append((resource_key, (), value, end, None, None))
        _add_exemplar_ids(points, last.values())

    def _verifications(
        self, resource_key: bytes, spans: Sequence[DerivedSpan], out: Pending
    ) -> None:
        exemplars = self._exemplars
        verifications = out.verifications
        steps = out.steps
        # (list, bucket, attrs) -> (position, span): exemplar candidates per series
        last: dict[tuple[int, int, Attrs], tuple[int, DerivedSpan]] = {}
        for span in spans:
            name, start, end, _, _, status, values = span
            if name == semconv.SPAN_VERIFY:
                points, bounds, which = verifications, self._verify_bounds, 0
            elif name == semconv.SPAN_ENV_STEP:
                points, bounds, which = steps, self._step_bounds, 1
            else:
                continue
            if start == 0 or end < start:
                out.invalid += 1
                continue
            value = (end - start) / _NS_PER_MS
            succeeded = values[_SUCCEEDED]
            # Inline the common case (succeeded); a failure's attributes are built apart.
            if succeeded is True or (succeeded is not False and status != _STATUS_ERROR):
                attrs = VERIFY_OK_ATTRS
            else:
                attrs = self._failed_attrs(values)
            if exemplars:
                last[(which, bisect_left(bounds, value), attrs)] = (len(points), span)
            points.append((resource_key, attrs, value, end, None, None))
        if last:
            for (which, _, _), candidate in last.items():
                _add_exemplar_ids(steps if which else verifications, (candidate,))

    def _failed_attrs(self, values: tuple[AttrValue, ...]) -> Attrs:
        """The attributes of a failed verification: its ``error.type`` (a string
        attribute, truncated; else ``_OTHER``) and ``succeeded=False``."""
        error_type = values[_ERROR_TYPE]
        if not isinstance(error_type, str):
            error_type = ""
        return (
            (semconv.ERROR_TYPE, error_type[: self._max_error_chars] or ERROR_TYPE_OTHER),
            (semconv.VERIFY_SUCCEEDED, False),
        )

    def record(self, pending: Pending) -> None:
        """Add ``pending`` to the store (takes its lock; call on the event loop)."""
        store = self.store
        # Points of one block share the same key objects: an identity test skips the
        # series lookup (tuple hashing) for all but the first point of a run. Overflow
        # series are never reused this way, so every overflowed point is counted.
        with store.lock:
            store.invalid_spans += pending.invalid
            if pending.rollouts:
                _record_points(store.rollout, pending.rollouts)
                store.spans[semconv.SPAN_ROLLOUT] += len(pending.rollouts)
            if pending.verifications:
                table = store.verify
                bounds = table.bounds
                rates = store.rates
                series = None
                last: tuple[bytes, Attrs] | None = None
                window = None
                window_key: bytes | None = None
                for key, attrs, value, end, trace_id, span_id in pending.verifications:
                    if (
                        series is None
                        or last is None
                        or key is not last[0]
                        or (attrs is not last[1])
                    ):
                        series = table.get(key, attrs)
                        last = None if series.attrs is OVERFLOW_ATTRS else (key, attrs)
                    if window is None or key is not window_key:
                        window = rates.get(key)
                        window_key = None if window.attrs is OVERFLOW_ATTRS else key
                    series.record(bounds, value, end, trace_id, span_id)
                    window.total += 1
                    if attrs is VERIFY_OK_ATTRS:
                        window.ok += 1
                store.spans[semconv.SPAN_VERIFY] += len(pending.verifications)
            if pending.steps:
                _record_points(store.env_step, pending.steps)
                store.spans[semconv.SPAN_ENV_STEP] += len(pending.steps)
            if pending.nested:
                store.spans[NESTED_ROLLOUT_SPANS] += pending.nested
