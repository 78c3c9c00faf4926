"""What sits between the wrappers' spans and the sidecar: the processor switch this
package adds to a TracerProvider, and an exporter wrapper that tracks export health.

Both are on the export side only: ``GymSpanProcessor.on_end`` runs in the handler's
thread and does a bounded-queue append; everything that touches the network runs on
the batch processor's worker thread.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from gym_telemetry_semconv.ratelimit import rate_limit
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from gym_telemetry._lean.sdk_hooks import batch_append, batch_queue
from gym_telemetry._lean.span_encoding import encode_lean_record, encode_record


class TrackingExporter(SpanExporter):
    """Wraps an exporter; counts what it failed to deliver and knows when it is stuck.

    ``export`` never raises (an exception counts as a failure). ``unreachable()`` is
    True when the last export failed or the current one has been running longer than
    ``stuck_after_s`` (a local sidecar answers in milliseconds; longer means the
    exporter is in its retry back-off); ``accepts_connections()`` then tells a sidecar
    that is gone from one that came back or hangs. ``shutdown_telemetry`` uses both to
    skip waiting for a sidecar that is not there.
    """

    def __init__(
        self,
        inner: SpanExporter,
        stuck_after_s: float = 0.25,
        address: tuple[str, int] | None = None,
    ) -> None:
        self.inner = inner
        self.address = address
        self.stuck_after_s = stuck_after_s
        self.exported = 0
        self.failed = 0
        self.last_ok = True
        self._export_started: float | None = None
        self._shut_down = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._export_started = time.monotonic()
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter bug must not kill the batch worker
            result = SpanExportResult.FAILURE
        finally:
            self._export_started = None
        ok = result is SpanExportResult.SUCCESS
        with self._lock:
            self.last_ok = ok
            if ok:
                self.exported += len(spans)
            else:
                self.failed += len(spans)
        return result

    @property
    def accepts_span_records(self) -> bool:
        """Whether the wrapped exporter takes span records (``span_encoding.encode_record``)
        in a batch in place of spans."""
        return bool(getattr(self.inner, "accepts_span_records", False))

    def unreachable(self) -> bool:
        started = self._export_started
        if started is not None and time.monotonic() - started > self.stuck_after_s:
            return True
        return not self.last_ok

    @property
    def in_flight(self) -> bool:
        """Whether an export call is running right now."""
        return self._export_started is not None

    def accepts_connections(self, timeout_s: float = 0.2) -> bool:
        """Whether something accepts TCP connections at the export address (True when
        the address is unknown). Blocks up to ``timeout_s``; for shutdown, never for a
        handler."""
        if self.address is None:
            return True
        try:
            with socket.create_connection(self.address, timeout=timeout_s):
                return True
        except OSError:
            return False

    def shutdown(self) -> None:
        """Shut the wrapped exporter down once (later calls do nothing)."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class GymSpanProcessor(SpanProcessor):
    """The processor this module adds to the provider: a switch in front of a batch
    processor, so the exporter can be replaced or closed while the provider stays.

    ``on_end`` costs one attribute load when no exporter is plugged in. When the batch
    queue is full it drops the oldest span itself and counts it (the SDK would log a
    WARNING per dropped span). Thread-safe; never raises.

    When the exporter takes span records (the lean OTLP/gRPC exporter) and the batch
    processor's queue and ``emit`` step are the known ones, ``on_end`` queues each
    sampled span as its record: the span encoded to OTLP bytes now, in the ending
    thread, instead of the span object kept alive until the next export. A plain
    ``bytes`` is never tracked by the cyclic GC, so a queued span no longer adds to the
    objects every full collection traverses (what a NeMo Gym server's CPU goes to). The
    exported message is the same. A span the lean encoder refuses, or any failure, is
    queued as the span itself, as before.
    """

    #: Its ``on_start`` and ``_on_ending`` do nothing: the lean recorder skips them.
    quiet_span_hooks: Final = True

    def __init__(self) -> None:
        self.delegate: BatchSpanProcessor | None = None
        self.exporter: TrackingExporter | None = None
        self._queue: Any = None
        self._max_queue = 0
        self._emit: Any = None
        self.dropped = 0
        #: Spans queued as records, and as spans because encoding them failed.
        self.records = 0
        self.record_failures = 0

    def plug(
        self, delegate: BatchSpanProcessor | None, exporter: TrackingExporter | None = None
    ) -> tuple[BatchSpanProcessor | None, TrackingExporter | None]:
        """Swap the batch processor (and the exporter behind it); return the previous
        pair, not shut down."""
        old = self.delegate, self.exporter
        queue = None
        max_queue = 0
        if delegate is not None:
            queue, max_queue = batch_queue(delegate)
        emit = None
        if queue is not None and exporter is not None and exporter.accepts_span_records:
            emit = batch_append(delegate)  # type: ignore[arg-type]
        self._queue, self._max_queue, self._emit = queue, max_queue, emit
        self.delegate = delegate
        self.exporter = exporter
        return old

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        # The batch processor's on_start does nothing; skipping the call saves a hop.
        return

    def on_end(self, span: ReadableSpan) -> None:
        delegate = self.delegate
        if delegate is None:
            return
        emit = self._emit
        if emit is not None:
            record = None
            try:
                context = span.context
                if context is None or not context.trace_flags.sampled:
                    return  # what the batch processor would do with it
                record = encode_record(span)
            except Exception:  # refused or failed: the span itself is queued
                self.record_failures += 1
            if record is not None:
                self._make_room()
                try:
                    emit(record)
                    self.records += 1
                except Exception:  # a processor failure must never reach span.end()
                    pass
                return
        self._make_room()
        try:  # noqa: SIM105 - try/except is cheaper than suppress() on this per-span path
            delegate.on_end(span)
        except Exception:  # a processor failure must never reach span.end()
            pass

    def on_end_lean(self, span: ReadableSpan) -> None:
        """``on_end`` for a span the lean recorder ended (``_lean.recorder``; it calls
        this directly when this processor is the provider's only one): always sampled,
        a ``LeanSpan``, so its record is encoded from its fields
        (``span_encoding.encode_lean_record``). Same outcome as ``on_end``."""
        emit = self._emit
        if emit is None:
            self.on_end(span)
            return
        try:
            record = encode_lean_record(span)
        except Exception:  # refused or failed: the span itself is queued
            self.record_failures += 1
            record = None
        if record is None:
            self._make_room()
            try:  # noqa: SIM105 - try/except is cheaper than suppress() on this per-span path
                self.delegate.on_end(span)  # type: ignore[union-attr]
            except Exception:  # a processor failure must never reach span.end()
                pass
            return
        try:
            if len(self._queue) >= self._max_queue:
                self._make_room()
            emit(record)
            self.records += 1
        except Exception:  # a processor failure (or a concurrent unplug) must never reach end()
            pass

    def _make_room(self) -> None:
        """Drop the oldest queued span when the queue is full (counted, not logged)."""
        try:
            queue = self._queue
            if queue is not None and len(queue) >= self._max_queue:
                with contextlib.suppress(IndexError):
                    queue.pop()  # oldest is at the right; make room without the SDK's log
                self.dropped += 1
        except Exception:  # a changed SDK queue must not cost the span its export
            pass

    def shutdown(self) -> None:
        delegate, _exporter = self.plug(None)
        if delegate is not None:
            delegate.shutdown()  # type: ignore[no-untyped-call]

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        delegate = self.delegate
        if delegate is None:
            return True
        return bool(delegate.force_flush(timeout_millis))


# Loggers of the SDK's export machinery that repeat themselves while the sidecar is down
# (one line per retry and per failed batch, from the batch worker thread).
EXPORT_LOGGERS: Final[tuple[str, ...]] = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.sdk._shared_internal",
    "opentelemetry.sdk.trace.export",
)


def rate_limit_export_logs(interval_s: float = 60.0) -> None:
    """Rate-limit each of ``EXPORT_LOGGERS`` (``gym_telemetry_semconv.ratelimit``; idempotent)."""
    for name in EXPORT_LOGGERS:
        rate_limit(name, interval_s)
