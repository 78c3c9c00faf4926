"""The derive step (``SpanDeriver.extract`` then ``record``) against a model that adds
one point at a time, the way docs/metrics.md defines the metrics.

The deriver is free to work per block and series (it batches a block's points, counts
buckets on integer nanosecond bounds, keeps a block's exemplar candidates in a dict);
the model reads each span, computes its value in ms as ``(end - start) / 1e6``, finds
its bucket by comparing that float with the configured bounds, and adds it to its series
in span order. Both must leave the same store: every series' creation order, start time,
bucket counts, count, sum (bit for bit: floats are added in span order), min, max and
exemplars; every success-rate window; the span, invalid, nested and overflow counters
and the limit hits. Inputs are hypothesis-written derive tuples (what the scanners
hand on): durations on, just below and just above the bucket bounds, zero, huge, ends
before starts, no start, every ``succeeded`` / status / ``error.type`` case, empty ids,
other span names and scopes, several resources and blocks per request, and cardinality
limits small enough to overflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.core.traces import AttrValue, DerivedSpan, ResourceBlock, ScopeBlock, TraceRequest
from gym_sidecar.metrics import fields
from gym_sidecar.metrics.config import DEFAULT_ROLLOUT_BUCKETS_MS, RL_METRICS, MetricsConfig
from gym_sidecar.metrics.derived import (
    CARDINALITY_LIMIT_NAME,
    HOP_SPANS,
    MODEL_CALL_SPANS,
    DerivedMetrics,
)
from gym_sidecar.metrics.series import exemplar_of
from gym_sidecar.metrics.spans import SpanDeriver
from gym_sidecar.selfmetrics import SelfMetrics
from gym_telemetry_semconv import gym_dialect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

ROLLOUT_SCOPE = semconv.scope_name(semconv.GROUP_ROLLOUT)
VERIFY_SCOPE = semconv.scope_name(semconv.GROUP_VERIFY)
GYM_SCOPE = gym_dialect.SCOPE_LENS_HELPERS
"""Gym's own telemetry: rollouts, verifications and other spans in one scope."""
OK = ((semconv.VERIFY_SUCCEEDED, True),)
STATUS_ERROR = 2
T0 = 1_700_000_000_000_000_000
NAMES = {
    ROLLOUT_SCOPE: [semconv.SPAN_ROLLOUT] * 4 + [semconv.SPAN_VERIFY, "POST /run"],
    VERIFY_SCOPE: [semconv.SPAN_VERIFY] * 3 + [semconv.SPAN_ENV_STEP] * 2 + ["other"],
    "gym_telemetry.server": ["POST /run"],
    GYM_SCOPE: [semconv.SPAN_ROLLOUT] * 2
    + [semconv.SPAN_VERIFY] * 2
    + [semconv.SPAN_ENV_STEP, semconv.SPAN_MODEL_RESPONSES],
}
RESOURCES = [
    Resource(
        attributes=[KeyValue(key="service.name", value=AnyValue(string_value=f"s{i}"))]
    ).SerializeToString()
    for i in range(4)
] + [b""]


# -- the model ---------------------------------------------------------------------


@dataclass
class Series:
    key: bytes
    attrs: Any
    start: int
    counts: list[int]
    count: int = 0
    sum: float = 0.0
    lo: float = float("inf")
    hi: float = float("-inf")
    exemplars: list[Any] = field(default_factory=list)


