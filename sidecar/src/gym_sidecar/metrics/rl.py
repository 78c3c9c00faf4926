"""The RL view's metrics (issue 41), read from the spans the derive stage reads.

Per span (both producers' spans alike, told apart by ``core.producers``; the values are
the scanner's, ``metrics.fields``):

- ``gym.verify`` with a numeric ``nemo.gym.reward``: one ``gym.verify.reward`` point
  (``succeeded`` read as for ``gym.verify.*``: the attribute, else the status); a
  verifier that raised carries no reward, so it gives no point. ``gym.env.step``: one
  ``gym.env.step.reward`` point (no point attributes).
- ``gym.rollout``: ``gym.rollout.turns`` (``nemo.gym.rollout.turns``) and
  ``gym.rollout.tokens`` (``nemo.gym.rollout.input_tokens`` / ``output_tokens``, one point
  each, ``gen_ai.token.type``), failed rollouts included, from the span that carries them
  whether it is nested or not: the agent writes them on exactly one span per rollout
  (the one whose process made the model calls; a relaying rollout's span has none).
- a model call (``gym.model.responses|chat_completions|messages``, on the Gym model
  server the call reached): ``gen_ai.client.operation.duration`` (the span's duration,
  s; ``error.type`` on a failed call: the attribute, else the exception event's class
  name, else ``_OTHER``), ``gen_ai.client.token.usage`` (one point per usage attribute
  present, ``gen_ai.token.type``), and for a streamed call that succeeded
  ``gen_ai.server.time_to_first_token`` (``gen_ai.response.time_to_first_chunk``). Point
  attributes ``gen_ai.operation.name`` (the span's, else ``chat``, OpenTelemetry's value
  for all three dialects, which Gym's own telemetry does not write) and
  ``gen_ai.request.model`` when the span has it. Nothing else counts a model call: not
  the hop that reached it, not Gym's agent relaying its own ``/v1/responses``
  (``gym.agent.responses``), not the usage Gym sums into ``/run`` and ``/verify`` answers.
- a retried or failed hop (``http_client``, read sparsely): ``gym.http.client.retries``
  += ``http.request.resend_count``, ``gym.http.client.timeouts`` += 1 when its
  ``error.type`` is ``timeout``; point attribute ``nemo.gym.target.server.name`` when the
  hop has one.

A value of the wrong type (a string reward, a negative or boolean token count, a
non-finite number) gives no point and is counted in ``invalid_values``. Points are kept
per ScopeSpans block and series (``series.SeriesPoints``), as the duration metrics' are;
exemplars carry the point's value. :class:`RlExtractor` only reads; recording is
``metrics.rl_tables``.

Cost: each loop runs once per derived span, and a model server sends one model call in
every few spans, so every loop is written as the duration metrics' are (locals, one
run lookup per span, the bucket, count, value and exemplar updated inline): measured
under callgrind, that is cheaper than batching a block's values through ``map`` and
``Counter`` (10k against 17k instructions per model call of three points). Issue 42
measured it again (docs/benchmarks.md, "Performance round 4"): the rollout loop, once
a generic loop over (metric, attributes, index) triples, is inlined too (turns and
tokens: 7.8k against 10.4k instructions per rollout span of three points), the reward
loop keeps its last run in locals instead of a tuple key and a dict lookup per span
(3.5k against 4.8k per verification), and the model-call loop takes the last call's
run when its model and operation are the same objects (the native scanner makes a
block's repeated strings once; 10.4k against 10.6k per call). A column-wise
model-call read (``zip(*spans)``, ``map(bisect_left, ...)``, bucket counts by
``bytes.count``, exemplars by ``dict(zip(buckets, spans))``) was tried again and
measured 18k against 10.6k instructions per call: each ``map`` step is a C call per
element, and a block of interleaved models needs a pass per model.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from gym_sidecar.core.traces import AttrValue, DerivedSpan
from gym_sidecar.metrics import fields
from gym_sidecar.metrics.series import Attrs, SeriesPoints

# The histograms, by index (their names: HISTOGRAMS).
VERIFY_REWARD: Final = 0
STEP_REWARD: Final = 1
TOKEN_USAGE: Final = 2
OPERATION_DURATION: Final = 3
TIME_TO_FIRST_TOKEN: Final = 4
TURNS: Final = 5
ROLLOUT_TOKENS: Final = 6
HISTOGRAMS: Final[tuple[str, ...]] = (
    semconv.METRIC_VERIFY_REWARD,
    semconv.METRIC_ENV_STEP_REWARD,
    semconv.METRIC_GEN_AI_TOKEN_USAGE,
    semconv.METRIC_GEN_AI_OPERATION_DURATION,
    semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN,
    semconv.METRIC_ROLLOUT_TURNS,
    semconv.METRIC_ROLLOUT_TOKENS,
)
# The sums, by index.
RETRIES: Final = 0
TIMEOUTS: Final = 1
SUMS: Final[tuple[str, ...]] = (
    semconv.METRIC_HTTP_CLIENT_RETRIES,
    semconv.METRIC_HTTP_CLIENT_TIMEOUTS,
)

MODEL_SPANS: Final = frozenset(
    {semconv.SPAN_MODEL_RESPONSES, semconv.SPAN_MODEL_CHAT, semconv.SPAN_MODEL_MESSAGES}
)
ERROR_TYPE_OTHER: Final = "_OTHER"
NS_PER_S: Final = 1e9
_STATUS_ERROR: Final = Status.STATUS_CODE_ERROR

_OK: Final[Attrs] = ((semconv.VERIFY_SUCCEEDED, True),)
_FAILED: Final[Attrs] = ((semconv.VERIFY_SUCCEEDED, False),)
_INPUT: Final[Attrs] = ((semconv.GEN_AI_TOKEN_TYPE, semconv.GEN_AI_TOKEN_TYPE_INPUT),)
_OUTPUT: Final[Attrs] = ((semconv.GEN_AI_TOKEN_TYPE, semconv.GEN_AI_TOKEN_TYPE_OUTPUT),)
_NONE: Final[Attrs] = ()
_UNSET: Final = object()
"""No value yet (a model-call loop's last model and operation)."""
_isfinite = math.isfinite

ValueOf = Callable[[DerivedSpan], float]
"""A point's value of a span (an exemplar's value, computed once per bucket)."""


def _seconds(span: DerivedSpan) -> float:
    return (span[2] - span[1]) / NS_PER_S


def _value_at(index: int) -> ValueOf:
    """The span's value ``index`` as a float (an exemplar's: a valid point's value)."""
    getter = itemgetter(index)
    return lambda span: float(getter(span[6]))


@dataclass(slots=True)
class RlPending:
    """The RL points of one request, not yet recorded: per histogram (index) and block,
    one :class:`SeriesPoints` per series in the order their first points came; the sums
    as (index, resource, attributes, amount) per block and series."""

    runs: list[tuple[int, SeriesPoints]] = field(default_factory=list)
    sums: list[tuple[int, bytes, Attrs, int]] = field(default_factory=list)
    invalid: int = 0
    """Values of the wrong type or range (no point)."""
    invalid_spans: int = 0
    """Model-call spans without a start time or ending before it (no point)."""
    model_calls: int = 0
    hops: int = 0


def _count(value: AttrValue) -> int | None:
    """A non-negative int (not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


def _number(value: AttrValue) -> float | None:
    """A finite int or float (not a bool) as a float, else None."""
    kind = type(value)
    if kind is float:
        return value if _isfinite(value) else None  # type: ignore[arg-type,return-value]
    if kind is int:
        return float(value)  # type: ignore[arg-type]
    return None


class RlExtractor:
    """Reads the RL points of spans (module doc). Pure: never touches the store; safe
    from any thread (the attribute cache only grows by equal values)."""

    def __init__(
        self, bounds: Sequence[list[float]], exemplars: bool, max_error_chars: int
    ) -> None:
        self.bounds = bounds
        """Per histogram (index), its bucket bounds (floats)."""
        self.exemplars = exemplars
        self.max_error_chars = max_error_chars
        self._model_attrs: dict[tuple[AttrValue, AttrValue], tuple[Attrs, Attrs, Attrs]] = {}
        self._values: dict[int, ValueOf] = {}

    def _points(  # noqa: PLR0917 (a private helper of the hot loops)
        self,
        out: RlPending,
        metric: int,
        key: bytes,
        attrs: Attrs,
        spans: Sequence[DerivedSpan],
        value_of: ValueOf,
    ) -> SeriesPoints:
        """A new run of ``metric``'s series ``attrs`` for one block, listed in ``out``
        (the caller adds its first point at once: a run is never empty)."""
        points = SeriesPoints(key, attrs, self.bounds[metric], self.exemplars, spans)
        points.exemplar_value = value_of
        out.runs.append((metric, points))
        return points

    def _value_of(self, index: int) -> ValueOf:
        found = self._values.get(index)
        if found is None:
            found = self._values[index] = _value_at(index)
        return found

    def rollouts(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """Turns and tokens of the ``gym.rollout`` spans that carry them: per span, a
        point per value that is a count (a non-negative int), in the order turns, input
        tokens, output tokens (each series' run made at its first point)."""
        rollout = semconv.SPAN_ROLLOUT
        i_turns, i_in, i_out = (
            fields.TURNS,
            fields.ROLLOUT_INPUT_TOKENS,
            fields.ROLLOUT_OUTPUT_TOKENS,
        )
        search = bisect_left
        # Each run and its bucket counts, values' append and exemplars (a scratch dict
        # when exemplars are off), bound at its first point.
        turns: SeriesPoints | None = None
        tokens_in: SeriesPoints | None = None
        tokens_out: SeriesPoints | None = None
        t_counts: list[int]
        t_append: Callable[[float], None]
        t_exemplars: dict[int, DerivedSpan]
        i_counts: list[int]
        i_append: Callable[[float], None]
        i_exemplars: dict[int, DerivedSpan]
        o_counts: list[int]
        o_append: Callable[[float], None]
        o_exemplars: dict[int, DerivedSpan]
        for span in spans:
            if span[0] != rollout:
                continue
            values = span[6]
            raw = values[i_turns]
            if raw is not None:
                if type(raw) is int and raw >= 0:
                    if turns is None:
                        turns = self._points(out, TURNS, key, (), spans, self._value_of(i_turns))
                        t_counts, t_append = turns.counts, turns.values.append
                        t_exemplars = turns.exemplars if turns.exemplars is not None else {}
                    value = float(raw)
                    bucket = search(turns.bounds, value)
                    t_counts[bucket] += 1
                    t_append(value)
                    t_exemplars[bucket] = span  # the block's last span wins
                else:
                    out.invalid += 1
            raw = values[i_in]
            if raw is not None:
                if type(raw) is int and raw >= 0:
                    if tokens_in is None:
                        tokens_in = self._points(
                            out, ROLLOUT_TOKENS, key, _INPUT, spans, self._value_of(i_in)
                        )
                        i_counts, i_append = tokens_in.counts, tokens_in.values.append
                        i_exemplars = tokens_in.exemplars if tokens_in.exemplars is not None else {}
                    value = float(raw)
                    bucket = search(tokens_in.bounds, value)
                    i_counts[bucket] += 1
                    i_append(value)
                    i_exemplars[bucket] = span
                else:
                    out.invalid += 1
            raw = values[i_out]
            if raw is not None:
                if type(raw) is int and raw >= 0:
                    if tokens_out is None:
                        tokens_out = self._points(
                            out, ROLLOUT_TOKENS, key, _OUTPUT, spans, self._value_of(i_out)
                        )
                        o_counts, o_append = tokens_out.counts, tokens_out.values.append
                        o_exemplars = (
                            tokens_out.exemplars if tokens_out.exemplars is not None else {}
                        )
                    value = float(raw)
                    bucket = search(tokens_out.bounds, value)
                    o_counts[bucket] += 1
                    o_append(value)
                    o_exemplars[bucket] = span
                else:
                    out.invalid += 1

    def verifications(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """The rewards of ``gym.verify`` and ``gym.env.step`` spans."""
        verify, step = semconv.SPAN_VERIFY, semconv.SPAN_ENV_STEP
        i_reward, i_succeeded = fields.REWARD, fields.SUCCEEDED
        isfinite, error = _isfinite, _STATUS_ERROR
        search = bisect_left
        runs: dict[tuple[int, Attrs], SeriesPoints] = {}
        # The run the last point went to (the next one usually goes there too), and its
        # bounds, counts, values' append and exemplars (a scratch dict when off).
        last_metric = -1
        last_attrs: Attrs | None = None
        bounds: list[float]
        counts: list[int]
        append: Callable[[float], None]
        exemplars: dict[int, DerivedSpan]
        for span in spans:
            name = span[0]
            if name != verify and name != step:  # noqa: PLR1714 (two str compares: cheapest)
                continue
            values = span[6]
            raw = values[i_reward]
            if raw is None:
                continue
            # _number, inlined: a finite int or float, not a bool
            kind = type(raw)
            if kind is float:
                if not isfinite(raw):  # type: ignore[arg-type]
                    out.invalid += 1
                    continue
                reward: float = raw  # type: ignore[assignment]
            elif kind is int:
                reward = float(raw)
            else:
                out.invalid += 1
                continue
            if name == step:
                metric, attrs = STEP_REWARD, _NONE
            else:
                succeeded = values[i_succeeded]
                ok = succeeded is True or (succeeded is not False and span[5] != error)
                metric, attrs = VERIFY_REWARD, _OK if ok else _FAILED
            if attrs is not last_attrs or metric != last_metric:
                points = runs.get((metric, attrs))
                if points is None:
                    value_of = self._value_of(i_reward)
                    points = runs[(metric, attrs)] = self._points(
                        out, metric, key, attrs, spans, value_of
                    )
                bounds, counts, append = points.bounds, points.counts, points.values.append
                exemplars = points.exemplars if points.exemplars is not None else {}
                last_metric, last_attrs = metric, attrs
            bucket = search(bounds, reward)
            counts[bucket] += 1
            append(reward)
            exemplars[bucket] = span

    def model_calls(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """Duration, tokens and time to first token of the model-call spans (the derive
        stage's busiest RL loop: the common case, a completed call with usage, inline)."""
        model_spans, error = MODEL_SPANS, _STATUS_ERROR
        i_model, i_op = fields.REQUEST_MODEL, fields.OPERATION_NAME
        i_in, i_out, i_ttfc = (
            fields.USAGE_INPUT_TOKENS,
            fields.USAGE_OUTPUT_TOKENS,
            fields.TIME_TO_FIRST_CHUNK,
        )
        search = bisect_left
        value_in, value_out = self._value_of(i_in), self._value_of(i_out)
        # (model, operation) -> [its three attribute sets, then its duration, input and
        # output token runs, made when their first point comes]
        runs: dict[tuple[AttrValue, AttrValue], list[Any]] = {}
        run: list[Any] = []
        last_model: object = _UNSET
        last_operation: object = _UNSET
        calls = 0
        for span in spans:
            name, start, end, _, _, status, values = span
            if name not in model_spans:
                continue
            duration = end - start
            if duration < 0 or not start:
                out.invalid_spans += 1
                continue
            if status == error:
                self._failed_call(out, key, spans, span)
                continue
            calls += 1
            model, operation = values[i_model], values[i_op]
            # The native scanner hands a block's equal strings over as one object: the
            # same model and operation as the last call's are its run, without a lookup.
            if model is not last_model or operation is not last_operation:
                run_key = (model, operation)
                found = runs.get(run_key)
                if found is None:
                    base, base_in, base_out = self._attrs(values)
                    found = runs[run_key] = [
                        base,
                        self._points(out, OPERATION_DURATION, key, base, spans, _seconds),
                        base_in,
                        None,
                        base_out,
                        None,
                    ]
                run, last_model, last_operation = found, model, operation
            points = run[1]
            value = duration / NS_PER_S
            bucket = search(points.bounds, value)
            points.counts[bucket] += 1
            points.values.append(value)
            if points.exemplars is not None:
                points.exemplars[bucket] = span
            raw = values[i_in]
            if raw is not None:
                if type(raw) is int and raw >= 0:
                    points = run[3]
                    if points is None:
                        points = run[3] = self._points(
                            out, TOKEN_USAGE, key, run[2], spans, value_in
                        )
                    value = float(raw)
                    bucket = search(points.bounds, value)
                    points.counts[bucket] += 1
                    points.values.append(value)
                    if points.exemplars is not None:
                        points.exemplars[bucket] = span
                else:
                    out.invalid += 1
            raw = values[i_out]
            if raw is not None:
                if type(raw) is int and raw >= 0:
                    points = run[5]
                    if points is None:
                        points = run[5] = self._points(
                            out, TOKEN_USAGE, key, run[4], spans, value_out
                        )
                    value = float(raw)
                    bucket = search(points.bounds, value)
                    points.counts[bucket] += 1
                    points.values.append(value)
                    if points.exemplars is not None:
                        points.exemplars[bucket] = span
                else:
                    out.invalid += 1
            raw = values[i_ttfc]
            if raw is not None:  # a streamed call
                self._time_to_first_token(out, key, spans, span, run[0], raw)
        out.model_calls += calls

    def _time_to_first_token(  # noqa: PLR0917 (a private helper of model_calls)
        self,
        out: RlPending,
        key: bytes,
        spans: Sequence[DerivedSpan],
        span: DerivedSpan,
        attrs: Attrs,
        raw: AttrValue,
    ) -> None:
        ttft = _number(raw)
        if ttft is None or ttft < 0:
            out.invalid += 1
            return
        value_of = self._value_of(fields.TIME_TO_FIRST_CHUNK)
        points = self._points(out, TIME_TO_FIRST_TOKEN, key, attrs, spans, value_of)
        bucket = bisect_left(points.bounds, ttft)
        points.counts[bucket] += 1
        points.values.append(ttft)
        if points.exemplars is not None:
            points.exemplars[bucket] = span

    def _failed_call(
        self, out: RlPending, key: bytes, spans: Sequence[DerivedSpan], span: DerivedSpan
    ) -> None:
        """A failed call (rare: a run of its own per point): its duration with
        ``error.type``, its usage if it has any; no time to first token (that is of
        successful responses)."""
        out.model_calls += 1
        values = span[6]
        attrs = ((semconv.ERROR_TYPE, self._error_type(values)), *self._attrs(values)[0])
        points = self._points(out, OPERATION_DURATION, key, attrs, spans, _seconds)
        value = _seconds(span)
        bucket = bisect_left(points.bounds, value)
        points.counts[bucket] += 1
        points.values.append(value)
        if points.exemplars is not None:
            points.exemplars[bucket] = span
        _, base_in, base_out = self._attrs(values)
        for index, token_attrs in (
            (fields.USAGE_INPUT_TOKENS, base_in),
            (fields.USAGE_OUTPUT_TOKENS, base_out),
        ):
            raw = values[index]
            if raw is None:
                continue
            if _count(raw) is None:
                out.invalid += 1
                continue
            value_of = self._value_of(index)
            points = self._points(out, TOKEN_USAGE, key, token_attrs, spans, value_of)
            value = float(raw)
            bucket = bisect_left(points.bounds, value)
            points.counts[bucket] += 1
            points.values.append(value)
            if points.exemplars is not None:
                points.exemplars[bucket] = span

    def _attrs(self, values: tuple[AttrValue, ...]) -> tuple[Attrs, Attrs, Attrs]:
        """A model call's point attributes: ``gen_ai.operation.name`` (the span's, else
        ``chat``) and ``gen_ai.request.model`` (when the span has one), sorted by key;
        then the same plus ``gen_ai.token.type`` input, output. Cached per distinct pair,
        so each set is one tuple (hashed once per lookup, compared by identity first)."""
        model, operation = values[fields.REQUEST_MODEL], values[fields.OPERATION_NAME]
        cache_key = (model, operation)
        found = self._model_attrs.get(cache_key)
        if found is not None:
            return found
        op = operation if type(operation) is str and operation else semconv.GEN_AI_OPERATION_CHAT
        base: Attrs = ((semconv.GEN_AI_OPERATION_NAME, op[: self.max_error_chars]),)
        if type(model) is str and model:
            base = (*base, (semconv.GEN_AI_REQUEST_MODEL, model[: self.max_error_chars]))
        found = (base, (*base, *_INPUT), (*base, *_OUTPUT))
        if len(self._model_attrs) < _MAX_CACHED:
            self._model_attrs[cache_key] = found
        return found

    def _error_type(self, values: tuple[AttrValue, ...]) -> str:
        """A failed call's ``error.type``: the attribute, else the exception event's class
        name without its module, else ``_OTHER``; truncated (as ``gym.verify``'s)."""
        error_type = values[fields.ERROR_TYPE]
        if not isinstance(error_type, str) or not error_type:
            exception_type = values[fields.EXCEPTION_TYPE]
            error_type = (
                exception_type.rpartition(".")[2] if isinstance(exception_type, str) else ""
            )
        return error_type[: self.max_error_chars] or ERROR_TYPE_OTHER

    def hops(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """Retries and timeouts of the retried or failed hops (a sparse block's spans)."""
        sums: dict[tuple[int, Attrs], int] = {}
        timeout = semconv.ERROR_TYPE_TIMEOUT
        for span in spans:
            values = span[6]
            out.hops += 1
            target = values[fields.TARGET_SERVER]
            attrs: Attrs = (
                ((semconv.TARGET_SERVER_NAME, target[: self.max_error_chars]),)
                if type(target) is str and target
                else ()
            )
            raw = values[fields.RESEND_COUNT]
            if raw is not None:
                resends = _count(raw)
                if resends is None:
                    out.invalid += 1
                elif resends:
                    sums[(RETRIES, attrs)] = sums.get((RETRIES, attrs), 0) + resends
            if values[fields.ERROR_TYPE] == timeout:
                sums[(TIMEOUTS, attrs)] = sums.get((TIMEOUTS, attrs), 0) + 1
        out.sums.extend((metric, key, attrs, n) for (metric, attrs), n in sums.items())


_MAX_CACHED: Final = 4096
"""Model-call attribute sets remembered by an extractor (past it, built each time)."""
