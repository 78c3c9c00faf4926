"""The sidecar's own counters, exposed on the admin listener's ``/metrics``.

One :class:`SelfMetrics` per running sidecar owns a private Prometheus registry, so
several sidecars (or tests) in one process never share counts. Label values are
bounded: signals, reasons, stages, groups and service names (a sidecar serves one pod).

The counters are :class:`LoopCounter` s: prometheus_client's ``Counter`` takes a lock
and makes four Python calls per ``inc``, and builds a tuple of strings under a lock per
``labels()``, where a sidecar bumps every counter from its one event loop (a request
bumps about ten). A :class:`LoopCounter` is exposed exactly as a ``Counter`` with the
same name, help and labels is (``_total`` and ``_created`` samples, in the order the
label sets were first used; ``tests/sidecar/test_selfmetrics.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric


class CounterChild:
    """One label set of a :class:`LoopCounter`."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        """Add ``amount`` (not negative: ValueError, as prometheus_client's)."""
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class LoopCounter:
    """A labelled counter for one event loop: ``labels(...)`` is a dict lookup once a
    label set was used, ``inc`` an addition, no lock.

    Thread-safety: increment from one thread (the event loop: every sidecar counter is
    bumped there); :meth:`collect` may run anywhere (it copies the series first).
    ``labels`` accepts positional or keyword label values and refuses a wrong count or
    names with ValueError, as prometheus_client's does; values are exposed as ``str()``
    of what was passed.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._by_values: dict[tuple[object, ...], CounterChild] = {}
        """Children by the positional values a caller passed (the fast path)."""
        self._series: dict[tuple[str, ...], CounterChild] = {}
        """Children by their label values as strings, in the order they were created."""
        registry.register(self)

    def labels(self, *values: object, **named: object) -> CounterChild:
        """The child of this label set (created on first use)."""
        if not named:
            child = self._by_values.get(values)
            if child is not None:
                return child
            if len(values) != len(self._labelnames):
                raise ValueError("Incorrect label count")
            strings = tuple(str(v) for v in values)
        else:
            if values:
                raise ValueError("Can't pass both *args and **kwargs")
            if sorted(named) != sorted(self._labelnames):
                raise ValueError("Incorrect label names")
            strings = tuple(str(named[n]) for n in self._labelnames)
        child = self._series.get(strings)
        if child is None:
            child = self._series[strings] = CounterChild()
        if not named:
            self._by_values[values] = child
        return child

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, "counter")]

    def collect(self) -> Iterable[Metric]:
        metric = Metric(self._name, self._documentation, "counter")
        created = prometheus_metrics._use_created  # PROMETHEUS_DISABLE_CREATED_SERIES
        for values, child in list(self._series.items()):
            labels = dict(zip(self._labelnames, values, strict=True))
            metric.add_sample(self._name + "_total", labels, child.value)
            if created:
                metric.add_sample(self._name + "_created", dict(labels), child.created)
        return [metric]


class SelfMetrics:
    """Counters for items received, refused, dropped and exported, plus queue state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.received = LoopCounter(
            "gym_sidecar_received_items",
            "Spans, metric points or log records accepted from clients.",
            ["signal", "transport"],
            r,
        )
        self.refused = LoopCounter(
            "gym_sidecar_refused_items",
            "Items refused to clients (backpressure, bad input, limits).",
            ["signal", "reason"],
            r,
        )
        self.dropped = LoopCounter(
            "gym_sidecar_dropped_items",
            "Accepted items that will never be exported, by reason.",
            ["signal", "reason"],
            r,
        )
        self.exported = LoopCounter(
            "gym_sidecar_exported_items",
            "Items the backend acknowledged.",
            ["signal"],
            r,
        )
        self.stage_items = LoopCounter(
            "gym_sidecar_stage_items",
            "Items seen by each pipeline stage, by outcome (received, dropped, passed).",
            ["stage", "signal", "outcome"],
            r,
        )
        self.bad_requests = LoopCounter(
            "gym_sidecar_bad_requests",
            "Client requests answered 400/413/415 or INVALID_ARGUMENT, by transport and reason.",
            ["transport", "reason"],
            r,
        )
        self.limit_hits = LoopCounter(
            "gym_sidecar_limit_hits",
            "Times a configured limit refused or truncated input.",
            ["limit"],
            r,
        )
        self.http2_refusals = LoopCounter(
            "gym_sidecar_http2_refusals",
            "HTTP/2 connections (or streams) the gRPC receiver ended for a protocol error "
            "or one of its HTTP/2 bounds, by reason.",
            ["reason"],
            r,
        )
        self.export_attempts = LoopCounter(
            "gym_sidecar_export_attempts",
            "Export requests sent to the backend.",
            ["signal"],
            r,
        )
        self.export_errors = LoopCounter(
            "gym_sidecar_export_errors",
            "Failed export attempts, by kind (retryable, permanent).",
            ["signal", "kind"],
            r,
        )
        self.queue_bytes = Gauge(
            "gym_sidecar_queue_bytes", "Bytes currently held by the export queue.", registry=r
        )
        self.queue_capacity_bytes = Gauge(
            "gym_sidecar_queue_capacity_bytes", "Configured queue bound in bytes.", registry=r
        )
        self.queue_corrupt_records = LoopCounter(
            "gym_sidecar_queue_corrupt_records",
            "On-disk queue records found corrupt or truncated and skipped, by kind.",
            ["kind"],
            r,
        )
        self.trace_scanner = Gauge(
            "gym_sidecar_trace_scanner_info",
            "1 for the trace scanner this sidecar runs: native (gym_sidecar_native, the "
            "fast path) or python (the fallback).",
            ["scanner"],
            registry=r,
        )
        self.queue_replayed = LoopCounter(
            "gym_sidecar_queue_replayed_items",
            "Items found in the on-disk queue at start and queued again for export.",
            ["signal"],
            r,
        )

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)