class Model:
    """The store, one point at a time."""

    def __init__(self, cfg: MetricsConfig, clock: Any) -> None:
        self.cfg = cfg
        self.clock = clock
        self.window_start = clock()
        bounds = {
            "rollout": cfg.rollout_buckets_ms,
            "verify": cfg.verify_buckets_ms,
            "step": cfg.verify_buckets_ms,
        }
        self.bounds = bounds
        self.tables: dict[str, dict[Any, Series]] = {name: {} for name in bounds}
        self.regular = dict.fromkeys(bounds, 0)
        self.rates: dict[bytes, list[int]] = {}
        self.rate_overflow: list[int] | None = None
        self.spans = {"rollout": 0, "verify": 0, "step": 0, "nested": 0, "model_calls": 0}
        self.invalid = 0
        self.overflow = {"rollout": 0, "verify": 0, "step": 0, "rate": 0}

    def bucket(self, table: str, value: float) -> int:
        for i, bound in enumerate(self.bounds[table]):
            if value <= bound:
                return i
        return len(self.bounds[table])

    def series(self, table: str, key: bytes, attrs: Any) -> Series:
        series = self.tables[table]
        found = series.get((key, attrs))
        if found is not None:
            return found
        n = len(self.bounds[table]) + 1
        if self.regular[table] < self.cfg.cardinality_limit - 1:
            self.regular[table] += 1
            s = series[(key, attrs)] = Series(
                key, attrs, self.clock(), [0] * n, exemplars=[None] * n
            )
            return s
        self.overflow[table] += 1
        over = (b"", (("otel.metric.overflow", True),))
        if over not in series:
            series[over] = Series(*over, self.clock(), [0] * n, exemplars=[None] * n)
        return series[over]

    def request(self, request: TraceRequest) -> None:
        points: dict[str, list[Any]] = {"rollout": [], "verify": [], "step": []}
        for bi, block in enumerate(request.blocks):
            key = block.current_resource
            for si, scope in enumerate(block.scopes):
                if scope.derived is None or scope.name not in (
                    ROLLOUT_SCOPE,
                    VERIFY_SCOPE,
                    GYM_SCOPE,
                ):
                    continue
                for span in scope.derived:
                    name, start, end, trace_id, span_id, status, values = span
                    if scope.name in (ROLLOUT_SCOPE, GYM_SCOPE) and name == semconv.SPAN_ROLLOUT:
                        if values[fields.NESTED] is True:
                            self.spans["nested"] += 1
                            continue
                        table, attrs = "rollout", ()
                    elif scope.name == GYM_SCOPE and name == semconv.SPAN_MODEL_RESPONSES:
                        # a model call (metrics.rl; its own tables, not modelled here)
                        if start == 0 or end < start:
                            self.invalid += 1
                        else:
                            self.spans["model_calls"] += 1
                        continue
                    elif scope.name in (VERIFY_SCOPE, GYM_SCOPE) and name in (
                        semconv.SPAN_VERIFY,
                        semconv.SPAN_ENV_STEP,
                    ):
                        table = "verify" if name == semconv.SPAN_VERIFY else "step"
                        succeeded = values[fields.SUCCEEDED]
                        if succeeded is True or (succeeded is not False and status != STATUS_ERROR):
                            attrs = OK
                        else:
                            error = values[fields.ERROR_TYPE]
                            error = error if isinstance(error, str) else ""
                            if not error:  # Gym's own telemetry: the exception event's class
                                exc = values[fields.EXCEPTION_TYPE]
                                error = exc.split(".")[-1] if isinstance(exc, str) else ""
                            error = error[: self.cfg.max_error_type_chars] or "_OTHER"
                            attrs = ((semconv.ERROR_TYPE, error), (semconv.VERIFY_SUCCEEDED, False))
                    else:
                        continue
                    if start == 0 or end < start:
                        self.invalid += 1
                        continue
                    value = (end - start) / 1e6
                    bucket = self.bucket(table, value)
                    points[table].append(
                        ((bi, si), key, attrs, value, end, trace_id, span_id, bucket)
                    )
        for table in ("rollout", "verify", "step"):
            # A ScopeSpans block's last span of each bucket of each series is its
            # exemplar candidate.
            last = {(p[0], p[1], p[2], p[7]): i for i, p in enumerate(points[table])}
            candidates = set(last.values()) if self.cfg.exemplars else set()
            for i, (_, key, attrs, value, end, trace_id, span_id, bucket) in enumerate(
                points[table]
            ):
                s = self.series(table, key, attrs)
                s.counts[bucket] += 1
                s.count += 1
                s.sum += value
                s.lo = min(s.lo, value)
                s.hi = max(s.hi, value)
                if i in candidates and trace_id and span_id:
                    s.exemplars[bucket] = (value, end, trace_id, span_id)
                if table == "verify":
                    window = self.rates.get(key)
                    if window is None:
                        if len(self.rates) < self.cfg.cardinality_limit - 1:
                            window = self.rates[key] = [0, 0]
                        else:
                            self.overflow["rate"] += 1
                            if self.rate_overflow is None:
                                self.rate_overflow = [0, 0]
                            window = self.rate_overflow
                    window[0] += attrs == OK
                    window[1] += 1
                self.spans[table] += 1


