"""Jaeger's Service Performance Monitoring (the UI's Monitor tab) over the store: RED
metrics per service (and operation) computed from the stored spans, as the
OpenTelemetry Collector's span-metrics connector would have derived them for Jaeger's
Prometheus, with no Prometheus.

- ``GET /api/metrics/latencies?quantile=Q``: the Q-quantile of span durations (ms);
- ``GET /api/metrics/calls``: calls per second;
- ``GET /api/metrics/errors``: the fraction of calls whose status is ERROR;
- ``GET /api/metrics/minstep``: the smallest step, in ms (1, as for Prometheus).

Parameters (Jaeger's): ``service`` (repeated, at least one), ``groupByOperation``
(``true``: a series per span name), ``spanKind`` (repeated: ``unspecified``,
``internal``, ``server``, ``client``, ``producer``, ``consumer``; default ``server``),
``endTs`` (ms since the epoch, default now), ``lookback`` (ms, default 1 h), ``step``
(ms, default 5 s), ``ratePer`` (ms, default 10 min). A point is computed every ``step``
from ``endTs - lookback`` to ``endTs``, over the spans that *ended* in the ``ratePer``
before it: their count per second, their ERROR fraction, their duration quantile
(linear between the two nearest ranks). Where that window holds no span, the calls are
0 and the error fraction and latency are ``"NaN"`` (the UI leaves a gap there, as for
Prometheus's NaN). Unlike Prometheus's histogram estimate, the quantile is exact; unlike
its ``rate()``, nothing is extrapolated.

The answer is Jaeger's ``MetricFamily`` JSON (``service_latencies``,
``service_call_rate``, ``service_error_rate``; ``service_operation_...`` when grouped by
operation), a ``GAUGE`` with labels ``service_name`` (first) and ``operation``.
Bounds: at most :data:`MAX_POINTS` points per series (Prometheus's own bound; 400
beyond) and :data:`MAX_SPANS` spans read, newest stored first (:data:`.common.LIMIT_HEADER`
says when they cut the answer).
"""

from __future__ import annotations

import bisect
import math
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gym_sidecar.query.search import parse_bool
from gym_sidecar.store import queries
from gym_sidecar.store.queries import STATUS_ERROR
from gym_sidecar.store.rows import service_of

MAX_POINTS: Final = 11_000
MAX_SPANS: Final = 200_000
"""Most spans one metrics answer reads (the most recently stored first)."""
MIN_STEP_MS: Final = 1
STORE_DELAY_NS: Final = 300 * 1_000_000_000
"""A span is stored this long after it ended at most (agent and sidecar batching): the
requests read for a window reach this far past its end."""
SPAN_KINDS: Final = {
    "unspecified": 0,
    "internal": 1,
    "server": 2,
    "client": 3,
    "producer": 4,
    "consumer": 5,
}
_MS: Final = 1_000_000
_DEFAULTS_MS: Final = {"lookback": 3_600_000, "step": 5_000, "ratePer": 600_000}
NAN: Final = "NaN"
"""A double that is not a number, as proto3 JSON writes it."""


class MetricsError(ValueError):
    """A parameter is missing or malformed; the message says which and why."""


def _parse_error(name: str, why: str) -> MetricsError:
    return MetricsError(f"unable to parse param '{name}': {why}")


@dataclass(frozen=True)
class MetricsQuery:
    services: tuple[str, ...]
    group_by_operation: bool
    span_kinds: frozenset[int]
    end_ns: int
    lookback_ns: int
    step_ns: int
    rate_per_ns: int


def _ms(params: Mapping[str, str], name: str, default: int) -> int:
    text = params.get(name, "")
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise _parse_error(name, f"not an integer: {text!r}") from None
    if value <= 0 and name != "endTs":
        raise _parse_error(name, f"must be positive, got {value}")
    return value


