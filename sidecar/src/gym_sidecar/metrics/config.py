"""Configuration of derived metrics (owned by metrics/).

Every limit here is explicit and counted when it engages: the cardinality limit sends
points to an overflow series and increments ``gym_sidecar_limit_hits{limit=
"metrics.cardinality_limit"}`` and ``gym_sidecar_derived_overflow_points``.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


OWNED_PREFIXES: tuple[str, ...] = ("gym.rollout.", "gym.verify.", "gym.env.step.")
"""The metric names the sidecar owns: the namespaces of what it derives."""


class OwnedMetricsConfig(BaseModel):
    """The ``metrics.owned`` section: what happens to another producer's metrics named
    like the ones the sidecar derives (``metrics/ownership.py``)."""

    model_config = ConfigDict(extra="forbid")

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


class MetricsConfig(BaseModel):
    """The ``metrics`` section: how spans become ``gym.rollout.*`` / ``gym.verify.*``."""

    model_config = ConfigDict(extra="forbid")

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
    rollout_buckets_ms: list[float] = Field(
        default_factory=lambda: list(DEFAULT_ROLLOUT_BUCKETS_MS)
    )
    """Explicit bucket upper bounds (inclusive) of ``gym.rollout.duration_ms``."""
    verify_buckets_ms: list[float] = Field(default_factory=lambda: list(DEFAULT_VERIFY_BUCKETS_MS))
    """Explicit bucket upper bounds (inclusive) of ``gym.verify.duration_ms``."""
    exemplars: bool = True
    """Attach one exemplar (trace_id, span_id, value) per histogram bucket per interval."""
    max_error_type_chars: int = Field(default=128, ge=1, le=4096)
    """``error.type`` values longer than this are truncated (bounds label size)."""
    owned: OwnedMetricsConfig = Field(default_factory=OwnedMetricsConfig)
    """Other producers' copies of the derived names (Gym's own in-process metrics)."""

    @field_validator("rollout_buckets_ms", "verify_buckets_ms")
    @classmethod
    def _check_buckets(cls, value: list[float]) -> list[float]:
        if not value:
            raise ValueError("needs at least one bucket boundary")
        if len(value) > MAX_BUCKETS:
            raise ValueError(f"at most {MAX_BUCKETS} bucket boundaries, got {len(value)}")
        if not all(math.isfinite(v) for v in value):
            raise ValueError("bucket boundaries must be finite numbers")
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError("bucket boundaries must be strictly increasing")
        return [float(v) for v in value]
