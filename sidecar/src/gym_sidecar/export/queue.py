"""The export queue: the interface any queue implements, and the in-memory one.

Entries are serialized export requests with their signal and item count: bytes, or the
pieces whose concatenation they are (:data:`Payload`: a trace request the stages only
enriched is its received bytes' slices and the new resources,
``TraceRequest.parts``, so it is copied once, when its batch is joined, instead of
once to serialize it and again to batch it). A sender takes a :class:`Lease` (one
batch: entries of one signal, concatenated), exports it, and acknowledges it; bytes are
held against the bound until the ack, so data being retried still counts. The on-disk
queue (``queue.persistent``) implements the same :class:`ExportQueue` protocol: ``put``
returns only once the data is durable, and ``close`` keeps what is left for replay
instead of losing it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gym_sidecar.core.stage import Signal

Payload = bytes | Sequence[bytes | memoryview]
"""A serialized export request: bytes, or the byte strings it is the concatenation of
(none of them is ever modified)."""


def payload_size(payload: Payload) -> int:
    """The serialized request's length in bytes."""
    if isinstance(payload, bytes):
        return len(payload)
    return sum(map(len, payload))


def joined(payload: Payload) -> bytes:
    """The serialized request as one bytes object (``payload`` itself if it is one)."""
    return payload if isinstance(payload, bytes) else b"".join(payload)


@dataclass(slots=True)
class Entry:
    """One serialized export request waiting in the queue."""

    payload: Payload
    items: int
    enqueued_at: float
    size: int
    """``payload_size(payload)``."""


@dataclass(slots=True)
class Lease:
    """A batch taken from the queue; ``ack`` it once exported or given up on."""

    id: int
    signal: Signal
    entries: list[Entry] = field(default_factory=list)

    def parts(self) -> list[bytes | memoryview]:
        """The entries' pieces in order: their concatenation is one valid export request
        (repeated-field merge). Nothing is copied."""
        parts: list[bytes | memoryview] = []
        for e in self.entries:
            if isinstance(e.payload, bytes):
                parts.append(e.payload)
            else:
                parts += e.payload
        return parts

    @property
    def payload(self) -> bytes:
        """The entries concatenated (:meth:`parts` joined): every byte is copied once; a
        lease of one bytes entry is that object itself."""
        parts = self.parts()
        return parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)

    @property
    def items(self) -> int:
        return sum(e.items for e in self.entries)

    @property
    def size_bytes(self) -> int:
        return sum(e.size for e in self.entries)


class ExportQueue(Protocol):
    """What the queue stage and the sender need from a queue.

    All methods run on the event loop; none blocks it.
    """

    @property
    def capacity_bytes(self) -> int:
        """The configured bound."""
        ...

    @property
    def used_bytes(self) -> int:
        """Bytes held: queued plus leased and not yet acknowledged."""
        ...

    async def put(self, signal: Signal, payload: Payload, items: int) -> bool:
        """Append one request; False (and nothing stored) if it would pass the bound.

        Returns once the entry is stored as durably as the queue promises. The bound
        counts ``payload_size(payload)``.
        """
        ...

    async def get(self, max_bytes: int, linger_s: float) -> Lease | None:
        """Wait for a batch of one signal and lease it.

        A batch is released when its signal has ``max_bytes`` queued, or its oldest
        entry has waited ``linger_s``, or the queue is closing. It holds entries up to
        ``max_bytes`` (at least one). Returns None once the queue is closing and empty.
        """
        ...

    async def ack(self, lease: Lease) -> None:
        """Forget a leased batch for good (exported, or dropped and counted)."""
        ...

    def drain(self) -> None:
        """Stop lingering: ``get`` hands out what is left, then returns None."""
        ...

    async def close(self) -> Mapping[Signal, int]:
        """Stop; return the items per signal this closing loses (not kept for replay)."""
        ...


class Queued(Protocol):
    """What the batching policy reads of a queued record (an :class:`Entry`, or the
    on-disk queue's reference to a record)."""

    @property
    def enqueued_at(self) -> float:
        """``time.monotonic()`` when it was queued."""
        ...


