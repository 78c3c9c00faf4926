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
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby, repeat
from operator import itemgetter, sub, truediv
from typing import Final, cast

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
_isfinite = math.isfinite

# Field readers for the C loops of RlExtractor.model_calls (a DerivedSpan, its values).
_NAME: Final = itemgetter(0)
_START: Final = itemgetter(1)
_END: Final = itemgetter(2)
_STATUS: Final = itemgetter(5)
_VALUES: Final = itemgetter(6)
_MODEL: Final = itemgetter(fields.REQUEST_MODEL)
_OP: Final = itemgetter(fields.OPERATION_NAME)
_IN_INDEX: Final = fields.USAGE_INPUT_TOKENS
_OUT_INDEX: Final = fields.USAGE_OUTPUT_TOKENS
_TTFC_INDEX: Final = fields.TIME_TO_FIRST_CHUNK
_IN: Final = itemgetter(_IN_INDEX)
_OUT: Final = itemgetter(_OUT_INDEX)
_TTFC: Final = itemgetter(_TTFC_INDEX)
_NONE_ONLY: Final = frozenset({None})
_INT_ONLY: Final = frozenset({int})
_NONE_TYPE: Final = frozenset({type(None)})


def _all_counts(values: list[AttrValue]) -> bool:
    """Every value a non-negative int (not a bool), or every value absent: C loops."""
    kinds = set(map(type, values))
    if kinds == _NONE_TYPE:
        return True
    return kinds == _INT_ONLY and min(cast(list[int], values)) >= 0


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


