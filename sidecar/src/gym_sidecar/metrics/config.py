"""Configuration of derived metrics (owned by metrics/).

Every limit here is explicit and counted when it engages: the cardinality limit sends
points to an overflow series and increments ``gym_sidecar_limit_hits{limit=
"metrics.cardinality_limit"}`` and ``gym_sidecar_derived_overflow_points``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Literal

import gym_telemetry_semconv as semconv

from gym_sidecar.configmodel import Field, Section, field_validator

MAX_BUCKETS = 64
"""Most explicit bucket boundaries a histogram may have (keeps points small)."""

DEFAULT_ROLLOUT_BUCKETS_MS: tuple[float, ...] = (
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    1_200_000,
    1_800_000,
    3_600_000,
)
"""Rollouts: half a second to an hour (seconds to tens of minutes is the usual range)."""

DEFAULT_VERIFY_BUCKETS_MS: tuple[float, ...] = (
    1,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    30_000,
    60_000,
    120_000,
    300_000,
)
"""Verifications: a millisecond (string match) to five minutes (sandboxed test runs)."""


DEFAULT_REWARD_BUCKETS: tuple[float, ...] = (
    0,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    1,
    2,
    5,
    10,
)
"""Rewards (``gym.verify.reward``, ``gym.env.step.reward``): mostly in [0, 1], a binary
reward lands exactly on the bounds 0 and 1 (bounds are inclusive upper bounds), with room
for larger shaped rewards; a negative reward is counted in the first bucket (``le="0"``)
and in the sum (no bound may be negative: see ``_check_buckets``)."""

DEFAULT_TURNS_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100, 200, 500)
"""Model calls per rollout (``gym.rollout.turns``)."""

DEFAULT_TOKEN_BUCKETS: tuple[float, ...] = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
"""Tokens (``gen_ai.client.token.usage`` per call, ``gym.rollout.tokens`` per rollout):
OpenTelemetry's GenAI conventions' ExplicitBucketBoundaries for token usage."""

DEFAULT_MODEL_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""Model-call durations (``gen_ai.client.operation.duration``), s: OpenTelemetry's GenAI
conventions' boundaries."""

DEFAULT_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
"""Time to the first chunk of a streamed model call (``gen_ai.server.time_to_first_token``),
s: OpenTelemetry's GenAI conventions' boundaries for that metric."""

DEFAULT_MAX_LABEL_SETS = 100
"""Distinct point-attribute sets each RL metric keeps (``max_label_sets``)."""

RL_METRICS: tuple[str, ...] = (
    semconv.METRIC_VERIFY_REWARD,
    semconv.METRIC_ENV_STEP_REWARD,
    semconv.METRIC_GEN_AI_TOKEN_USAGE,
    semconv.METRIC_GEN_AI_OPERATION_DURATION,
    semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN,
    semconv.METRIC_ROLLOUT_TURNS,
    semconv.METRIC_ROLLOUT_TOKENS,
    semconv.METRIC_HTTP_CLIENT_RETRIES,
    semconv.METRIC_HTTP_CLIENT_TIMEOUTS,
)
"""The metrics of the RL view (issue 41) the derive stage computes from spans."""


OWNED_PREFIXES: tuple[str, ...] = ("gym.rollout.", "gym.verify.", "gym.env.step.")
"""The metric names the sidecar owns: the namespaces of what it derives."""


def _floats(bounds: tuple[float, ...]) -> Callable[[], list[float]]:
    """A default factory: the bounds as floats, as a configured list is validated (and as
    ``check-config`` shows them: ``500.0``, not ``500``)."""
    return lambda: [float(b) for b in bounds]


class OwnedMetricsConfig(Section):
    """The ``metrics.owned`` section: what happens to another producer's metrics named
    like the ones the sidecar derives (``metrics/ownership.py``)."""

    action: Literal["rename", "drop", "keep"] = "rename"
    """``rename``: to ``rename_prefix`` + the name without ``gym.``; ``drop``: removed;
    ``keep``: unchanged (two producers per name)."""
    prefixes: list[str] = Field(default_factory=lambda: list(OWNED_PREFIXES))
    """Names starting with one of these are the sidecar's."""
    rename_prefix: str = Field(default="gym.inprocess.", min_length=1)
    """What a renamed copy's name starts with (``gym.rollout.duration_ms`` ->
    ``gym.inprocess.rollout.duration_ms``)."""

    @field_validator("prefixes")
    @classmethod
    def _check_prefixes(cls, value: list[str]) -> list[str]:
        if any(not p for p in value):
            raise ValueError("an owned prefix must not be empty (it would own every name)")
        return value


