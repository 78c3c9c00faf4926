"""Turn a :class:`~gym_sidecar.metrics.derived.Snapshot` into an OTLP metrics request.

One ResourceMetrics per resource (overflow series under an empty resource), one
ScopeMetrics named :data:`SCOPE_NAME` in each, and in it the metrics that have points
for that resource:

- ``gym.rollout.duration_ms``, ``gym.verify.duration_ms``: Histogram, unit ``ms``,
  explicit bounds, exemplars with trace_id/span_id.
- ``gym.verify.count``: monotonic Sum, unit ``{verification}``.
- ``gym.verify.success_rate``: Gauge, unit ``1``; ``start_time_unix_nano`` is the start
  of the window the fraction covers.
- ``gym.env.step.duration_ms`` (Histogram, ``ms``) and ``gym.env.step.count`` (monotonic
  Sum, ``{step}``): gymnasium-style ``/step`` calls, attributes as ``gym.verify.*``.
- the RL view's (``metrics.rl``; units and descriptions in ``metrics.rl_tables``):
  Histograms ``gym.verify.reward``, ``gym.env.step.reward`` (``1``),
  ``gen_ai.client.token.usage`` (``{token}``), ``gen_ai.client.operation.duration``,
  ``gen_ai.server.time_to_first_token`` (``s``), ``gym.rollout.turns`` (``{turn}``),
  ``gym.rollout.tokens`` (``{token}``); monotonic Sums ``gym.http.client.retries``,
  ``gym.http.client.timeouts``.
- ``gym.rollout.in_flight``, ``gym.rollout.stalled`` (Gauge, ``{rollout}``, integer) and
  ``gym.rollout.lost`` (monotonic Sum, ``{rollout}``): per agent server, from the live
  tracker; ``gym.server.event_loop.lag_ms`` (Histogram, ``ms``, no ``min``: the
  heartbeats carry none) per server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Metric,
    ScopeMetrics,
)

from gym_sidecar import __version__
from gym_sidecar.metrics.derived import GaugePoint, HistogramPoint, Snapshot, SumPoint
from gym_sidecar.metrics.rl_tables import DESCRIPTIONS as RL_DESCRIPTIONS
from gym_sidecar.metrics.rl_tables import UNITS as RL_UNITS
from gym_sidecar.metrics.series import Attrs

SCOPE_NAME: Final = "gym_sidecar.derived"
"""Instrumentation scope of every derived metric."""

UNIT_MS: Final = "ms"
UNIT_VERIFICATIONS: Final = "{verification}"
UNIT_RATIO: Final = "1"
UNIT_STEPS: Final = "{step}"
UNIT_ROLLOUTS: Final = "{rollout}"

DESCRIPTIONS: Final[dict[str, str]] = {
    semconv.METRIC_ROLLOUT_DURATION: "Duration of gym.rollout spans (one agent /run).",
    semconv.METRIC_VERIFY_DURATION: "Duration of gym.verify spans (one /verify call).",
    semconv.METRIC_VERIFY_COUNT: "Verifications, by whether the call completed (succeeded).",
    semconv.METRIC_VERIFY_SUCCESS_RATE: (
        "Fraction of verifications that completed, over the last export interval."
    ),
    semconv.METRIC_ENV_STEP_DURATION: "Duration of gym.env.step spans (one gymnasium /step).",
    semconv.METRIC_ENV_STEP_COUNT: "Environment steps, by whether the call completed (succeeded).",
    **RL_DESCRIPTIONS,
    semconv.METRIC_ROLLOUT_IN_FLIGHT: "Rollouts started and not ended (live events).",
    semconv.METRIC_ROLLOUT_STALLED: (
        "In-flight rollouts with no activity for rollouts.stall_after_s (live events)."
    ),
    semconv.METRIC_ROLLOUT_LOST: (
        "In-flight rollouts whose server stopped, restarted or went silent (live events)."
    ),
    semconv.METRIC_EVENT_LOOP_LAG: (
        "How late the server's event loop ran a timer callback (agent heartbeats), ms."
    ),
}

_CUMULATIVE: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_DELTA: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA


def _set_attrs(target: Iterable[KeyValue], attrs: Attrs) -> None:
    for key, value in attrs:
        kv = target.add()  # type: ignore[attr-defined]
        kv.key = key
        if isinstance(value, bool):
            kv.value.bool_value = value
        else:
            kv.value.string_value = value


class _Group:
    """The metrics of one resource, created in the order they are first needed."""

    def __init__(self, scope: ScopeMetrics) -> None:
        self.scope = scope
        self.metrics: dict[str, Metric] = {}

    def metric(self, name: str, unit: str) -> Metric:
        m = self.metrics.get(name)
        if m is None:
            m = self.scope.metrics.add()
            m.name = name
            m.unit = unit
            m.description = DESCRIPTIONS[name]
            self.metrics[name] = m
        return m


def build_request(snap: Snapshot, bounds: dict[str, list[float]]) -> ExportMetricsServiceRequest:
    """The OTLP request for ``snap``. ``bounds`` maps histogram names to their bounds."""
    req = ExportMetricsServiceRequest()
    groups: dict[bytes, _Group] = {}
    temporality = _DELTA if snap.delta else _CUMULATIVE

    def group(resource_key: bytes) -> _Group:
        g = groups.get(resource_key)
        if g is None:
            rm = req.resource_metrics.add()
            rm.resource.CopyFrom(snap.resources[resource_key])
            sm = rm.scope_metrics.add()
            sm.scope.name = SCOPE_NAME
            sm.scope.version = __version__
            g = groups[resource_key] = _Group(sm)
        return g

    for name, points in (
        (semconv.METRIC_ROLLOUT_DURATION, snap.rollout_duration),
        (semconv.METRIC_VERIFY_DURATION, snap.verify_duration),
        (semconv.METRIC_ENV_STEP_DURATION, snap.env_step_duration),
        (semconv.METRIC_EVENT_LOOP_LAG, snap.event_loop_lag),
    ):
        for p in points:
            m = group(p.resource_key).metric(name, UNIT_MS)
            m.histogram.aggregation_temporality = temporality
            _histogram_point(m, p, bounds[name], snap.time_ns)
    for sp in snap.verify_count:
        m = group(sp.resource_key).metric(semconv.METRIC_VERIFY_COUNT, UNIT_VERIFICATIONS)
        m.sum.aggregation_temporality = temporality
        m.sum.is_monotonic = True
        _sum_point(m, sp, snap.time_ns)
    for sp in snap.env_step_count:
        m = group(sp.resource_key).metric(semconv.METRIC_ENV_STEP_COUNT, UNIT_STEPS)
        m.sum.aggregation_temporality = temporality
        m.sum.is_monotonic = True
        _sum_point(m, sp, snap.time_ns)
    for name, hp in snap.rl_histograms:
        m = group(hp.resource_key).metric(name, RL_UNITS[name])
        m.histogram.aggregation_temporality = temporality
        _histogram_point(m, hp, bounds[name], snap.time_ns)
    for name, sp in snap.rl_sums:
        m = group(sp.resource_key).metric(name, RL_UNITS[name])
        m.sum.aggregation_temporality = temporality
        m.sum.is_monotonic = True
        _sum_point(m, sp, snap.time_ns)
    for gp in snap.success_rate:
        m = group(gp.resource_key).metric(semconv.METRIC_VERIFY_SUCCESS_RATE, UNIT_RATIO)
        _gauge_point(m, gp, snap.time_ns)
    for name, gauges in (
        (semconv.METRIC_ROLLOUT_IN_FLIGHT, snap.rollout_in_flight),
        (semconv.METRIC_ROLLOUT_STALLED, snap.rollout_stalled),
    ):
        for gp in gauges:
            m = group(gp.resource_key).metric(name, UNIT_ROLLOUTS)
            _gauge_point(m, gp, snap.time_ns, integer=True)
    for sp in snap.rollout_lost:
        m = group(sp.resource_key).metric(semconv.METRIC_ROLLOUT_LOST, UNIT_ROLLOUTS)
        m.sum.aggregation_temporality = temporality
        m.sum.is_monotonic = True
        _sum_point(m, sp, snap.time_ns)
    return req


def _histogram_point(m: Metric, p: HistogramPoint, bounds: list[float], now_ns: int) -> None:
    dp = m.histogram.data_points.add()
    _set_attrs(dp.attributes, p.attrs)
    dp.start_time_unix_nano = p.start_time_ns
    dp.time_unix_nano = now_ns
    dp.count = p.count
    dp.sum = p.sum
    dp.bucket_counts.extend(p.bucket_counts)
    dp.explicit_bounds.extend(bounds)
    if p.min is not None:
        dp.min = p.min
    if p.max is not None:
        dp.max = p.max
    for value, time_ns, trace_id, span_id in p.exemplars:
        ex = dp.exemplars.add()
        ex.as_double = value
        ex.time_unix_nano = time_ns
        ex.trace_id = trace_id
        ex.span_id = span_id


def _sum_point(m: Metric, p: SumPoint, now_ns: int) -> None:
    dp = m.sum.data_points.add()
    _set_attrs(dp.attributes, p.attrs)
    dp.start_time_unix_nano = p.start_time_ns
    dp.time_unix_nano = now_ns
    dp.as_int = p.value


def _gauge_point(m: Metric, p: GaugePoint, now_ns: int, *, integer: bool = False) -> None:
    dp = m.gauge.data_points.add()
    _set_attrs(dp.attributes, p.attrs)
    dp.start_time_unix_nano = p.start_time_ns
    dp.time_unix_nano = now_ns
    if integer:
        dp.as_int = int(p.value)
    else:
        dp.as_double = p.value
