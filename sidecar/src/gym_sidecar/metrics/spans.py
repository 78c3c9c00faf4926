"""From OTLP trace requests to derived-metric points: the derive stage's hot path.

Two phases, so a request refused downstream (backpressure: the client will retry it)
is not counted twice:

1. :meth:`SpanDeriver.extract` reads the request and returns the :class:`Pending`
   points, touching no shared state;
2. :meth:`SpanDeriver.record` adds them to the store once the request was accepted.

The request is a trace request's wire view (:mod:`gym_sidecar.core.traces`). Only
ScopeSpans blocks whose scope the stage derives from (``core.producers.DERIVE_SCOPES``:
the agent's rollout, verify, ``model_call`` and ``http_client`` scopes, and the one
scope of Gym's own telemetry, ``nemo.lens.helpers``) are read span by span, from the
fields the scanner extracted for them (:data:`SCAN_SPEC`, ``metrics.fields``: each
span's name, times, ids, status code, the values of the attributes read and the
``exception.type`` of its exception event); every other block costs one scope-name
lookup. The resource of a block that is
read is identified by its serialized bytes as they now stand (as received, or as
enriched): those bytes are all a pending point keeps of it.

Per span (the producers' dialects are told apart by ``core.producers``):

- ``gym.rollout``: duration in ms from start/end unix nanos. A span marked
  ``nemo.gym.rollout.nested=true`` (the agent marks a ``/run`` relayed from inside
  another recorded rollout, e.g. by ``legacy_agent``) is skipped and counted in
  ``nested``: each rollout gives one point, from its outermost span. Gym's own telemetry
  writes no such marker and wraps only an agent's ``/run`` (never a relay's), so each of
  its ``gym.rollout`` spans is a point (docs/nemo-gym.md, "Which rollout is the
  outermost").
- ``gym.verify``: duration, and ``succeeded`` from the span's boolean attribute; without
  it (or when it is not a boolean: Gym's own telemetry never writes it), from the status
  (ERROR: False). A failed verification also carries ``error.type``: the span's string
  attribute, else the class name in its last exception event's ``exception.type`` (how
  Gym's own telemetry records a verifier that raised; the module path is dropped, as the
  agent writes the bare class name), else ``_OTHER``; truncated to
  ``max_error_type_chars``. A span holding one of these keys twice (the OpenTelemetry
  spec forbids it) is read by its last occurrence.
- ``gym.env.step`` (a gymnasium-style ``/step``): the same as ``gym.verify``, into the
  ``gym.env.step.*`` series.
- Other spans in those scopes are ignored (the agent's rollout scope is read for
  ``gym.rollout`` only, its verify scope for the other two; Gym's scope for all three).
  Spans whose end precedes their start, or with no start, are counted in
  ``invalid_spans`` and skipped.
- With ``enabled_groups`` given, spans of a group that is ``off`` for their resource (a
  stale agent still sending it) are not read: the derived metrics mean exactly what the
  span-group configuration says (docs/span-groups.md). The gate drops and counts them.

The RL view's points (issue 41: rewards, turns, tokens, model calls, retried and failed
hops) are read in the same pass over each block by :mod:`gym_sidecar.metrics.rl` and
kept in :attr:`Pending.rl`: from the rollout and verify scopes as above, from the agent's
``model_call`` scope and Gym's scope (model calls), and from the agent's ``http_client``
scope, whose blocks the scan reports sparsely (only its retried or failed hops).

No other attribute (the rollout id in particular) becomes a dimension. The request is
never modified.

Rollout ends: with ``rollout_ends`` on, each outermost ``gym.rollout`` span (valid or not)
is also kept in :attr:`Pending.ended` as a :class:`~gym_sidecar.core.rollout_end.RolloutEnd`
(its resource and ids): this is where the sidecar decides "this span is the end of a
rollout, and whose", and the derive stage hands those ends to the live tracker once the
request is accepted, so the spans are not walked twice.

Points are kept per ScopeSpans block and series (``series.SeriesPoints``: values in
span order, counts per bucket, and each bucket's last span, whose trace and span id
become the bucket's exemplar), so recording looks each series up once per block, and a
bucket's exemplar is read from one span per block. ``record`` leaves the store as
adding one point at a time in span order would (``tests/sidecar/metrics/
test_record_model.py`` holds it to such a model).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from gym_sidecar.core import producers
from gym_sidecar.core.rollout_end import RolloutEnd
from gym_sidecar.core.traces import AttrValue, DerivedSpan, TraceRequest
from gym_sidecar.metrics import fields
from gym_sidecar.metrics.derived import (
    HOP_SPANS,
    MODEL_CALL_SPANS,
    NESTED_ROLLOUT_SPANS,
    DerivedMetrics,
)
from gym_sidecar.metrics.rl import RlExtractor, RlPending
from gym_sidecar.metrics.series import (
    NS_PER_MS,
    OVERFLOW_ATTRS,
    OVERFLOW_RESOURCE,
    VERIFY_OK_ATTRS,
    Attrs,
    HistogramSeries,
    HistogramTable,
    RateTable,
    SeriesPoints,
    exemplar_of,
)

ERROR_TYPE_OTHER: Final = "_OTHER"
"""``error.type`` of a failed verification whose span names no error type (semconv's
fallback value)."""

_STATUS_ERROR: Final = Status.STATUS_CODE_ERROR

_ROLLOUT: Final = 1
_VERIFY: Final = 2
_BOTH: Final = 3
"""A scope that carries rollouts and verifications alike (Gym's own telemetry)."""

SCAN_SPEC: Final = fields.SCAN_SPEC
"""What the derive stage reads of a trace request (``metrics.fields``)."""
_NESTED: Final = fields.NESTED
_SUCCEEDED: Final = fields.SUCCEEDED
_ERROR_TYPE: Final = fields.ERROR_TYPE
_EXCEPTION_TYPE: Final = fields.EXCEPTION_TYPE
_MODEL: Final = 4
"""The agent's ``model_call`` scope: model calls only (``metrics.rl``)."""
_HOPS: Final = 5
"""The agent's ``http_client`` scope, read sparsely: retried and failed hops."""
_GROUP_OF_KIND: Final = {_MODEL: semconv.GROUP_MODEL_CALL, _HOPS: semconv.GROUP_HTTP_CLIENT}


def _scope_kinds() -> dict[str, int]:
    """Scope name -> which loops read its blocks (from ``core.producers``)."""
    kinds: dict[str, int] = {}
    for name in producers.DERIVE_SCOPES:
        role = producers.scope_role(name)
        if role.by_name:
            kinds[name] = _BOTH
        elif role.group == semconv.GROUP_ROLLOUT:
            kinds[name] = _ROLLOUT
        elif role.group == semconv.GROUP_VERIFY:
            kinds[name] = _VERIFY
        elif role.group == semconv.GROUP_MODEL_CALL:
            kinds[name] = _MODEL
        elif role.group == semconv.GROUP_HTTP_CLIENT:
            kinds[name] = _HOPS
    return kinds


EnabledGroups = Callable[[bytes], frozenset[str]]
"""The span groups not ``off`` for a serialized resource (the gate's policy answer for
its service)."""


@dataclass(slots=True)
class Pending:
    """Points read from one request, not yet recorded: per histogram, one
    :class:`SeriesPoints` per ScopeSpans block and series, in the order their first
    points came (the order their series are created in)."""

    rollouts: list[SeriesPoints] = field(default_factory=list)
    verifications: list[SeriesPoints] = field(default_factory=list)
    steps: list[SeriesPoints] = field(default_factory=list)
    invalid: int = 0
    nested: int = 0
    rl: RlPending | None = None
    """The RL view's points (``metrics.rl``), once a span gave one."""
    ended: list[RolloutEnd] = field(default_factory=list)
    """The outermost rollout spans read (with ``rollout_ends`` on), in span order."""


class SpanDeriver:
    """Reads rollout and verify spans from trace requests and records them in a store."""

    def __init__(
        self,
        store: DerivedMetrics,
        enabled_groups: EnabledGroups | None = None,
        rollout_ends: bool = False,
    ) -> None:
        self.store = store
        self._rollout_ends = rollout_ends
        self._scopes = _scope_kinds()
        self._enabled_groups = enabled_groups
        self._exemplars = store.cfg.exemplars
        self._max_error_chars = store.cfg.max_error_type_chars
        self._rollout_bounds = store.rollout.bounds
        self._verify_bounds = store.verify.bounds
        self._step_bounds = store.env_step.bounds
        self._rl = RlExtractor(store.rl.bounds, store.cfg.exemplars, self._max_error_chars)

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
                if kind >= _MODEL:
                    if not spans:
                        continue  # a sparse block without a retried or failed hop
                    if enabled_of is not None:
                        if enabled is None:
                            enabled = enabled_of(resource_key)
                        group = (
                            semconv.GROUP_MODEL_CALL
                            if kind == _MODEL
                            else semconv.GROUP_HTTP_CLIENT
                        )
                        if group not in enabled:
                            continue
                    if pending is None:
                        pending = Pending()
                    if pending.rl is None:
                        pending.rl = RlPending()
                    if kind == _MODEL:
                        self._rl.model_calls(resource_key, spans, pending.rl)
                    else:
                        self._rl.hops(resource_key, spans, pending.rl)
                    continue
                rollouts = verifications = models = True
                if enabled_of is not None:
                    if enabled is None:
                        enabled = enabled_of(resource_key)
                    rollouts = kind != _VERIFY and semconv.GROUP_ROLLOUT in enabled
                    verifications = kind != _ROLLOUT and semconv.GROUP_VERIFY in enabled
                    models = kind == _BOTH and semconv.GROUP_MODEL_CALL in enabled
                    if not (rollouts or verifications or models):
                        continue  # an off group: not derived (the gate drops it)
                if pending is None:
                    pending = Pending()
                rl = pending.rl
                if rl is None:
                    rl = pending.rl = RlPending()
                # A scope of several kinds is read once per kind; each loop takes its
                # own names.
                if kind != _VERIFY and rollouts:
                    self._rollouts(resource_key, spans, pending)
                    self._rl.rollouts(resource_key, spans, rl)
                if kind != _ROLLOUT and verifications:
                    self._verifications(resource_key, spans, pending)
                    self._rl.verifications(resource_key, spans, rl)
                if kind == _BOTH and models:
                    self._rl.model_calls(resource_key, spans, rl)
        return pending

    # The two loops below run once per derived span: names are bound to locals, the
    # exemplar is written unconditionally (to a scratch dict when exemplars are off),
    # and the duration is computed once for the validity test and the value.

    def _rollouts(self, resource_key: bytes, spans: Sequence[DerivedSpan], out: Pending) -> None:
        rollout = semconv.SPAN_ROLLOUT
        bounds = self._rollout_bounds
        ns_per_ms = NS_PER_MS
        search = bisect_left
        ends = out.ended if self._rollout_ends else None
        points: SeriesPoints | None = None
        # set with the block's points, at its first point
        counts: list[int]
        exemplars: dict[int, DerivedSpan]
        append: Callable[[float], None]
        for span in spans:
            name, start, end, _, _, _, values = span
            if name != rollout:
                continue
            if values[_NESTED] is True:
                out.nested += 1
                continue
            if ends is not None:  # the end of a rollout, whose: this resource's
                ends.append(RolloutEnd(resource_key, span[3], span[4]))
            duration = end - start
            if duration < 0 or not start:
                out.invalid += 1
                continue
            if points is None:
                points = SeriesPoints(resource_key, (), bounds, self._exemplars, spans)
                out.rollouts.append(points)
                counts, append = points.counts, points.values.append
                exemplars = points.exemplars if points.exemplars is not None else {}
            value = duration / ns_per_ms
            bucket = search(bounds, value)  # bounds are inclusive upper bounds
            counts[bucket] += 1
            append(value)
            exemplars[bucket] = span  # the block's last span in the bucket wins

    def _verifications(
        self, resource_key: bytes, spans: Sequence[DerivedSpan], out: Pending
    ) -> None:
        verify, step = semconv.SPAN_VERIFY, semconv.SPAN_ENV_STEP
        ok, status_error = VERIFY_OK_ATTRS, _STATUS_ERROR
        ns_per_ms = NS_PER_MS
        search = bisect_left
        runs: dict[tuple[bool, Attrs], SeriesPoints] = {}
        # The series the last span went to; the next one usually goes there too.
        last_attrs: Attrs | None = None
        last_step = False
        bounds: list[float]
        counts: list[int]
        exemplars: dict[int, DerivedSpan]
        append: Callable[[float], None]
        for span in spans:
            name, start, end, _, _, status, values = span
            if name == verify:
                is_step = False
            elif name == step:
                is_step = True
            else:
                continue
            duration = end - start
            if duration < 0 or not start:
                out.invalid += 1
                continue
            succeeded = values[_SUCCEEDED]
            # Inline the common case (succeeded); a failure's attributes are built apart.
            if succeeded is True or (succeeded is not False and status != status_error):
                attrs = ok
            else:
                attrs = self._failed_attrs(values)
            if attrs is not last_attrs or is_step is not last_step:
                points = runs.get((is_step, attrs))
                if points is None:
                    histogram = self._step_bounds if is_step else self._verify_bounds
                    points = SeriesPoints(resource_key, attrs, histogram, self._exemplars, spans)
                    runs[(is_step, attrs)] = points
                    (out.steps if is_step else out.verifications).append(points)
                bounds, counts, append = points.bounds, points.counts, points.values.append
                exemplars = points.exemplars if points.exemplars is not None else {}
                last_attrs, last_step = attrs, is_step
            value = duration / ns_per_ms
            bucket = search(bounds, value)
            counts[bucket] += 1
            append(value)
            exemplars[bucket] = span

    def _failed_attrs(self, values: tuple[AttrValue, ...]) -> Attrs:
        """The attributes of a failed verification: its ``error.type`` (a non-empty
        string attribute, else the class name of the exception event's
        ``exception.type`` -- ``VerifierCrash`` for ``__main__.VerifierCrash`` --
        truncated; else ``_OTHER``) and ``succeeded=False``."""
        error_type = values[_ERROR_TYPE]
        if not isinstance(error_type, str) or not error_type:
            exception_type = values[_EXCEPTION_TYPE]
            # The class name without its module, as the agent writes it, so that one
            # failure reads the same from both producers.
            error_type = (
                exception_type.rpartition(".")[2] if isinstance(exception_type, str) else ""
            )
        return (
            (semconv.ERROR_TYPE, error_type[: self._max_error_chars] or ERROR_TYPE_OTHER),
            (semconv.VERIFY_SUCCEEDED, False),
        )

    def _verify_attrs(self, span: DerivedSpan, name: str) -> Attrs | None:
        """The point attributes of ``span`` if it is a valid point of span ``name``
        (``gym.verify`` or ``gym.env.step``), else None: :meth:`_verifications`' reading
        of one span, for the overflow path (which reads a block again)."""
        span_name, start, end, _, _, status, values = span
        if span_name != name or start == 0 or end < start:
            return None
        succeeded = values[_SUCCEEDED]
        if succeeded is True or (succeeded is not False and status != _STATUS_ERROR):
            return VERIFY_OK_ATTRS
        return self._failed_attrs(values)

    def record(self, pending: Pending) -> None:
        """Add ``pending`` to the store (takes its lock; call on the event loop).

        The same as adding its points one at a time, in span order: series are looked
        up once per block and series (:class:`SeriesPoints`), in the order their first
        points came, rollouts first, then verifications, then steps, so they are created
        in the same order; a block whose series meet in the overflow series is read
        again to add their points there in span order (:meth:`_add_overflowed`).
        """
        store = self.store
        with store.lock:
            store.invalid_spans += pending.invalid
            if pending.rollouts:
                added = self._add(store.rollout, pending.rollouts, semconv.SPAN_ROLLOUT)
                store.spans[semconv.SPAN_ROLLOUT] += added
            if pending.verifications:
                added = self._add(
                    store.verify, pending.verifications, semconv.SPAN_VERIFY, store.rates
                )
                store.spans[semconv.SPAN_VERIFY] += added
            if pending.steps:
                added = self._add(store.env_step, pending.steps, semconv.SPAN_ENV_STEP)
                store.spans[semconv.SPAN_ENV_STEP] += added
            if pending.nested:
                store.spans[NESTED_ROLLOUT_SPANS] += pending.nested
            rl = pending.rl
            if rl is not None:
                store.rl.record(rl)
                store.invalid_spans += rl.invalid_spans
                if rl.model_calls:
                    store.spans[MODEL_CALL_SPANS] += rl.model_calls
                if rl.hops:
                    store.spans[HOP_SPANS] += rl.hops

    def _add(
        self,
        table: HistogramTable,
        runs: list[SeriesPoints],
        name: str,
        rates: RateTable | None = None,
    ) -> int:
        """Add ``runs`` (points of spans called ``name``) to their series in ``table``,
        and count them in ``rates`` (verifications); the points added. A run routed to
        overflow counts each of its points as overflowed."""
        added = 0
        overflow: HistogramSeries | None = None
        overflowed: list[SeriesPoints] = []
        for points in runs:
            key, attrs, n = points.key, points.attrs, len(points.values)
            series = table.get(key, attrs, n)
            if series.attrs is OVERFLOW_ATTRS:
                overflow = series
                overflowed.append(points)
            else:
                series.add(points)
            if rates is not None:
                window = rates.get(key, n)
                window.total += n
                if attrs is VERIFY_OK_ATTRS:
                    window.ok += n
            added += n
        if overflow is not None:
            self._add_overflowed(overflow, overflowed, name)
        return added

    def _add_overflowed(self, series: HistogramSeries, runs: list[SeriesPoints], name: str) -> None:
        """Add ``runs``, all routed to the overflow ``series``, in span order: runs of
        different blocks one after the other; runs of one block (its failures of
        different ``error.type``, say) by reading the block again, so that the sum adds
        their values in span order and each bucket's exemplar is the last span in it
        of the last series (in span order) that had one, as one point at a time would."""
        i = 0
        while i < len(runs):
            spans = runs[i].spans
            j = i + 1
            while j < len(runs) and runs[j].spans is spans:
                j += 1
            if j == i + 1:
                series.add(runs[i])
            else:
                self._add_interleaved(series, runs[i:j], name)
            i = j

    def _add_interleaved(
        self, series: HistogramSeries, runs: list[SeriesPoints], name: str
    ) -> None:
        wanted = {points.attrs for points in runs}
        bounds = runs[0].bounds
        merged = SeriesPoints(OVERFLOW_RESOURCE, OVERFLOW_ATTRS, bounds, exemplars=False)
        last: dict[tuple[Attrs, int], DerivedSpan] = {}  # each series' last span per bucket
        for span in runs[0].spans:
            attrs = self._verify_attrs(span, name)
            if attrs is None or attrs not in wanted:
                continue
            value = (span[2] - span[1]) / NS_PER_MS
            bucket = bisect_left(bounds, value)
            merged.values.append(value)
            merged.counts[bucket] += 1
            last.pop((attrs, bucket), None)  # re-inserted: the dict's order is span order
            last[(attrs, bucket)] = span
        series.add(merged)
        if self._exemplars:
            for (_, bucket), span in last.items():
                exemplar = exemplar_of(span)
                if exemplar is not None:
                    series.exemplars[bucket] = exemplar