def unclock_rl(store: DerivedMetrics) -> None:
    """The model ticks its clock once per series it creates; the RL tables' series (not
    modelled) must not take ticks from it: they read a clock of their own."""
    for table in [*store.rl.histograms, *store.rl.sums]:
        table._clock_ns = lambda: 0


def store_state(store: DerivedMetrics, metrics: SelfMetrics) -> dict[str, Any]:
    def table(t: Any) -> list[Any]:
        return [
            (
                *(s.resource_key, s.attrs, s.start_time_ns, list(s.bucket_counts), s.count),
                *(s.sum, s.win_min, s.win_max, list(s.exemplars)),
            )
            for s in t
        ]

    return {
        "rollout": table(store.rollout),
        "verify": table(store.verify),
        "step": table(store.env_step),
        "rates": [(w.resource_key, w.attrs, w.ok, w.total) for w in store.rates],
        "spans": dict(store.spans),
        "invalid": store.invalid_spans,
        # the model calls' own tables (metrics.rl) are not modelled: their overflow is
        # left out, and so are the cardinality-limit hits they caused (one per point)
        "overflow": {k: n for k, n in store.overflow_points.items() if k not in RL_METRICS},
        "limit_hits": (
            (
                metrics.registry.get_sample_value(
                    "gym_sidecar_limit_hits_total", {"limit": CARDINALITY_LIMIT_NAME}
                )
                or 0.0
            )
            - sum(store.overflow_points[k] for k in RL_METRICS)
        ),
    }


def model_state(model: Model) -> dict[str, Any]:
    def table(name: str) -> list[Any]:
        return [
            (s.key, s.attrs, s.start, s.counts, s.count, s.sum, s.lo, s.hi, s.exemplars)
            for s in model.tables[name].values()
        ]

    overflowed = model.overflow
    rates = [(k, (), ok, total) for k, (ok, total) in model.rates.items()]
    if model.rate_overflow is not None:
        rates.append((b"", (("otel.metric.overflow", True),), *model.rate_overflow))
    hits = 2 * (overflowed["verify"] + overflowed["step"]) + overflowed["rollout"]
    hits += overflowed["rate"]
    return {
        "rollout": table("rollout"),
        "verify": table("verify"),
        "step": table("step"),
        "rates": rates,
        "spans": {
            semconv.SPAN_ROLLOUT: model.spans["rollout"],
            semconv.SPAN_VERIFY: model.spans["verify"],
            semconv.SPAN_ENV_STEP: model.spans["step"],
            "gym.rollout.nested": model.spans["nested"],
            # the model's spans carry no RL attribute and no scope of model calls or hops
            MODEL_CALL_SPANS: model.spans["model_calls"],
            HOP_SPANS: 0,
        },
        "invalid": model.invalid,
        "overflow": {
            semconv.METRIC_ROLLOUT_DURATION: overflowed["rollout"],
            semconv.METRIC_VERIFY_DURATION: overflowed["verify"],
            semconv.METRIC_VERIFY_COUNT: overflowed["verify"],
            semconv.METRIC_VERIFY_SUCCESS_RATE: overflowed["rate"],
            semconv.METRIC_ENV_STEP_DURATION: overflowed["step"],
            semconv.METRIC_ENV_STEP_COUNT: overflowed["step"],
            # the live metrics get no points from spans
            semconv.METRIC_ROLLOUT_IN_FLIGHT: 0,
            semconv.METRIC_ROLLOUT_STALLED: 0,
            semconv.METRIC_ROLLOUT_LOST: 0,
            semconv.METRIC_EVENT_LOOP_LAG: 0,
        },
        "limit_hits": float(hits),
    }


# -- the inputs --------------------------------------------------------------------

