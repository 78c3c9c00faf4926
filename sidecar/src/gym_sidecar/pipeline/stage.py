"""The one interface every pipeline stage obeys.

A stage receives a :class:`Batch` (one OTLP export request, still a protobuf message),
does its one job on whole ResourceSpans / ScopeSpans blocks, and hands the batch to the
stage it holds as ``next``. Stages never convert data into SDK objects.

Contract of :meth:`Stage.consume`:
- It runs on the sidecar's event loop; it must not block on I/O (offload to a thread
  if it must touch disk).
- It may mutate the batch's message in place (enrich adds resource attributes, gate
  removes ScopeSpans blocks) and must keep ``batch.items`` equal to what is left.
- It raises :class:`Backpressure` when the data cannot be accepted now (queue full);
  the receiver turns that into RESOURCE_EXHAUSTED / HTTP 429 for the client.
- It never raises anything else for data-dependent reasons: bad data is dropped and
  counted through ``batch.reject`` so the receiver can answer ``partial_success``.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gym_sidecar.selfmetrics import SelfMetrics

ExportRequest = ExportTraceServiceRequest | ExportMetricsServiceRequest | ExportLogsServiceRequest


class Signal(enum.Enum):
    TRACES = "traces"
    METRICS = "metrics"
    LOGS = "logs"


@dataclass(slots=True)
class Batch:
    """One OTLP export request travelling through the pipeline."""

    signal: Signal
    message: ExportRequest
    items: int
    """Spans, metric data points or log records still in ``message``."""
    peer: str | None = None
    """The client's address as the receiver saw it (``ip:port``), for enrichment."""
    rejected: int = 0
    """Items rejected by a stage (reported back as ``partial_success``)."""
    rejection_messages: list[str] = field(default_factory=list)

    def reject(self, count: int, message: str) -> None:
        """Record ``count`` items as rejected, with a human-readable reason."""
        self.rejected += count
        self.items -= count
        self.rejection_messages.append(message)


class Backpressure(Exception):
    """The data cannot be accepted now; the client should retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: float, reason: str = "queue_full") -> None:
        super().__init__(f"{reason}: retry after {retry_after_s:.1f}s")
        self.retry_after_s = retry_after_s
        self.reason = reason


class Stage(abc.ABC):
    """A pipeline stage that holds the next stage (None only for the last one)."""

    name: str = "stage"

    def __init__(self, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        self.next = next_stage
        self.metrics = metrics

    @abc.abstractmethod
    async def consume(self, batch: Batch) -> None:
        """Process ``batch`` and pass it on. See the module docstring for the contract."""

    async def start(self) -> None:
        """Start background work (timers, workers). Called before receivers start."""

    async def shutdown(self, deadline_s: float) -> None:
        """Drain and stop within ``deadline_s`` seconds. Safe to call twice or unstarted."""


class PassThrough(Stage):
    """A stage with no job yet: forwards every batch unchanged."""

    def __init__(self, name: str, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        self.name = name

    async def consume(self, batch: Batch) -> None:
        if self.next is not None:
            await self.next.consume(batch)
