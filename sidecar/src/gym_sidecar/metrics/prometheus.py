"""The derived metrics in Prometheus form, for the admin ``/metrics`` endpoint.

:class:`DerivedCollector` is a ``prometheus_client`` custom collector registered on the
sidecar's :class:`~gym_sidecar.selfmetrics.SelfMetrics` registry. At each scrape it reads
the store (under its lock) and renders:

- ``gym_rollout_duration_ms`` and ``gym_verify_duration_ms``: histograms
  (``_bucket{le=...}``, ``_sum``, ``_count``); bucket exemplars (trace_id, span_id) of
  the current interval appear in the OpenMetrics format only;
- ``gym_verify_count_total``: counter;
- ``gym_env_step_duration_ms`` (histogram) and ``gym_env_step_count_total`` (counter);
- ``gym_verify_success_rate``: gauge, the fraction of the last *exported* window
  (absent when that window had no verifications);
- the RL view's (``metrics.rl``): histograms ``gym_verify_reward``,
  ``gym_env_step_reward``, ``gen_ai_client_token_usage``,
  ``gen_ai_client_operation_duration``, ``gen_ai_server_time_to_first_token``,
  ``gym_rollout_turns``, ``gym_rollout_tokens`` and counters
  ``gym_http_client_retries_total``, ``gym_http_client_timeouts_total``;
- ``gym_rollout_in_flight``, ``gym_rollout_stalled`` (gauges) and
  ``gym_rollout_lost_total`` (counter) per agent server, and the histogram
  ``gym_server_event_loop_lag_ms`` per server (the live tracker's, see
  :mod:`.live_series`);
- the stage's own counters ``gym_sidecar_derived_spans_total{span}``,
  ``gym_sidecar_derived_invalid_spans_total``,
  ``gym_sidecar_derived_overflow_points_total{metric}`` and
  ``gym_sidecar_derived_exports_total{outcome}``.

Values are cumulative since the sidecar started, whatever the OTLP temporality (that is
what Prometheus expects). Labels are the resource attributes and the point attributes,
names sanitized (``service.name`` -> ``service_name``); attributes whose sanitized names
collide are joined with ``;`` in the order of their original keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar, Sample

from gym_sidecar.metrics.derived import DerivedMetrics
from gym_sidecar.metrics.rl import HISTOGRAMS, SUMS
from gym_sidecar.metrics.rl_tables import DESCRIPTIONS as RL_DESCRIPTIONS
from gym_sidecar.metrics.series import Attrs, HistogramSeries

_INVALID: Final = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_name(name: str) -> str:
    """A Prometheus metric or label name for an OpenTelemetry name."""
    out = _INVALID.sub("_", name)
    if not out or out[0].isdigit():
        out = "key_" + out
    elif out.startswith("__"):
        out = "key" + out
    return out


def label_value(v: AnyValue) -> str:
    """An OTLP attribute value as a Prometheus label value."""
    kind = v.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "string_value":
        return v.string_value
    if kind in ("int_value", "double_value"):
        return str(getattr(v, kind))
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return json.dumps(_plain(v), sort_keys=True)


def _plain(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_plain(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def _merge(labels: dict[str, str], pairs: Iterable[tuple[str, str]]) -> None:
    for key, value in sorted(pairs):
        name = sanitize_name(key)
        labels[name] = labels[name] + ";" + value if name in labels else value


def resource_labels(resource: Resource) -> dict[str, str]:
    """Sanitized labels of a resource's attributes."""
    labels: dict[str, str] = {}
    _merge(labels, ((kv.key, label_value(kv.value)) for kv in resource.attributes))
    return labels


def point_labels(attrs: Attrs) -> dict[str, str]:
    labels: dict[str, str] = {}
    _merge(
        labels,
        ((k, ("true" if v else "false") if isinstance(v, bool) else v) for k, v in attrs),
    )
    return labels