bounds_lists = st.one_of(
    st.just(None),  # the defaults (integers, as the config's default factory gives them)
    st.lists(
        st.one_of(
            st.floats(min_value=0.0, max_value=4e6, allow_nan=False),  # none negative
            st.sampled_from([0.0, 1e-6, 0.0015, 0.1, 1.0, 2.5, 1e13, 2e13]),
        ),
        min_size=1,
        max_size=6,
        unique=True,
    ).map(sorted),
)


NOTHING: tuple[AttrValue, ...] = (None,) * (fields.EXCEPTION_TYPE + 1)
"""A span's derive values with no attribute set (``metrics.fields`` layout)."""


def values(
    nested: AttrValue, succeeded: AttrValue, error: AttrValue, exception: AttrValue
) -> tuple[AttrValue, ...]:
    """Derive values with these four set (the RL attributes absent)."""
    out = list(NOTHING)
    out[fields.NESTED], out[fields.SUCCEEDED] = nested, succeeded
    out[fields.ERROR_TYPE], out[fields.EXCEPTION_TYPE] = error, exception
    return tuple(out)


@st.composite
def durations(draw: st.DrawFn, bounds: list[float]) -> int:
    kind = draw(st.sampled_from(["near", "near", "any", "zero", "huge"]))
    if kind == "near" and bounds:
        bound = draw(st.sampled_from(bounds))
        base = max(0, min(round(bound * 1e6), 2**63))
        return max(0, base + draw(st.integers(-3, 3)))
    if kind == "zero":
        return 0
    if kind == "huge":
        return draw(st.integers(2**53 - 5, 2**62))
    return draw(st.integers(0, 5_000_000_000_000))


@st.composite
def spans(draw: st.DrawFn, scope: str, bounds: list[float]) -> DerivedSpan:
    name = draw(st.sampled_from(NAMES.get(scope, ["x"])))
    start = draw(st.sampled_from([T0, T0, T0 + 123_456_789, 0, 1]))
    duration = draw(durations(bounds))
    end = start + duration if draw(st.integers(0, 9)) else max(0, start - 1)
    ids = draw(
        st.sampled_from(
            [
                (b"\x01" * 16, b"\x02" * 8),
                (b"\x03" * 16, b"\x04" * 8),
                (b"", b"\x02" * 8),
                (b"\x01" * 16, b""),
                (b"", b""),
            ]
        )
    )
    status = draw(st.sampled_from([0, 1, 2, 2]))
    nested = draw(st.sampled_from([None, None, True, False, "true", 1]))
    succeeded = draw(st.sampled_from([None, True, True, False, "false", 0, 1]))
    error = draw(st.sampled_from([None, "ValueError", "judge_failed", "", 7, b"x", "E" * 200]))
    exception = draw(st.sampled_from([None, "a.b.Crash", "Crash", "", ".", 3]))
    return (name, start, end, ids[0], ids[1], status, values(nested, succeeded, error, exception))


@st.composite
def requests(draw: st.DrawFn, cfg: MetricsConfig) -> TraceRequest:
    blocks = []
    for _ in range(draw(st.integers(1, 3))):
        scopes = []
        for _ in range(draw(st.integers(0, 3))):
            scope = draw(
                st.sampled_from([ROLLOUT_SCOPE, VERIFY_SCOPE, GYM_SCOPE, "gym_telemetry.server"])
            )
            bounds = list(
                cfg.rollout_buckets_ms if scope == ROLLOUT_SCOPE else cfg.verify_buckets_ms
            )
            derived = draw(st.lists(spans(scope, bounds), max_size=12))
            scopes.append(ScopeBlock(0, 0, scope, len(derived), derived))
        resource = draw(st.sampled_from([*RESOURCES, None]))
        blocks.append(ResourceBlock(0, 0, resource, scopes, []))
    return TraceRequest(b"", blocks, [])