def next_ready(
    pending: Mapping[Signal, Sequence[Queued]],
    pending_bytes: Mapping[Signal, int],
    *,
    draining: bool,
    max_bytes: int,
    linger_s: float,
    now: float,
) -> Signal | None:
    """The batching policy of every queue: the signal to send next. Among the signals
    with a full batch (``pending_bytes`` >= ``max_bytes``), an aged head (waited
    ``linger_s``), or (when ``draining``) anything queued, the one whose head waited
    longest, so that a busy signal cannot starve the others; None when none is ready."""
    best: tuple[float, Signal] | None = None
    for signal, q in pending.items():
        if not q:
            continue
        head = q[0].enqueued_at
        ready = draining or pending_bytes[signal] >= max_bytes or now - head >= linger_s
        if ready and (best is None or head < best[0]):
            best = (head, signal)
    return None if best is None else best[1]


def next_deadline(pending: Mapping[Signal, Sequence[Queued]], linger_s: float) -> float | None:
    """When the oldest queued head reaches ``linger_s`` (monotonic time); None when
    nothing is queued."""
    heads = [q[0].enqueued_at for q in pending.values() if q]
    return min(heads) + linger_s if heads else None


class MemoryQueue:
    """A FIFO per signal in memory, bounded in bytes. Not thread-safe (one event loop)."""

    def __init__(self, max_bytes: int) -> None:
        self._capacity = max_bytes
        self._used = 0
        self._pending: dict[Signal, deque[Entry]] = {s: deque() for s in Signal}
        self._pending_bytes: dict[Signal, int] = dict.fromkeys(Signal, 0)
        self._leased: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._draining = False
        self._wakeup = asyncio.Event()

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def used_bytes(self) -> int:
        return self._used

    def pending_items(self) -> dict[Signal, int]:
        """Items queued or leased, per signal."""
        out = {s: sum(e.items for e in q) for s, q in self._pending.items()}
        for lease in self._leased.values():
            out[lease.signal] += lease.items
        return out

    def _notify(self) -> None:
        # Wake every waiting getter; later waiters wait on a fresh event.
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def put(self, signal: Signal, payload: Payload, items: int) -> bool:
        size = payload_size(payload)
        if self._used + size > self._capacity:
            return False
        self._pending[signal].append(Entry(payload, items, time.monotonic(), size))
        self._pending_bytes[signal] += size
        self._used += size
        self._notify()
        return True

    def _take(self, signal: Signal, max_bytes: int) -> Lease:
        q = self._pending[signal]
        lease = Lease(next(self._ids), signal)
        size = 0
        while q and (not lease.entries or size + q[0].size <= max_bytes):
            entry = q.popleft()
            size += entry.size
            lease.entries.append(entry)
        self._pending_bytes[signal] -= size
        self._leased[lease.id] = lease
        return lease

    async def get(self, max_bytes: int, linger_s: float) -> Lease | None:
        while True:
            now = time.monotonic()
            signal = next_ready(
                self._pending,
                self._pending_bytes,
                draining=self._draining,
                max_bytes=max_bytes,
                linger_s=linger_s,
                now=now,
            )
            if signal is not None:
                return self._take(signal, max_bytes)
            if self._draining and not any(self._pending.values()):
                return None
            deadline = next_deadline(self._pending, linger_s)
            event = self._wakeup
            try:
                timeout = None if deadline is None else max(0.0, deadline - now)
                await asyncio.wait_for(event.wait(), timeout)
            except TimeoutError:
                pass

    async def ack(self, lease: Lease) -> None:
        if self._leased.pop(lease.id, None) is not None:
            self._used -= lease.size_bytes

    def drain(self) -> None:
        self._draining = True
        self._notify()

    async def close(self) -> dict[Signal, int]:
        self.drain()
        lost = self.pending_items()
        for q in self._pending.values():
            q.clear()
        self._pending_bytes = dict.fromkeys(Signal, 0)
        self._leased.clear()
        self._used = 0
        return {s: n for s, n in lost.items() if n}