class _Block:
    """The series one block gives (an index and attributes -> its points)."""

    __slots__ = ("bounds", "exemplars", "key", "out", "runs", "spans")

    def __init__(
        self,
        key: bytes,
        spans: Sequence[DerivedSpan],
        out: RlPending,
        bounds: Sequence[list[float]],
        exemplars: bool,
    ) -> None:
        self.key = key
        self.spans = spans
        self.out = out
        self.bounds = bounds
        self.exemplars = exemplars
        self.runs: list[dict[Attrs, SeriesPoints]] = [{} for _ in bounds]
        """Per histogram (index): attributes -> the block's points of that series."""

    def add(self, metric: int, attrs: Attrs, value: float, span: DerivedSpan) -> None:
        points = self.runs[metric].get(attrs)
        if points is None:
            points = SeriesPoints(self.key, attrs, self.bounds[metric], self.exemplars, self.spans)
            if points.exemplars is not None:
                points.exemplar_values = {}
            self.runs[metric][attrs] = points
            self.out.runs.append((metric, points))
        bucket = bisect_left(points.bounds, value)  # inclusive upper bounds
        points.counts[bucket] += 1
        points.values.append(value)
        values_of = points.exemplar_values
        if values_of is not None:
            points.exemplars[bucket] = span  # type: ignore[index]  # the block's last span wins
            values_of[bucket] = value

    def add_many(
        self, metric: int, attrs: Attrs, values: list[float], spans: list[DerivedSpan]
    ) -> None:
        """:meth:`add` of each value (with its span) in order, batched: the buckets are
        found and counted by C loops (``map``, ``Counter``), and ``dict(zip(...))`` keeps
        each bucket's last span, as adding them one at a time would."""
        points = self.runs[metric].get(attrs)
        if points is None:
            points = SeriesPoints(self.key, attrs, self.bounds[metric], self.exemplars, self.spans)
            if points.exemplars is not None:
                points.exemplar_values = {}
            self.runs[metric][attrs] = points
            self.out.runs.append((metric, points))
        buckets = list(map(partial(bisect_left, points.bounds), values))
        counts = points.counts
        for bucket, n in Counter(buckets).items():
            counts[bucket] += n
        points.values += values
        values_of = points.exemplar_values
        if values_of is not None:
            exemplars = points.exemplars
            assert exemplars is not None  # set together with exemplar_values
            # each bucket's last index (a dict keeps a key's last value), then few buckets
            for bucket, i in dict(zip(buckets, range(len(buckets)), strict=True)).items():
                exemplars[bucket] = spans[i]
                values_of[bucket] = values[i]


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

    def _block(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> _Block:
        return _Block(key, spans, out, self.bounds, self.exemplars)

    def _counts(  # noqa: PLR0917 (a private helper of three loops)
        self,
        block: _Block,
        metric: int,
        attrs: Attrs,
        index: int,
        spans: list[DerivedSpan],
        out: RlPending,
    ) -> None:
        """The points of value ``index`` (a count: a non-negative int) of ``spans``, in
        one batch; values of another type or sign are counted invalid."""
        given = [s for s in spans if s[6][index] is not None]
        if not given:
            return
        counted = [s for s in given if type(s[6][index]) is int and s[6][index] >= 0]  # type: ignore[operator]
        out.invalid += len(given) - len(counted)
        if counted:
            values = [float(s[6][index]) for s in counted]  # type: ignore[arg-type]
            block.add_many(metric, attrs, values, counted)

    def rollouts(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """Turns and tokens of the ``gym.rollout`` spans that carry them (in batches: a
        rollout block of an agent holds many)."""
        rollout = semconv.SPAN_ROLLOUT
        rolls = [s for s in spans if s[0] == rollout]
        if not rolls:
            return
        block = self._block(key, spans, out)
        self._counts(block, TURNS, (), fields.TURNS, rolls, out)
        self._counts(block, ROLLOUT_TOKENS, _INPUT, fields.ROLLOUT_INPUT_TOKENS, rolls, out)
        self._counts(block, ROLLOUT_TOKENS, _OUTPUT, fields.ROLLOUT_OUTPUT_TOKENS, rolls, out)

    def verifications(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """The rewards of ``gym.verify`` and ``gym.env.step`` spans (in batches)."""
        verify, step = semconv.SPAN_VERIFY, semconv.SPAN_ENV_STEP
        i_reward, i_succeeded = fields.REWARD, fields.SUCCEEDED
        given = [s for s in spans if s[6][i_reward] is not None and s[0] in (verify, step)]
        if not given:
            return
        block = self._block(key, spans, out)
        runs: dict[tuple[int, Attrs], tuple[list[float], list[DerivedSpan]]] = {}
        for span in given:
            reward = _number(span[6][i_reward])
            if reward is None:
                out.invalid += 1
                continue
            run: tuple[int, Attrs]
            if span[0] == step:
                run = (STEP_REWARD, ())
            else:
                succeeded = span[6][i_succeeded]
                ok = succeeded is True or (succeeded is not False and span[5] != _STATUS_ERROR)
                run = (VERIFY_REWARD, _OK if ok else _FAILED)
            found = runs.get(run)
            if found is None:
                found = runs[run] = ([], [])
            found[0].append(reward)
            found[1].append(span)
        for (metric, attrs), (values, of) in runs.items():
            block.add_many(metric, attrs, values, of)

    def model_calls(self, key: bytes, spans: Sequence[DerivedSpan], out: RlPending) -> None:
        """Duration, tokens and time to first token of the model-call spans.

        The derive stage's busiest RL loop (a model call is one span in five to ten of an
        agent's fleet), so it is written for CPython's C loops: the block's completed
        calls are grouped by (model, operation) with a stable sort of their keys, each
        group's values are read with ``map``/``itemgetter`` and checked with ``min`` and
        ``set`` (the common case: every value valid), and added in batches
        (:meth:`_Block.add_many`). Failed calls (rare) go one by one, as does a group
        with an invalid value (:meth:`_group_slow`)."""
        model_spans, error = MODEL_SPANS, _STATUS_ERROR
        if set(map(_NAME, spans)) <= model_spans and error not in set(map(_STATUS, spans)):
            done: Sequence[DerivedSpan] = spans  # a model server's block: every call done
            failed: list[DerivedSpan] = []
        else:
            calls = [s for s in spans if s[0] in model_spans]
            done = [s for s in calls if s[5] != error]
            failed = [s for s in calls if s[5] == error]
        if not done and not failed:
            return
        block = self._block(key, spans, out)
        if done:
            values = list(map(_VALUES, done))
            keys = list(zip(map(_MODEL, values), map(_OP, values), strict=True))
            if len(set(keys)) == 1:
                self._group(block, list(done), values, out)
            else:
                # ranks in order of first appearance (keys need not compare: None, str)
                rank = {k: i for i, k in enumerate(dict.fromkeys(keys))}
                ranks = list(map(rank.__getitem__, keys))
                order = sorted(range(len(done)), key=ranks.__getitem__)  # stable: span order
                for _, indexes in groupby(order, key=ranks.__getitem__):
                    picked = list(indexes)
                    self._group(block, [done[i] for i in picked], [values[i] for i in picked], out)
        for span in failed:
            self._failed_call(block, span, out)

    def _group(
        self,
        block: _Block,
        group: list[DerivedSpan],
        values: list[tuple[AttrValue, ...]],
        out: RlPending,
    ) -> None:
        """The points of completed calls of one (model, operation), in batches."""
        starts = list(map(_START, group))
        durations = list(map(sub, map(_END, group), starts))
        if min(starts) <= 0 or min(durations) < 0:
            self._group_slow(block, group, out)
            return
        tokens_in = list(map(_IN, values))
        tokens_out = list(map(_OUT, values))
        if not _all_counts(tokens_in) or not _all_counts(tokens_out):
            self._group_slow(block, group, out)
            return
        out.model_calls += len(group)
        base, base_in, base_out = self._attrs(values[0])
        block.add_many(
            OPERATION_DURATION, base, list(map(truediv, durations, repeat(NS_PER_S))), group
        )
        if tokens_in[0] is not None:
            block.add_many(TOKEN_USAGE, base_in, list(map(float, tokens_in)), group)
        if tokens_out[0] is not None:
            block.add_many(TOKEN_USAGE, base_out, list(map(float, tokens_out)), group)
        ttfc = list(map(_TTFC, values))
        if set(ttfc) != _NONE_ONLY:  # streamed calls: few, one by one
            for span, raw in zip(group, ttfc, strict=True):
                if raw is None:
                    continue
                ttft = _number(raw)
                if ttft is None or ttft < 0:
                    out.invalid += 1
                else:
                    block.add(TIME_TO_FIRST_TOKEN, base, ttft, span)

    def _group_slow(self, block: _Block, group: list[DerivedSpan], out: RlPending) -> None:
        """:meth:`_group` for a group with an invalid time or value: span by span."""
        i_in, i_out, i_ttfc = _IN_INDEX, _OUT_INDEX, _TTFC_INDEX
        for span in group:
            start, end, values = span[1], span[2], span[6]
            if end < start or not start:
                out.invalid_spans += 1
                continue
            out.model_calls += 1
            base, base_in, base_out = self._attrs(values)
            block.add(OPERATION_DURATION, base, (end - start) / NS_PER_S, span)
            for raw, attrs in ((values[i_in], base_in), (values[i_out], base_out)):
                if raw is not None:
                    if _count(raw) is None:
                        out.invalid += 1
                    else:
                        block.add(TOKEN_USAGE, attrs, float(raw), span)
            raw = values[i_ttfc]
            if raw is not None:
                ttft = _number(raw)
                if ttft is None or ttft < 0:
                    out.invalid += 1
                else:
                    block.add(TIME_TO_FIRST_TOKEN, base, ttft, span)

    def _failed_call(self, block: _Block, span: DerivedSpan, out: RlPending) -> None:
        """A failed call: its duration with ``error.type``, its usage if it has any (no
        time to first token: that is of successful responses)."""
        start, end, values = span[1], span[2], span[6]
        if end < start or not start:
            out.invalid_spans += 1
            return
        out.model_calls += 1
        block.add(OPERATION_DURATION, self._failed_attrs(values), (end - start) / NS_PER_S, span)
        _, base_in, base_out = self._attrs(values)
        for raw, attrs in ((values[_IN_INDEX], base_in), (values[_OUT_INDEX], base_out)):
            if raw is not None:
                if _count(raw) is None:
                    out.invalid += 1
                else:
                    block.add(TOKEN_USAGE, attrs, float(raw), span)

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

    def _failed_attrs(self, values: tuple[AttrValue, ...]) -> Attrs:
        """A failed call's duration attributes: ``error.type`` first, then :meth:`_attrs`'."""
        return ((semconv.ERROR_TYPE, self._error_type(values)), *self._attrs(values)[0])

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