def parse_query(
    params: Mapping[str, str], multi: Callable[[str], list[str]], now_ns: int
) -> MetricsQuery:
    """A :class:`MetricsQuery` from the query string (``multi`` reads a repeated
    parameter's values); raises :class:`MetricsError`."""
    services = tuple(s for s in multi("service") if s)
    if not services:
        raise _parse_error("service", "please provide at least one service name")
    group = parse_bool(params.get("groupByOperation", "") or "false")
    if group is None:
        raise _parse_error("groupByOperation", "not a bool")
    kinds = multi("spanKind") or ["server"]
    unknown = [k for k in kinds if k not in SPAN_KINDS]
    if unknown:
        raise _parse_error("spanKind", f"unsupported span kind: {unknown[0]!r}")
    q = MetricsQuery(
        services=services,
        group_by_operation=group,
        span_kinds=frozenset(SPAN_KINDS[k] for k in kinds),
        end_ns=_ms(params, "endTs", now_ns // _MS) * _MS,
        lookback_ns=_ms(params, "lookback", _DEFAULTS_MS["lookback"]) * _MS,
        step_ns=_ms(params, "step", _DEFAULTS_MS["step"]) * _MS,
        rate_per_ns=_ms(params, "ratePer", _DEFAULTS_MS["ratePer"]) * _MS,
    )
    if q.lookback_ns // q.step_ns + 1 > MAX_POINTS:
        raise MetricsError(
            f"exceeded maximum resolution of {MAX_POINTS} points per timeseries: "
            "try a longer step or a shorter lookback"
        )
    return q


def parse_quantile(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _parse_error("quantile", f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise _parse_error("quantile", f"must be in [0, 1], got {text}")
    return value


Point = tuple[int, float, bool]
"""(end ns, duration ms, ERROR)."""


@dataclass
class Spans:
    """The spans a query reads, per series (service, or (service, span name)), sorted
    by end time; ``limited`` when :data:`MAX_SPANS` stopped the read."""

    series: dict[tuple[str, ...], list[Point]]
    limited: bool = False


def read_spans(conn: sqlite3.Connection, q: MetricsQuery, max_spans: int | None = None) -> Spans:
    """The spans of ``q``'s services and kinds that ended in its whole window; at most
    ``max_spans`` (:data:`MAX_SPANS`)."""
    max_spans = MAX_SPANS if max_spans is None else max_spans
    low = q.end_ns - q.lookback_ns - q.rate_per_ns
    wanted = set(q.services)
    series: dict[tuple[str, ...], list[Point]] = {}
    seen: set[bytes] = set()
    for payload in queries.window_payloads(conn, q.services, low, q.end_ns + STORE_DELAY_NS):
        for rs in ExportTraceServiceRequest.FromString(payload).resource_spans:
            service = service_of(rs.resource)
            if service not in wanted:
                continue
            for ss in rs.scope_spans:
                for span in ss.spans:
                    end = span.end_time_unix_nano
                    if span.kind not in q.span_kinds or not low < end <= q.end_ns:
                        continue
                    key = span.trace_id + span.span_id
                    if key in seen:  # a span exported twice counts once
                        continue
                    if len(seen) >= max_spans:
                        return _sorted(series, limited=True)
                    seen.add(key)
                    name = (service, span.name) if q.group_by_operation else (service,)
                    duration_ms = max(0, end - span.start_time_unix_nano) / _MS
                    series.setdefault(name, []).append(
                        (end, duration_ms, span.status.code == STATUS_ERROR)
                    )
    return _sorted(series, limited=False)


def _sorted(series: dict[tuple[str, ...], list[Point]], *, limited: bool) -> Spans:
    for points in series.values():
        points.sort()
    return Spans(dict(sorted(series.items())), limited)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _timestamp(ns: int) -> str:
    ts = Timestamp()
    ts.FromNanoseconds(ns)
    return ts.ToJsonString()


Metric = str
"""``latencies``, ``calls`` or ``errors``."""
_NAMES: Final = {
    "latencies": "service_latencies",
    "calls": "service_call_rate",
    "errors": "service_error_rate",
}


def family(
    metric: Metric, q: MetricsQuery, spans: Spans, quantile: float | None = None
) -> dict[str, Any]:
    """One ``MetricFamily`` (see the module docstring)."""
    help_text = {
        "latencies": f"{quantile or 0:.2f}th quantile latency, grouped by service",
        "calls": "calls/sec, grouped by service",
        "errors": "error rate, computed as a fraction of errors/sec over calls/sec, "
        "grouped by service",
    }[metric]
    name = _NAMES[metric]
    if q.group_by_operation:
        name = name.replace("service", "service_operation", 1)
        help_text += " & operation"
    rate_s = q.rate_per_ns / 1e9
    start = q.end_ns - q.lookback_ns
    times = range(start, q.end_ns + 1, q.step_ns)
    metrics = []
    for key, points in spans.series.items():
        ends = [p[0] for p in points]
        errors = [0]
        for p in points:
            errors.append(errors[-1] + p[2])
        values: list[dict[str, Any]] = []
        for t in times:
            lo, hi = bisect.bisect_right(ends, t - q.rate_per_ns), bisect.bisect_right(ends, t)
            n = hi - lo
            value: float | str
            if metric == "calls":
                value = n / rate_s
            elif n == 0:
                value = NAN
            elif metric == "errors":
                value = (errors[hi] - errors[lo]) / n
            else:
                value = _quantile([p[1] for p in points[lo:hi]], quantile or 0.0)
            values.append({"gaugeValue": {"doubleValue": value}, "timestamp": _timestamp(t)})
        labels = [{"name": "service_name", "value": key[0]}]
        if q.group_by_operation:
            labels.append({"name": "operation", "value": key[1]})
        metrics.append({"labels": labels, "metricPoints": values})
    return {"name": name, "type": "GAUGE", "help": help_text, "metrics": metrics}