@st.composite
def cases(draw: st.DrawFn) -> tuple[MetricsConfig, list[TraceRequest]]:
    config: dict[str, Any] = {
        "cardinality_limit": draw(st.integers(2, 6)),
        "exemplars": draw(st.booleans()),
        "max_error_type_chars": draw(st.sampled_from([3, 128])),
    }
    for key in ("rollout_buckets_ms", "verify_buckets_ms"):
        bounds = draw(bounds_lists)
        if bounds is not None:
            config[key] = bounds
    cfg = MetricsConfig(**config)
    return cfg, draw(st.lists(requests(cfg), min_size=1, max_size=4))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        self.now += 7
        return self.now


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases())
def test_the_deriver_records_what_the_per_point_model_records(
    case: tuple[MetricsConfig, list[TraceRequest]],
) -> None:
    cfg, reqs = case
    metrics = SelfMetrics()
    store = DerivedMetrics(cfg, metrics, clock_ns=Clock())
    unclock_rl(store)
    deriver = SpanDeriver(store)
    model = Model(cfg, Clock())
    for req in reqs:
        pending = deriver.extract(req)
        if pending is not None:
            deriver.record(pending)
        model.request(req)
    assert store_state(store, metrics) == model_state(model)


def test_the_default_bounds_are_floats_and_compare_as_the_model_does() -> None:
    """The config's default bounds are the integers it lists, as floats (as a configured
    list is validated): a duration of exactly a bound, and a nanosecond either side, land
    where ``value <= bound`` with the float value puts them."""
    assert all(type(b) is float for b in MetricsConfig().rollout_buckets_ms)
    assert MetricsConfig().rollout_buckets_ms == list(DEFAULT_ROLLOUT_BUCKETS_MS)
    bound = DEFAULT_ROLLOUT_BUCKETS_MS[0]
    derived: list[DerivedSpan] = [
        (semconv.SPAN_ROLLOUT, T0, T0 + int(bound * 1_000_000) + delta, b"t", b"s", 0, NOTHING)
        for delta in (-1, 0, 1)
    ]
    req = TraceRequest(
        b"",
        [ResourceBlock(0, 0, RESOURCES[0], [ScopeBlock(0, 0, ROLLOUT_SCOPE, 3, derived)], [])],
        [],
    )
    store = DerivedMetrics(MetricsConfig())
    deriver = SpanDeriver(store)
    pending = deriver.extract(req)
    assert pending is not None
    deriver.record(pending)
    [series] = list(store.rollout)
    assert series.bucket_counts[:2] == [2, 1]


@pytest.mark.parametrize("last_has_ids", [True, False])
def test_series_of_one_block_meeting_in_overflow_add_in_span_order(last_has_ids: bool) -> None:
    """Failures of two ``error.type`` s in one block, both past the cardinality limit,
    land in one overflow series: their values are summed in span order (0.1 + 0.1 + 0.4
    is not 0.1 + 0.4 + 0.1 in floats) and the bucket's exemplar is the last span in it
    that has ids, whichever series it came from."""

    def failed(error: str, ms: float, ids: bytes) -> DerivedSpan:
        end = T0 + round(ms * 1_000_000)
        return (
            semconv.SPAN_VERIFY,
            T0,
            end,
            ids * 16 if ids else b"",
            ids * 8,
            2,
            values(None, False, error, None),
        )

    ok: DerivedSpan = (semconv.SPAN_VERIFY, T0, T0 + 5, b"\x09" * 16, b"\x09" * 8, 0, NOTHING)
    last = failed("A", 0.4, b"\x03" if last_has_ids else b"")
    derived = [ok, failed("A", 0.1, b"\x01"), failed("B", 0.1, b"\x02"), last]
    block = ScopeBlock(0, 0, VERIFY_SCOPE, len(derived), derived)
    req = TraceRequest(b"", [ResourceBlock(0, 0, RESOURCES[0], [block], [])], [])
    cfg = MetricsConfig(cardinality_limit=2)
    metrics = SelfMetrics()
    store = DerivedMetrics(cfg, metrics, clock_ns=Clock())
    unclock_rl(store)
    deriver = SpanDeriver(store)
    pending = deriver.extract(req)
    assert pending is not None
    deriver.record(pending)
    model = Model(cfg, Clock())
    model.request(req)
    assert store_state(store, metrics) == model_state(model)
    overflow = list(store.verify)[-1]
    assert overflow.sum == 0.1 + 0.1 + 0.4 != 0.1 + 0.4 + 0.1
    assert overflow.exemplars[0] == exemplar_of(last if last_has_ids else derived[2])
