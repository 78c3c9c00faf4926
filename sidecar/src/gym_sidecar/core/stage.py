"""The one interface every pipeline stage obeys.

A stage receives a :class:`Batch` (one OTLP export request: a trace request as its wire
view, :class:`~gym_sidecar.core.traces.TraceRequest`; metrics and logs as protobuf
messages), does its one job on whole ResourceSpans / ScopeSpans blocks, and hands the
batch to the stage it holds as ``next``. Stages never convert data into SDK objects.

Contract of :meth:`Stage.consume`:
- It runs on the sidecar's event loop; it must not block on I/O (offload to a thread
  if it must touch disk).
- It may mutate the batch's message in place (enrich adds resource attributes, gate
  removes ScopeSpans blocks; on a trace request both edit its index, see
  :mod:`gym_sidecar.core.traces`) and must keep ``batch.items`` equal to what is left.
- It raises :class:`Backpressure` when the data cannot be accepted now (queue full);
  the receiver turns that into RESOURCE_EXHAUSTED / HTTP 429 for the client.
- It never raises anything else for data-dependent reasons: bad data is dropped and
  counted through ``batch.reject`` so the receiver can answer ``partial_success``.

Most stages do their job through :class:`ProcessorStage`, which owns what they all
repeat: counting ``gym_sidecar_stage_items{stage,signal,outcome}`` (received, dropped,
passed) and handing the batch to ``next``.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gym_sidecar.core.traces import ScanSpec, TraceRequest
from gym_sidecar.selfmetrics import SelfMetrics

T = TypeVar("T")

ProtoRequest = ExportTraceServiceRequest | ExportMetricsServiceRequest | ExportLogsServiceRequest
"""An OTLP export request as a protobuf message (what the decoders return)."""
ExportRequest = TraceRequest | ExportMetricsServiceRequest | ExportLogsServiceRequest
"""What a :class:`Batch` carries: traces as their wire view, metrics and logs decoded."""


class Signal(enum.Enum):
    TRACES = "traces"
    METRICS = "metrics"
    LOGS = "logs"

    # Members are singletons compared by identity: hash them by identity too, in C.
    # Enum's own __hash__ is a Python function, called for every dict lookup keyed by a
    # signal (each stage does one per request).
    __hash__ = object.__hash__


@dataclass(slots=True)
class Batch:
    """One OTLP export request travelling through the pipeline."""

    signal: Signal
    message: ExportRequest
    """A :class:`TraceRequest` for ``Signal.TRACES``, else the decoded message."""
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
    trace_scan: ScanSpec | None = None
    """What the stage reads of trace requests beyond their index (the derive stage:
    the spans of its scopes); the receivers ask the scanner for it
    (:func:`pipeline_trace_scan`)."""

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


def pipeline_trace_scan(head: Stage | None) -> ScanSpec:
    """The :class:`ScanSpec` the stages from ``head`` on declare (``trace_scan``), merged:
    the union of their ``split_scopes``, and the derive fields (``derive_scopes``,
    ``attr_keys``, ``event_keys``, ``sparse_scopes``, ``sparse_keys``) of the one stage
    that reads any (the derive stage).
    Two readers would need one key order, as the values of a
    :data:`~gym_sidecar.core.traces.DerivedSpan` are positional: ValueError then. An
    empty spec when no stage declares one."""
    readers: list[ScanSpec] = []
    split: frozenset[str] = frozenset()
    stage = head
    while stage is not None:
        spec = stage.trace_scan
        if spec is not None:
            split |= spec.split_scopes
            if spec.derive_scopes or spec.attr_keys or spec.event_keys or spec.sparse_scopes:
                readers.append(spec)
        stage = stage.next
    if len(readers) > 1:
        raise ValueError(f"more than one stage declares a trace scan: {readers}")
    reader = readers[0] if readers else ScanSpec()
    if reader.split_scopes == split:
        return reader
    return replace(reader, split_scopes=split)


class PassThrough(Stage):
    """A stage with no job (a disabled area): forwards every batch unchanged, uncounted."""

    def __init__(self, name: str, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        self.name = name

    async def consume(self, batch: Batch) -> None:
        if self.next is not None:
            await self.next.consume(batch)


class ProcessorStage(Stage, Generic[T]):
    """A stage that does one job on a batch in place, built the way every stage is.

    Subclasses set ``name`` (the ``stage`` label) and ``signals`` (the signals they work
    on; batches of other signals are forwarded untouched and not counted), implement
    :meth:`process`, and may override :meth:`nothing_left` and :meth:`accepted`. For
    each batch of a handled signal :meth:`consume`:

    1. counts ``batch.items`` as ``received``;
    2. calls ``process(batch)``, which does the job in place and lowers ``batch.items``
       by what it removed (directly, or through ``batch.reject``);
    3. counts the difference as ``dropped`` and what is left as ``passed``;
    4. stops there when no item is left and :meth:`nothing_left` says the message is
       empty; otherwise awaits ``next.consume(batch)`` (a :class:`Backpressure` from
       downstream propagates to the receiver);
    5. once ``next`` accepted the batch, calls ``accepted(batch, token)`` with what
       ``process`` returned (for work that must happen only once per accepted request).

    The counters' children are resolved once here (``labels()`` costs more than a
    stage's work on a small batch); ``dropped`` is created on first use, so a stage
    that never drops exports no ``dropped`` series.
    """

    signals: frozenset[Signal] = frozenset(Signal)

    def __init__(self, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        items = metrics.stage_items
        # In Signal's order, so /metrics lists them the same way in every process
        # (iterating the frozenset went by hash, which varies with PYTHONHASHSEED).
        self._counters: dict[Signal, tuple[Any, Any]] = {
            signal: (
                items.labels(self.name, signal.value, "received"),
                items.labels(self.name, signal.value, "passed"),
            )
            for signal in Signal
            if signal in self.signals
        }
        self._dropped: dict[Signal, Any] = {}
        # Skip the call when a subclass has no use for it: consume runs per request.
        overridden = type(self).accepted is not ProcessorStage.accepted
        self._accepted = self.accepted if overridden else None

    @abc.abstractmethod
    def process(self, batch: Batch) -> T:
        """Do the stage's job on ``batch`` in place (see the module docstring's contract).

        Must keep ``batch.items`` equal to the items left in the message. The return
        value is handed to :meth:`accepted` once ``next`` has accepted the batch.
        """

    def nothing_left(self, batch: Batch) -> bool:
        """Whether a batch left with no items should end here instead of going on.

        Asked only when ``batch.items`` is 0. The default forwards it (a request with no
        items is still answered by the stages behind, as before the stage saw it).
        """
        return False

    def accepted(self, batch: Batch, token: T) -> None:
        """Called after ``next`` accepted ``batch``; ``token`` is what ``process`` returned."""

    def count_dropped(self, signal: Signal, items: int) -> None:
        """Count ``items`` as ``dropped`` by this stage (the helper calls it itself)."""
        child = self._dropped.get(signal)
        if child is None:
            child = self.metrics.stage_items.labels(self.name, signal.value, "dropped")
            self._dropped[signal] = child
        child.inc(items)

    async def consume(self, batch: Batch) -> None:
        counters = self._counters.get(batch.signal)
        if counters is None:  # not this stage's signal
            if self.next is not None:
                await self.next.consume(batch)
            return
        received, passed = counters
        offered = batch.items
        received.inc(offered)
        token = self.process(batch)
        left = batch.items
        if left != offered:
            self.count_dropped(batch.signal, offered - left)
        passed.inc(left)
        if left == 0 and self.nothing_left(batch):
            return
        if self.next is not None:
            await self.next.consume(batch)
        if self._accepted is not None:
            self._accepted(batch, token)
