"""The sidecar's own counters, exposed on the admin listener's ``/metrics``.

One :class:`SelfMetrics` per running sidecar owns a private Prometheus registry, so
several sidecars (or tests) in one process never share counts. Label values are
bounded: signals, reasons, stages, groups and service names (a sidecar serves one pod).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest


class SelfMetrics:
    """Counters for items received, refused, dropped and exported, plus queue state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.received = Counter(
            "gym_sidecar_received_items",
            "Spans, metric points or log records accepted from clients.",
            ["signal", "transport"],
            registry=r,
        )
        self.refused = Counter(
            "gym_sidecar_refused_items",
            "Items refused to clients (backpressure, bad input, limits).",
            ["signal", "reason"],
            registry=r,
        )
        self.dropped = Counter(
            "gym_sidecar_dropped_items",
            "Accepted items that will never be exported, by reason.",
            ["signal", "reason"],
            registry=r,
        )
        self.exported = Counter(
            "gym_sidecar_exported_items",
            "Items the backend acknowledged.",
            ["signal"],
            registry=r,
        )
        self.stage_items = Counter(
            "gym_sidecar_stage_items",
            "Items seen by each pipeline stage, by outcome (received, dropped, passed).",
            ["stage", "signal", "outcome"],
            registry=r,
        )
        self.bad_requests = Counter(
            "gym_sidecar_bad_requests",
            "Client requests answered 400/413/415 or INVALID_ARGUMENT, by transport and reason.",
            ["transport", "reason"],
            registry=r,
        )
        self.limit_hits = Counter(
            "gym_sidecar_limit_hits",
            "Times a configured limit refused or truncated input.",
            ["limit"],
            registry=r,
        )
        self.http2_refusals = Counter(
            "gym_sidecar_http2_refusals",
            "HTTP/2 connections (or streams) the gRPC receiver ended for a protocol error "
            "or one of its HTTP/2 bounds, by reason.",
            ["reason"],
            registry=r,
        )
        self.export_attempts = Counter(
            "gym_sidecar_export_attempts",
            "Export requests sent to the backend.",
            ["signal"],
            registry=r,
        )
        self.export_errors = Counter(
            "gym_sidecar_export_errors",
            "Failed export attempts, by kind (retryable, permanent).",
            ["signal", "kind"],
            registry=r,
        )
        self.queue_bytes = Gauge(
            "gym_sidecar_queue_bytes", "Bytes currently held by the export queue.", registry=r
        )
        self.queue_capacity_bytes = Gauge(
            "gym_sidecar_queue_capacity_bytes", "Configured queue bound in bytes.", registry=r
        )
        self.queue_corrupt_records = Counter(
            "gym_sidecar_queue_corrupt_records",
            "On-disk queue records found corrupt or truncated and skipped, by kind.",
            ["kind"],
            registry=r,
        )
        self.queue_replayed = Counter(
            "gym_sidecar_queue_replayed_items",
            "Items found in the on-disk queue at start and queued again for export.",
            ["signal"],
            registry=r,
        )

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)
