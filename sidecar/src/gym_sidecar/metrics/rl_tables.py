"""The RL view's series (issue 41): one table per metric, its label-set cap, recording.

Each histogram (``metrics.rl.HISTOGRAMS``) and sum (``metrics.rl.SUMS``) has a table keyed
by (resource, point attributes) like the duration metrics' (``series.HistogramTable``,
``series.CounterTable``: at most ``cardinality_limit`` series, then one
``otel.metric.overflow=true`` series), and in front of it a :class:`~.series.LabelCap`:
at most ``max_label_sets`` (``label_sets`` per metric) distinct point-attribute sets per
metric across resources; a new set past the cap has its free values (request model,
operation name, error type, target server) replaced by ``_OTHER``. Both are counted in
``overflow_points[metric]`` and ``limit_hits``.

Points of one block that meet in one series (two capped models, say) are added run by
run, not in span order as the duration metrics' overflow path does: a histogram's sum
may then differ in its last bits from adding the points one at a time.

Thread-safety: none here; :class:`~.derived.DerivedMetrics` calls under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.metrics.rl import HISTOGRAMS, SUMS, RlPending
from gym_sidecar.metrics.series import CounterTable, HistogramTable, LabelCap

LABEL_SETS_LIMIT_NAME: Final = "metrics.max_label_sets"
"""The ``limit`` label under which capped points are counted in ``limit_hits``."""

_FIXED: Final = frozenset({semconv.GEN_AI_TOKEN_TYPE})
"""Attributes with a closed set of values: never capped."""

UNITS: Final[dict[str, str]] = {
    semconv.METRIC_VERIFY_REWARD: "1",
    semconv.METRIC_ENV_STEP_REWARD: "1",
    semconv.METRIC_GEN_AI_TOKEN_USAGE: "{token}",
    semconv.METRIC_GEN_AI_OPERATION_DURATION: "s",
    semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN: "s",
    semconv.METRIC_ROLLOUT_TURNS: "{turn}",
    semconv.METRIC_ROLLOUT_TOKENS: "{token}",
    semconv.METRIC_HTTP_CLIENT_RETRIES: "{retry}",
    semconv.METRIC_HTTP_CLIENT_TIMEOUTS: "{timeout}",
}

DESCRIPTIONS: Final[dict[str, str]] = {
    semconv.METRIC_VERIFY_REWARD: "Reward of gym.verify spans (nemo.gym.reward), by succeeded.",
    semconv.METRIC_ENV_STEP_REWARD: "Reward of gym.env.step spans (one gymnasium /step).",
    semconv.METRIC_GEN_AI_TOKEN_USAGE: (
        "Tokens per model call, at the Gym model server it reached, by gen_ai.token.type."
    ),
    semconv.METRIC_GEN_AI_OPERATION_DURATION: (
        "Duration of a model call at the Gym model server it reached."
    ),
    semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN: (
        "Time from a streamed model call's start to its first chunk (successful calls)."
    ),
    semconv.METRIC_ROLLOUT_TURNS: "Model calls per rollout, per agent server.",
    semconv.METRIC_ROLLOUT_TOKENS: "Tokens per rollout, per agent server, by gen_ai.token.type.",
    semconv.METRIC_HTTP_CLIENT_RETRIES: "Requests Gym sent again on hops, by target server.",
    semconv.METRIC_HTTP_CLIENT_TIMEOUTS: "Hops that ended in a timeout, by target server.",
}


def _floats(bounds: list[float]) -> list[float]:
    return [float(b) for b in bounds]


class RlTables:
    """Every RL series of one sidecar (module doc)."""

    def __init__(
        self,
        cfg: MetricsConfig,
        clock_ns: Callable[[], int],
        on_overflow: Callable[[tuple[str, ...], int], None],
        on_capped: Callable[[str, int], None],
        resources: dict[bytes, Resource],
    ) -> None:
        reward = _floats(cfg.reward_buckets)
        tokens = _floats(cfg.token_buckets)
        bounds_of = {
            semconv.METRIC_VERIFY_REWARD: reward,
            semconv.METRIC_ENV_STEP_REWARD: reward,
            semconv.METRIC_GEN_AI_TOKEN_USAGE: tokens,
            semconv.METRIC_GEN_AI_OPERATION_DURATION: _floats(cfg.model_duration_buckets_s),
            semconv.METRIC_GEN_AI_TIME_TO_FIRST_TOKEN: _floats(cfg.ttft_buckets_s),
            semconv.METRIC_ROLLOUT_TURNS: _floats(cfg.turns_buckets),
            semconv.METRIC_ROLLOUT_TOKENS: tokens,
        }
        self.histograms = [
            HistogramTable(
                metric_names=(name,),
                bounds=bounds_of[name],
                cardinality_limit=cfg.cardinality_limit,
                clock_ns=clock_ns,
                on_overflow=on_overflow,
                resources=resources,
            )
            for name in HISTOGRAMS
        ]
        self.bounds = [table.bounds for table in self.histograms]
        """Per histogram (index), its bounds (``RlExtractor``'s)."""
        self.sums = [
            CounterTable(
                metric_name=name,
                cardinality_limit=cfg.cardinality_limit,
                clock_ns=clock_ns,
                on_overflow=on_overflow,
                resources=resources,
            )
            for name in SUMS
        ]
        self.histogram_caps = [LabelCap(cfg.label_set_cap(n), _FIXED) for n in HISTOGRAMS]
        self.sum_caps = [LabelCap(cfg.label_set_cap(n), _FIXED) for n in SUMS]
        self._on_capped = on_capped
        self.invalid_values = 0
        """Values of the wrong type or range (no point)."""
        self.model_calls = 0
        """Model-call spans derived."""
        self.hops = 0
        """Retried or failed hops derived."""

    def record(self, pending: RlPending) -> None:
        """Add ``pending``'s points (call under the store's lock)."""
        self.invalid_values += pending.invalid
        self.model_calls += pending.model_calls
        self.hops += pending.hops
        for metric, points in pending.runs:
            n = len(points.values)
            cap = self.histogram_caps[metric]
            attrs = cap.admit(points.attrs, n)
            if attrs is not points.attrs:
                self._on_capped(HISTOGRAMS[metric], n)
            self.histograms[metric].get(points.key, attrs, n).add(points)
        for metric, key, attrs, amount in pending.sums:
            cap = self.sum_caps[metric]
            capped = cap.admit(attrs, amount)
            if capped is not attrs:
                self._on_capped(SUMS[metric], amount)
            self.sums[metric].add(key, capped, amount)
