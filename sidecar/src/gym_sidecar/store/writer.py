"""The store's writer thread: decode export requests and write them in batches.

:meth:`StoreWriter.write` is called on the event loop and returns an awaitable that
resolves once the request is committed (or failed). The thread takes everything queued
at once, decodes it and inserts it in one transaction, so write throughput grows with
load instead of paying one commit per request. Pruning by age and size runs on the same
thread every ``prune_interval_s``. Nothing here blocks the event loop.

Lifecycle: ``start()`` once (opens the file, may raise OSError / sqlite3.Error /
StoreVersionError), ``write`` any number of times, ``close()`` once (writes what is
queued, then stops; safe twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry, Counter

from gym_sidecar.core.stage import Signal
from gym_sidecar.store import db, nesting
from gym_sidecar.store.config import LocalStoreConfig
from gym_sidecar.store.rows import PointRow, TraceRows, Truncation, point_rows, trace_rows

logger = logging.getLogger(__name__)


class StoreMetrics:
    """The store's counters, registered on the sidecar's registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.registry = r
        self.written = Counter(
            "gym_sidecar_store_written_items",
            "Spans and gym.* metric points written to the local store.",
            ["signal"],
            registry=r,
        )
        self.pruned = Counter(
            "gym_sidecar_store_pruned_items",
            "Spans and metric points deleted from the local store by retention, by reason "
            "(max_age, max_bytes).",
            ["reason"],
            registry=r,
        )
        self.failed = Counter(
            "gym_sidecar_store_failed_requests",
            "Export requests the local store could not write, by reason.",
            ["reason"],
            registry=r,
        )
        self.truncated = Counter(
            "gym_sidecar_store_truncated_values",
            "Attribute values shortened to max_attribute_value_chars.",
            registry=r,
        )
        self.transactions = Counter(
            "gym_sidecar_store_transactions",
            "Write transactions committed (each holds one or more export requests).",
            registry=r,
        )


@dataclass
class _Job:
    signal: Signal
    payload: bytes
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[str | None]
    traces: TraceRows | None = None
    points: list[PointRow] = field(default_factory=list)


_STOP = object()


class StoreWriter:
    """Writes OTLP requests into the SQLite store on one background thread."""

    def __init__(self, path: Path, cfg: LocalStoreConfig, metrics: StoreMetrics) -> None:
        self.path = path
        self.cfg = cfg
        self.metrics = metrics
        self._queue: queue.SimpleQueue[_Job | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._last_prune = 0.0

    def start(self) -> None:
        """Open the file (creating it) and start the thread. Blocking; call once."""
        if self._thread is not None:
            return
        self._conn = db.connect(self.path)
        # The connection was made here but is used only by the thread from now on.
        self._conn.close()
        self._last_prune = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="local-store-writer", daemon=True)
        self._thread.start()

    def write(self, signal: Signal, payload: bytes) -> asyncio.Future[str | None]:
        """Queue ``payload``; the future resolves to None when committed, else an error.

        The error string means the request can never be written (it does not decode, or
        the store is closed); callers treat it as permanent.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str | None] = loop.create_future()
        if self._closed or self._thread is None:
            future.set_result("local store is closed")
            return future
        self._queue.put(_Job(signal, payload, loop, future))
        return future

    async def close(self) -> None:
        """Write what is queued, stop the thread, close the file. Safe twice."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        self._queue.put(_STOP)
        await asyncio.to_thread(self._thread.join)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        conn = db.connect(self.path)
        try:
            stopping = False
            while not stopping:
                try:
                    first = self._queue.get(timeout=min(1.0, self.cfg.prune_interval_s))
                except queue.Empty:
                    self._maybe_prune(conn)
                    continue
                jobs: list[_Job] = []
                for item in self._drain(first):
                    if item is _STOP:
                        stopping = True
                    elif isinstance(item, _Job):
                        jobs.append(item)
                if jobs:
                    self._write(conn, jobs)
                self._maybe_prune(conn)
        finally:
            conn.close()

    def _drain(self, first: object) -> list[object]:
        items = [first]
        while len(items) < 256:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _write(self, conn: sqlite3.Connection, jobs: list[_Job]) -> None:
        now_ns = time.time_ns()
        trunc = Truncation(self.cfg.max_attribute_value_chars)
        good: list[_Job] = []
        for job in jobs:
            try:
                if job.signal is Signal.TRACES:
                    job.traces = trace_rows(job.payload, trunc)
                elif job.signal is Signal.METRICS:
                    job.points = point_rows(job.payload)
                good.append(job)
            except DecodeError as exc:
                self.metrics.failed.labels("decode").inc()
                self._resolve(job, f"cannot decode {job.signal.value} request: {exc}")
        if trunc.truncated:
            self.metrics.truncated.inc(trunc.truncated)
        traces = [(job.payload, job.traces) for job in good if job.traces is not None]
        points = [row for job in good for row in job.points]
        spans = sum(rows.spans for _, rows in traces)
        error: str | None = None
        try:
            if traces or points:
                db.insert(conn, traces, points, now_ns)
                self.metrics.transactions.inc()

        except sqlite3.Error as exc:
            # Boundary: a full disk or a locked file must fail these requests (the sender
            # retries them), not kill the writer thread.
            self.metrics.failed.labels("sqlite").inc()
            logger.warning("local store write failed: %s", exc)
            error = f"sqlite: {exc}"
        else:
            self.metrics.written.labels(Signal.TRACES.value).inc(spans)
            self.metrics.written.labels(Signal.METRICS.value).inc(len(points))
        for job in good:
            self._resolve(job, error)
        if traces and error is None:
            self._mark_nested(conn, traces)

    def _mark_nested(self, conn: sqlite3.Connection, traces: list[tuple[bytes, TraceRows]]) -> None:
        """The outermost rule where producers mark nothing (``store/nesting.py``), for the
        traces just written. After the commit and apart from it: a failure here (logged)
        leaves the rows unmarked until the trace's next write, and never fails the
        requests, which are stored."""
        trace_ids = sorted({row[0] for _, rows in traces for row in rows.traces})
        try:
            nesting.mark_nested(conn, trace_ids)
        except (sqlite3.Error, DecodeError) as exc:
            logger.warning("local store: marking nested rollouts failed: %s", exc)

    @staticmethod
    def _resolve(job: _Job, result: str | None) -> None:
        def settle() -> None:
            if not job.future.done():
                job.future.set_result(result)

        # A closed loop raises RuntimeError: nobody waits for this result any more.
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(settle)

    def _maybe_prune(self, conn: sqlite3.Connection) -> None:
        now = time.monotonic()
        if now - self._last_prune < self.cfg.prune_interval_s:
            return
        self._last_prune = now
        self.prune(conn)

    def prune(self, conn: sqlite3.Connection) -> None:
        """Apply retention now (thread of ``conn`` only). Errors are logged, not raised."""
        try:
            cutoff = time.time_ns() - int(self.cfg.max_age_s * 1e9)
            spans, points = db.prune_age(conn, cutoff)
            if spans or points:
                self.metrics.pruned.labels("max_age").inc(spans + points)
            spans, points = db.prune_size(conn, self.cfg.max_bytes)
            if spans or points:
                self.metrics.pruned.labels("max_bytes").inc(spans + points)
                logger.info(
                    "local store over %d bytes: deleted the oldest %d spans and points",
                    self.cfg.max_bytes,
                    spans + points,
                )
        except sqlite3.Error as exc:
            logger.warning("local store pruning failed: %s", exc)