class DerivedCollector:
    """Renders a :class:`DerivedMetrics` store at each scrape (thread-safe)."""

    def __init__(self, store: DerivedMetrics) -> None:
        self.store = store
        self._resource_labels: dict[bytes, dict[str, str]] = {}

    def describe(self) -> list[Metric]:
        """The families this collector exposes (names only), for duplicate checks."""
        return [
            HistogramMetricFamily(sanitize_name(semconv.METRIC_ROLLOUT_DURATION), ""),
            HistogramMetricFamily(sanitize_name(semconv.METRIC_VERIFY_DURATION), ""),
            CounterMetricFamily(sanitize_name(semconv.METRIC_VERIFY_COUNT), ""),
            GaugeMetricFamily(sanitize_name(semconv.METRIC_VERIFY_SUCCESS_RATE), ""),
            HistogramMetricFamily(sanitize_name(semconv.METRIC_ENV_STEP_DURATION), ""),
            CounterMetricFamily(sanitize_name(semconv.METRIC_ENV_STEP_COUNT), ""),
            *(HistogramMetricFamily(sanitize_name(name), "") for name in HISTOGRAMS),
            *(CounterMetricFamily(sanitize_name(name), "") for name in SUMS),
            GaugeMetricFamily(sanitize_name(semconv.METRIC_ROLLOUT_IN_FLIGHT), ""),
            GaugeMetricFamily(sanitize_name(semconv.METRIC_ROLLOUT_STALLED), ""),
            CounterMetricFamily(sanitize_name(semconv.METRIC_ROLLOUT_LOST), ""),
            HistogramMetricFamily(sanitize_name(semconv.METRIC_EVENT_LOOP_LAG), ""),
            CounterMetricFamily("gym_sidecar_derived_spans", ""),
            CounterMetricFamily("gym_sidecar_derived_invalid_spans", ""),
            CounterMetricFamily("gym_sidecar_derived_invalid_values", ""),
            CounterMetricFamily("gym_sidecar_derived_overflow_points", ""),
            CounterMetricFamily("gym_sidecar_derived_exports", ""),
        ]

    def _labels(self, resource_key: bytes, attrs: Attrs) -> dict[str, str]:
        base = self._resource_labels.get(resource_key)
        if base is None:
            resource = self.store.resources.get(resource_key, Resource())
            base = self._resource_labels[resource_key] = resource_labels(resource)
        return {**base, **point_labels(attrs)}

    def collect(self) -> Iterable[Metric]:
        store = self.store
        with store.lock:
            rollout = [self._hist_row(s, store.rollout.bounds) for s in store.rollout]
            verify = [self._hist_row(s, store.verify.bounds) for s in store.verify]
            counts = [(self._labels(s.resource_key, s.attrs), s.count) for s in store.verify]
            steps = [self._hist_row(s, store.env_step.bounds) for s in store.env_step]
            step_counts = [(self._labels(s.resource_key, s.attrs), s.count) for s in store.env_step]
            rates = [
                (self._labels(w.resource_key, w.attrs), w.last_rate)
                for w in store.rates
                if w.last_rate is not None
            ]
            rl_histograms = [
                [self._hist_row(s, table.bounds) for s in table] for table in store.rl.histograms
            ]
            rl_sums = [
                [(self._labels(c.resource_key, c.attrs), c.value) for c in table]
                for table in store.rl.sums
            ]
            live = [(self._labels(r.resource_key, r.attrs), r) for r in store.live]
            in_flight = [(labels, float(r.in_flight)) for labels, r in live]
            stalled = [(labels, float(r.stalled)) for labels, r in live]
            lost = [(labels, float(r.lost)) for labels, r in live]
            lag = [self._hist_row(s, store.live.lag.bounds) for s in store.live.lag]
            spans = dict(store.spans)
            invalid = store.invalid_spans
            invalid_values = store.rl.invalid_values
            overflow = dict(store.overflow_points)
            exports = dict(store.exports)
        yield _histogram(semconv.METRIC_ROLLOUT_DURATION, rollout, "Duration of gym.rollout spans.")
        yield _histogram(semconv.METRIC_VERIFY_DURATION, verify, "Duration of gym.verify spans.")
        counter = _family(
            CounterMetricFamily,
            semconv.METRIC_VERIFY_COUNT,
            "Verifications, by whether the call completed.",
            counts,
        )
        yield counter
        yield _family(
            GaugeMetricFamily,
            semconv.METRIC_VERIFY_SUCCESS_RATE,
            "Fraction of verifications that completed over the last export interval.",
            rates,
        )
        yield _histogram(semconv.METRIC_ENV_STEP_DURATION, steps, "Duration of gym.env.step spans.")
        yield _family(
            CounterMetricFamily,
            semconv.METRIC_ENV_STEP_COUNT,
            "Environment steps, by whether the call completed.",
            step_counts,
        )
        yield _family(
            GaugeMetricFamily,
            semconv.METRIC_ROLLOUT_IN_FLIGHT,
            "Rollouts started and not ended, per agent server (live events).",
            in_flight,
        )
        yield _family(
            GaugeMetricFamily,
            semconv.METRIC_ROLLOUT_STALLED,
            "In-flight rollouts with no activity for rollouts.stall_after_s.",
            stalled,
        )
        yield _family(
            CounterMetricFamily,
            semconv.METRIC_ROLLOUT_LOST,
            "In-flight rollouts whose server stopped, restarted or went silent.",
            lost,
        )
        yield _histogram(
            semconv.METRIC_EVENT_LOOP_LAG,
            lag,
            "How late each server's event loop ran a timer callback (agent heartbeats), ms.",
        )
        for name, rows in zip(HISTOGRAMS, rl_histograms, strict=True):
            yield _histogram(name, rows, RL_DESCRIPTIONS[name])
        for name, counts in zip(SUMS, rl_sums, strict=True):
            yield _family(CounterMetricFamily, name, RL_DESCRIPTIONS[name], counts)
        yield CounterMetricFamily(
            "gym_sidecar_derived_invalid_values",
            "RL attribute values of the wrong type or range (a string reward, a negative "
            "token count): no point.",
            value=invalid_values,
        )
        fam = CounterMetricFamily(
            "gym_sidecar_derived_spans", "Spans turned into derived metrics.", labels=["span"]
        )
        for name, n in spans.items():
            fam.add_metric([name], n)
        yield fam
        yield CounterMetricFamily(
            "gym_sidecar_derived_invalid_spans",
            "Rollout/verify spans skipped: no start time or end before start.",
            value=invalid,
        )
        fam = CounterMetricFamily(
            "gym_sidecar_derived_overflow_points",
            "Points sent to an overflow series: by the cardinality limit "
            "(otel.metric.overflow) or the label-set cap (_OTHER values).",
            labels=["metric"],
        )
        for name, n in overflow.items():
            fam.add_metric([name], n)
        yield fam
        fam = CounterMetricFamily(
            "gym_sidecar_derived_exports",
            "Derived-metric exports handed down the pipeline, by outcome.",
            labels=["outcome"],
        )
        for outcome, n in exports.items():
            fam.add_metric([outcome], n)
        yield fam

    def _hist_row(
        self, s: HistogramSeries, bounds: Sequence[float]
    ) -> tuple[dict[str, str], list[tuple[str, float, Exemplar | None]], float]:
        buckets: list[tuple[str, float, Exemplar | None]] = []
        running = 0
        for i, le in enumerate((*bounds, float("inf"))):
            running += s.bucket_counts[i]
            ex = s.exemplars[i]
            exemplar = (
                Exemplar({"trace_id": ex[2].hex(), "span_id": ex[3].hex()}, ex[0], ex[1] / 1e9)
                if ex is not None
                else None
            )
            buckets.append((_go_float(le), running, exemplar))
        return self._labels(s.resource_key, s.attrs), buckets, s.sum