class MetricsConfig(Section):
    """The ``metrics`` section: how spans become ``gym.rollout.*`` / ``gym.verify.*``."""

    enabled: bool = True
    """False: the derive stage passes everything on and records nothing."""
    interval_s: float = Field(default=10.0, gt=0)
    """metrics_interval_s: how often derived metrics are exported (and the window of
    ``gym.verify.success_rate``)."""
    temporality: Literal["cumulative", "delta"] = "cumulative"
    """Aggregation temporality of the exported histograms and the counter."""
    cardinality_limit: int = Field(default=2000, ge=2, le=1_000_000)
    """Most series per metric, the overflow series included: past ``limit - 1`` distinct
    (resource, attributes) sets, new sets go to one series ``otel.metric.overflow=true``."""
    rollout_buckets_ms: list[float] = Field(default_factory=_floats(DEFAULT_ROLLOUT_BUCKETS_MS))
    """Explicit bucket upper bounds (inclusive) of ``gym.rollout.duration_ms``."""
    verify_buckets_ms: list[float] = Field(default_factory=_floats(DEFAULT_VERIFY_BUCKETS_MS))
    """Explicit bucket upper bounds (inclusive) of ``gym.verify.duration_ms``."""
    reward_buckets: list[float] = Field(default_factory=_floats(DEFAULT_REWARD_BUCKETS))
    """Bucket upper bounds (inclusive) of ``gym.verify.reward`` and ``gym.env.step.reward``."""
    turns_buckets: list[float] = Field(default_factory=_floats(DEFAULT_TURNS_BUCKETS))
    """Bucket upper bounds of ``gym.rollout.turns``."""
    token_buckets: list[float] = Field(default_factory=_floats(DEFAULT_TOKEN_BUCKETS))
    """Bucket upper bounds of ``gen_ai.client.token.usage`` and ``gym.rollout.tokens``."""
    model_duration_buckets_s: list[float] = Field(
        default_factory=_floats(DEFAULT_MODEL_DURATION_BUCKETS_S)
    )
    """Bucket upper bounds of ``gen_ai.client.operation.duration`` (s)."""
    ttft_buckets_s: list[float] = Field(default_factory=_floats(DEFAULT_TTFT_BUCKETS_S))
    """Bucket upper bounds of ``gen_ai.server.time_to_first_token`` (s)."""
    max_label_sets: int = Field(default=DEFAULT_MAX_LABEL_SETS, ge=1, le=100_000)
    """Distinct point-attribute sets an RL metric (``RL_METRICS``) keeps, across resources:
    a new set past it has its free values (model, operation, error type, target server)
    replaced by ``_OTHER``, counted in ``gym_sidecar_derived_overflow_points_total{metric}``
    and ``gym_sidecar_limit_hits_total{limit="metrics.max_label_sets"}``."""
    label_sets: dict[str, int] = Field(default_factory=dict)
    """Per-metric ``max_label_sets`` (metric name -> cap), overriding it."""
    exemplars: bool = True
    """Attach one exemplar (trace_id, span_id, value) per histogram bucket per interval."""
    max_error_type_chars: int = Field(default=128, ge=1, le=4096)
    """``error.type`` values longer than this are truncated (bounds label size)."""
    owned: OwnedMetricsConfig = Field(default_factory=OwnedMetricsConfig)
    """Other producers' copies of the derived names (Gym's own in-process metrics)."""

    @field_validator("label_sets")
    @classmethod
    def _check_label_sets(cls, value: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(value) - set(RL_METRICS))
        if unknown:
            raise ValueError(
                f"not an RL metric: {', '.join(unknown)} (one of {', '.join(RL_METRICS)})"
            )
        bad = sorted(name for name, cap in value.items() if not 1 <= cap <= 100_000)
        if bad:
            raise ValueError(f"a cap must be between 1 and 100000: {', '.join(bad)}")
        return value

    def label_set_cap(self, metric: str) -> int:
        """The label-set cap of ``metric`` (``label_sets``, else ``max_label_sets``)."""
        return self.label_sets.get(metric, self.max_label_sets)

    @field_validator(
        "rollout_buckets_ms",
        "verify_buckets_ms",
        "reward_buckets",
        "turns_buckets",
        "token_buckets",
        "model_duration_buckets_s",
        "ttft_buckets_s",
    )
    @classmethod
    def _check_buckets(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("needs at least one bucket boundary")
        if len(value) > MAX_BUCKETS:
            raise ValueError(f"at most {MAX_BUCKETS} bucket boundaries, got {len(value)}")
        if not all(math.isfinite(v) for v in value):
            raise ValueError("bucket boundaries must be finite numbers")
        if value[0] < 0:
            # OpenMetrics forbids a _sum on a histogram with a negative bucket: one such
            # histogram would make every scrape of /metrics in that format fail
            raise ValueError(
                "bucket boundaries must not be negative (a value below the first bound is "
                "counted in its bucket)"
            )
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("bucket boundaries must be strictly increasing")
        return [float(v) for v in value]
