"""The persistent export queue (``queue.persistent: true``): segment files on disk.

Implements :class:`~gym_sidecar.export.queue.ExportQueue` on top of
:mod:`gym_sidecar.export.segments`. Contract, beyond the protocol:

- ``put`` returns True only once the record is written to the active segment and, with
  ``fsync="always"``, fsynced. Writes and fsyncs happen in a worker thread; puts that
  arrive while one group is being written form the next group (one write and one fsync
  for all of them), so throughput does not pay one fsync per request. With
  ``fsync="interval"`` the record is in the OS page cache when ``put`` returns (it
  survives a crash of this process, not of the machine) and a timer fsyncs every
  ``fsync_interval_ms``.
- The bound ``max_bytes`` counts payload bytes of every segment still on disk (records
  leased or acknowledged but whose segment still holds undelivered ones included), plus
  writes in progress. ``put`` returns False past it, and also when the write fails (disk
  full, I/O error): the queue stage turns that into backpressure, nothing is dropped.
- Only payload offsets are kept in memory; payloads are read back from disk when leased,
  so memory stays small however large the on-disk bound.
- A segment is deleted as soon as every record in it is acknowledged (delivered, or
  dropped for good and counted by the sender) and nothing is appended to it any more, so
  the footprint shrinks back to zero when the backend keeps up.
- Replay: the constructor scans the directory (blocking; it runs once at startup, before
  any receiver listens) and queues every valid record again, oldest segment first. Acks
  are not persisted: records of a segment that was partly delivered before a crash or a
  stop are sent again (at least once; duplicates are bounded by ``segment_max_bytes``
  per signal and batch in flight).
- Damage (wrong magic, checksum mismatch, truncated tail, unreadable file) is logged,
  counted in ``gym_sidecar_queue_corrupt_records_total{kind}``, and skipped; it never
  stops the rest of the queue.
- ``close`` stops writing, fsyncs and keeps every unacknowledged record on disk; it
  reports nothing as lost.
- One process per directory: an exclusive ``flock`` on ``<directory>/LOCK``; a second
  sidecar on the same directory fails to start with an OSError.

Not thread-safe: every method runs on the one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gym_sidecar.core.stage import Signal
from gym_sidecar.export import segments
from gym_sidecar.export.config import QueueConfig
from gym_sidecar.export.queue import (
    Entry,
    ExportQueue,
    Lease,
    MemoryQueue,
    Payload,
    joined,
    next_deadline,
    next_ready,
    payload_size,
)
from gym_sidecar.export.segments import Damage, Position
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

_LOG_INTERVAL_S = 10.0
"""Repeated write failures (disk full) are logged at most this often."""
_IDLE_SEAL_S = 1.0
"""A fully delivered active segment is closed and deleted after this long without writes."""


@dataclass(slots=True)
class _Ref:
    """A record on disk, waiting or leased."""

    pos: Position
    signal: Signal
    items: int
    enqueued_at: float


@dataclass(slots=True)
class _Segment:
    seq: int
    live: int = 0
    """Records written and not yet acknowledged."""
    payload_bytes: int = 0
    """Payload bytes of every record ever written to it (counted against the bound)."""


@dataclass(slots=True)
class _Write:
    signal: Signal
    payload: bytes
    items: int
    done: asyncio.Future[bool]


class DiskQueue:
    """The on-disk export queue. See the module docstring for the contract."""

    def __init__(
        self,
        directory: str | Path,
        max_bytes: int,
        metrics: SelfMetrics,
        *,
        fsync: Literal["always", "interval"] = "always",
        fsync_interval_s: float = 1.0,
        segment_max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = segments.lock_directory(self.directory)
        self._capacity = max_bytes
        self._metrics = metrics
        self._fsync_always = fsync == "always"
        self._fsync_interval_s = fsync_interval_s
        self._used = 0
        self._pending: dict[Signal, deque[_Ref]] = {s: deque() for s in Signal}
        self._pending_bytes: dict[Signal, int] = dict.fromkeys(Signal, 0)
        self._leased: dict[int, list[_Ref]] = {}
        self._segments: dict[int, _Segment] = {}
        self._ids = itertools.count(1)
        self._writes: list[_Write] = []
        self._draining = False
        self._closed = False
        self._wakeup = asyncio.Event()
        self._writer_wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._deletions: set[asyncio.Task[None]] = set()
        self._append_floor: int | None = None
        """While a group is being appended: the segment it started in (it may write
        there before rolling over, so that segment and later ones are not collected)."""
        self._writing = 0
        """Records of the group being appended (draining waits for them)."""
        self._write_failures = 0
        self._last_write = 0.0
        self._last_failure_log = -_LOG_INTERVAL_S
        try:
            next_seq = self._replay()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._writer = segments.SegmentWriter(
            self.directory, next_seq, min(segment_max_bytes, max_bytes)
        )
        self._reader = segments.SegmentReader(self.directory)

    # -- replay --------------------------------------------------------------------------
    def _replay(self) -> int:
        """Queue the valid records found on disk; return the next segment number."""
        found = segments.list_segments(self.directory)
        now = time.monotonic()
        replayed: dict[Signal, int] = dict.fromkeys(Signal, 0)
        for seq, path in found:
            result = segments.scan(path)
            for kind, offset in result.damage:
                self._count_damage(kind, f"{path.name} at byte {offset}")
            if not result.records:
                path.unlink(missing_ok=True)
                continue
            seg = self._segments[seq] = _Segment(seq)
            for rec in result.records:
                ref = _Ref(Position(seq, rec.offset, rec.length), rec.signal, rec.items, now)
                self._pending[rec.signal].append(ref)
                self._pending_bytes[rec.signal] += rec.length
                seg.live += 1
                seg.payload_bytes += rec.length
                replayed[rec.signal] += rec.items
            self._used += seg.payload_bytes
        if any(replayed.values()):
            for signal, n in replayed.items():
                self._metrics.queue_replayed.labels(signal.value).inc(n)
            logger.info(
                "on-disk queue %s: replaying %s from %d segments (%d bytes)",
                self.directory,
                ", ".join(f"{n} {s.value} items" for s, n in replayed.items() if n),
                len(self._segments),
                self._used,
            )
        return found[-1][0] + 1 if found else 1

    def _count_damage(self, kind: Damage, where: str) -> None:
        self._metrics.queue_corrupt_records.labels(kind.value).inc()
        logger.warning(
            "on-disk queue %s: %s record skipped (%s)", self.directory, kind.value, where
        )

    # -- ExportQueue ---------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._used

    def pending_items(self) -> dict[Signal, int]:
        """Items queued or leased (not yet acknowledged), per signal."""
        out = {s: sum(r.items for r in q) for s, q in self._pending.items()}
        for refs in self._leased.values():
            for ref in refs:
                out[ref.signal] += ref.items
        return out

    def segment_count(self) -> int:
        """Segments on disk (the active one included)."""
        return len(self._segments)

    def _start_tasks(self) -> None:
        if not self._tasks and not self._closed:
            writer = asyncio.create_task(self._write_loop(), name="disk-queue-writer")
            writer.add_done_callback(_log_crash)
            self._tasks.append(writer)
            if not self._fsync_always:
                self._tasks.append(asyncio.create_task(self._sync_loop(), name="disk-queue-sync"))

    async def put(self, signal: Signal, payload: Payload, items: int) -> bool:
        size = payload_size(payload)
        if self._closed or self._draining or self._used + size > self._capacity:
            return False
        payload = joined(payload)  # a record is written as one piece
        self._start_tasks()
        self._used += size
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._writes.append(_Write(signal, payload, items, done))
        self._writer_wakeup.set()
        # Shielded: a client that goes away must not cancel a group write half-way; its
        # record is then written and sent anyway (at least once).
        return await asyncio.shield(done)

    async def _write_loop(self) -> None:
        while True:
            if not self._writes:
                if self._closed:
                    return
                timeout = await self._seal_idle_segment()
                self._writer_wakeup.clear()
                if not self._writes and not self._closed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._writer_wakeup.wait(), timeout)
                continue
            group, self._writes = self._writes, []
            framed = [segments.encode(w.signal, w.items, w.payload) for w in group]
            self._append_floor = self._writer.active_seq
            self._writing = len(group)
            try:
                positions = await asyncio.to_thread(self._writer.append, framed, self._fsync_always)
            except OSError as err:
                self._append_floor, self._writing = None, 0
                for w in group:
                    self._used -= len(w.payload)
                    if not w.done.done():
                        w.done.set_result(False)
                self._write_failures += 1
                now = time.monotonic()
                if now - self._last_failure_log >= _LOG_INTERVAL_S:
                    logger.warning(
                        "on-disk queue %s: write failed (%d failed groups since the last "
                        "message), clients are pushed back: %s",
                        self.directory,
                        self._write_failures,
                        err,
                    )
                    self._last_failure_log, self._write_failures = now, 0
                self._notify()
                continue
            self._append_floor, self._writing = None, 0
            now = self._last_write = time.monotonic()
            for w, pos in zip(group, positions, strict=True):
                seg = self._segments.get(pos.seq)
                if seg is None:
                    seg = self._segments[pos.seq] = _Segment(pos.seq)
                seg.live += 1
                seg.payload_bytes += pos.length
                self._pending[w.signal].append(_Ref(pos, w.signal, w.items, now))
                self._pending_bytes[w.signal] += pos.length
                if not w.done.done():
                    w.done.set_result(True)
            self._collect()
            self._notify()

    async def _sync_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._fsync_interval_s)
            try:
                await asyncio.to_thread(self._writer.sync)
            except OSError as err:
                logger.warning("on-disk queue %s: fsync failed: %s", self.directory, err)

    async def _seal_idle_segment(self) -> float | None:
        """With no write pending, close and delete the active segment once it is fully
        delivered and no write came for ``_IDLE_SEAL_S`` (so a steady trickle of small
        groups does not create a file per group). Returns how long to wait before
        checking again (None: until woken)."""
        seq = self._writer.active_seq
        seg = self._segments.get(seq) if seq is not None else None
        if seg is None or seg.live:
            return None
        idle_s = time.monotonic() - self._last_write
        if idle_s < _IDLE_SEAL_S:
            return _IDLE_SEAL_S - idle_s
        await asyncio.to_thread(self._writer.seal, seg.seq)
        self._collect()
        return None

    def _collect(self) -> None:
        """Delete every fully acknowledged segment that is no longer appended to."""
        active = self._writer.active_seq
        floor = self._append_floor
        done = [
            seq
            for seq, seg in self._segments.items()
            if seg.live == 0 and seq != active and (floor is None or seq < floor)
        ]
        if not done:
            return
        for seq in done:
            self._used -= self._segments.pop(seq).payload_bytes
        # Unlinking is disk I/O: off the loop. Sequence numbers are never reused.
        task = asyncio.create_task(asyncio.to_thread(self._delete, done))
        self._deletions.add(task)
        task.add_done_callback(self._deletions.discard)

    def _delete(self, seqs: list[int]) -> None:
        for seq in seqs:
            self._reader.forget(seq)
            try:
                segments.delete_segment(self.directory, seq)
            except OSError as err:
                logger.warning(
                    "on-disk queue %s: cannot delete segment %d: %s", self.directory, seq, err
                )

    def _notify(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def _take(self, signal: Signal, max_bytes: int) -> list[_Ref]:
        q = self._pending[signal]
        refs: list[_Ref] = []
        size = 0
        while q and (not refs or size + q[0].pos.length <= max_bytes):
            ref = q.popleft()
            size += ref.pos.length
            refs.append(ref)
        self._pending_bytes[signal] -= size
        return refs

    async def get(self, max_bytes: int, linger_s: float) -> Lease | None:
        while True:
            now = time.monotonic()
            # Same policy as MemoryQueue: the ready signal whose head waited longest.
            signal = next_ready(
                self._pending,
                self._pending_bytes,
                draining=self._draining,
                max_bytes=max_bytes,
                linger_s=linger_s,
                now=now,
            )
            if signal is not None:
                lease = await self._lease(signal, self._take(signal, max_bytes))
                if lease is not None:
                    return lease
                continue
            if (
                self._draining
                and not any(self._pending.values())
                and not self._writes
                and not self._writing
            ):
                return None
            deadline = next_deadline(self._pending, linger_s)
            event = self._wakeup
            timeout = None if deadline is None else max(0.0, deadline - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)

    async def _lease(self, signal: Signal, refs: list[_Ref]) -> Lease | None:
        """Read the payloads back; damaged records are counted, acknowledged, skipped."""
        lease_id = next(self._ids)
        self._leased[lease_id] = refs  # held while reading, so nothing is collected
        try:
            payloads = await asyncio.to_thread(self._reader.read, [r.pos for r in refs])
        except BaseException:
            # Cancelled (shutdown) while reading: the records go back to the head of the
            # queue, still counted live, so their segment is kept for replay.
            del self._leased[lease_id]
            self._pending[signal].extendleft(reversed(refs))
            self._pending_bytes[signal] += sum(r.pos.length for r in refs)
            raise
        lease = Lease(lease_id, signal)
        good: list[_Ref] = []
        bad: list[_Ref] = []
        for ref, data in zip(refs, payloads, strict=True):
            if isinstance(data, Damage):
                self._count_damage(data, f"segment {ref.pos.seq} at byte {ref.pos.offset}")
                bad.append(ref)
            else:
                lease.entries.append(Entry(data, ref.items, ref.enqueued_at, len(data)))
                good.append(ref)
        if bad:
            self._metrics.dropped.labels(signal.value, "corrupt_segment").inc(
                sum(r.items for r in bad)
            )
            self._release(bad)
        if not good:
            del self._leased[lease_id]
            self._collect()
            return None
        self._leased[lease_id] = good
        return lease

    def _release(self, refs: list[_Ref]) -> None:
        for ref in refs:
            seg = self._segments.get(ref.pos.seq)
            if seg is not None:
                seg.live -= 1

    async def ack(self, lease: Lease) -> None:
        refs = self._leased.pop(lease.id, None)
        if refs is None:
            return
        self._release(refs)
        self._collect()
        self._writer_wakeup.set()  # the active segment may now be sealable

    def drain(self) -> None:
        self._draining = True
        self._notify()

    async def close(self) -> dict[Signal, int]:
        """Finish pending writes, fsync, keep everything unacknowledged for replay."""
        if self._closed:
            return {}
        self.drain()
        self._closed = True
        self._writer_wakeup.set()
        for task in self._tasks:
            if task.get_name() == "disk-queue-sync":
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self._deletions, return_exceptions=True)
        kept = self.pending_items()
        await asyncio.to_thread(self._writer.close)
        self._reader.close()
        if any(kept.values()):
            logger.info(
                "on-disk queue %s: kept %s for replay at the next start",
                self.directory,
                ", ".join(f"{n} {s.value} items" for s, n in kept.items() if n),
            )
        os.close(self._lock_fd)
        return {}


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("on-disk queue writer stopped", exc_info=task.exception())


def build_queue(config: QueueConfig, metrics: SelfMetrics) -> ExportQueue:
    """The queue ``config`` asks for: on disk when ``persistent``, else in memory.

    The on-disk queue replays its directory here (blocking, at startup) and raises
    OSError when the directory cannot be used (permissions, locked by another sidecar).
    """
    if not config.persistent:
        return MemoryQueue(config.max_bytes)
    assert config.directory is not None  # validated by QueueConfig
    return DiskQueue(
        config.directory,
        config.max_bytes,
        metrics,
        fsync=config.fsync,
        fsync_interval_s=config.fsync_interval_ms / 1000.0,
        segment_max_bytes=config.segment_max_bytes,
    )