def _go_float(value: float) -> str:
    """Bucket bound as Prometheus writes it (``+Inf``, ``1000.0``)."""
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _histogram(
    name: str,
    rows: list[tuple[dict[str, str], list[tuple[str, float, Exemplar | None]], float]],
    doc: str,
) -> Metric:
    # Samples are built one by one so each series carries only its own labels (series of
    # one metric may come from resources with different attribute keys).
    fam = HistogramMetricFamily(sanitize_name(name), doc)
    for labels, buckets, total in rows:
        for le, count, exemplar in buckets:
            fam.samples.append(
                Sample(fam.name + "_bucket", {**labels, "le": le}, count, None, exemplar)
            )
        if total < 0:
            # A negative sum (negative rewards): OpenMetrics allows no negative _sum, nor
            # a _count without one; the buckets stay, the OTLP export carries the sum.
            continue
        fam.samples.append(Sample(fam.name + "_count", labels, buckets[-1][1]))
        fam.samples.append(Sample(fam.name + "_sum", labels, total))
    return fam


def _family(
    kind: type[CounterMetricFamily] | type[GaugeMetricFamily],
    name: str,
    doc: str,
    rows: Sequence[tuple[dict[str, str], float | None]],
) -> Metric:
    fam = kind(sanitize_name(name), doc)
    suffix = "_total" if kind is CounterMetricFamily else ""
    for labels, value in rows:
        if value is not None:
            fam.samples.append(Sample(fam.name + suffix, labels, value))
    return fam
