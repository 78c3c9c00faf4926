"""The on-disk queue in process, on real files: durability, bound, replay, damage.

These drive :class:`DiskQueue` directly (its callers are the queue stage and the
sender); the same behaviour through a real sidecar process is in the other fault tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from gym_sidecar.core.stage import Signal
from gym_sidecar.export import segments
from gym_sidecar.export.config import QueueConfig
from gym_sidecar.export.disk_queue import DiskQueue, build_queue
from gym_sidecar.export.queue import MemoryQueue
from gym_sidecar.selfmetrics import SelfMetrics

from testkit.wait import wait_for_async
from tests.faults.support import small_filesystem


def corrupt(metrics: SelfMetrics, kind: str) -> float:
    value = metrics.registry.get_sample_value(
        "gym_sidecar_queue_corrupt_records_total", {"kind": kind}
    )
    return value or 0.0


def make(path: Path, metrics: SelfMetrics, **kw: object) -> DiskQueue:
    kw.setdefault("segment_max_bytes", 1024)
    return DiskQueue(path, 1 << 20, metrics, **kw)  # type: ignore[arg-type]


def payload(i: int, size: int = 100) -> bytes:
    return f"{i:08d}".encode().ljust(size, b"x")


async def drain_all(q: DiskQueue, ack: bool = True) -> list[bytes]:
    out: list[bytes] = []
    q.drain()
    while (lease := await q.get(1 << 20, 0.0)) is not None:
        out.extend(e.payload for e in lease.entries)
        if ack:
            await q.ack(lease)
    return out


def test_a_request_put_as_pieces_is_written_and_replayed_as_one_record(tmp_path: Path) -> None:
    """The queue stage hands a request the stages only enriched over as its pieces: the
    disk queue counts their joined length and writes them as one record, which a new
    queue replays."""

    async def run() -> None:
        q = make(tmp_path, SelfMetrics())
        raw = payload(1, 60)
        assert await q.put(Signal.TRACES, [memoryview(raw)[:20], b"+", memoryview(raw)[20:]], 2)
        assert q.used_bytes == 61
        await q.close()
        again = make(tmp_path, SelfMetrics())
        assert await drain_all(again) == [raw[:20] + b"+" + raw[20:]]
        await again.close()

    asyncio.run(run())


def test_put_get_ack_deletes_segments_and_frees_the_bound(tmp_path: Path) -> None:
    async def run() -> None:
        m = SelfMetrics()
        q = make(tmp_path, m)
        for i in range(50):
            assert await q.put(Signal.TRACES, payload(i), 1)
        assert q.used_bytes == 50 * 100
        assert q.segment_count() > 1  # 1 KiB segments rolled over
        assert await drain_all(q) == [payload(i) for i in range(50)]
        # Deletions run in a thread: wait for them, however slow the machine. Only the
        # active segment is left (unless it already went idle, below, meanwhile).
        assert await wait_for_async(lambda: q.used_bytes <= 1024, 30), q.used_bytes
        # Idle for a second: it is closed and deleted too. The bound is freed at once,
        # the file is unlinked by a thread afterwards: wait for both.
        assert await wait_for_async(
            lambda: q.used_bytes == 0 and segments.list_segments(tmp_path) == [], 30
        ), (q.used_bytes, segments.list_segments(tmp_path))
        await q.close()
        assert segments.list_segments(tmp_path) == []

    asyncio.run(run())


def test_bound_refuses(tmp_path: Path) -> None:
    async def run() -> None:
        q = DiskQueue(tmp_path, 1000, SelfMetrics())
        assert await q.put(Signal.TRACES, payload(0, 600), 1)
        assert not await q.put(Signal.TRACES, payload(1, 600), 1)  # past the bound
        assert q.used_bytes == 600
        assert await q.put(Signal.TRACES, payload(2, 400), 1)
        await q.close()

    asyncio.run(run())


def test_disk_full_refuses_then_recovers(tmp_path: Path) -> None:
    """A real 64 KiB tmpfs fills up: puts are refused (never half-written), the queue
    keeps working, and once records are delivered the space comes back."""
    try:
        fs_cm = small_filesystem(64)
        fs = fs_cm.__enter__()
    except PermissionError as err:
        pytest.skip(f"cannot mount a tmpfs here: {err}")
    try:

        async def run() -> None:
            q = DiskQueue(fs, 1 << 20, SelfMetrics(), segment_max_bytes=8192)
            accepted = 0
            for i in range(200):
                if not await q.put(Signal.TRACES, payload(i, 1000), 1):
                    break
                accepted += 1
            assert 30 < accepted < 70  # the filesystem, not the 1 MiB bound, said no
            got = await drain_all(q)
            assert got == [payload(i, 1000) for i in range(accepted)]  # nothing torn
            # Deletions run in a thread after the bound is freed: wait until the files are
            # gone (at most the active segment left), i.e. the filesystem has room again.
            assert await wait_for_async(lambda: len(segments.list_segments(fs)) <= 1, 30), (
                segments.list_segments(fs)
            )
            q._draining = False
            assert await q.put(Signal.TRACES, payload(999, 1000), 1)
            await q.close()

        asyncio.run(run())
    finally:
        fs_cm.__exit__(None, None, None)


def test_replay_after_close_keeps_unacked_and_leased(tmp_path: Path) -> None:
    async def run() -> None:
        m = SelfMetrics()
        q = make(tmp_path, m)
        for i in range(20):
            assert await q.put(Signal.TRACES if i % 2 else Signal.LOGS, payload(i), 1)
        lease = await q.get(250, 0.0)  # leased, never acked
        assert lease is not None
        assert await q.close() == {}
        q2 = make(tmp_path, m)
        got = await drain_all(q2)
        assert sorted(got) == sorted(payload(i) for i in range(20))
        assert (
            m.registry.get_sample_value(
                "gym_sidecar_queue_replayed_items_total", {"signal": "traces"}
            )
            == 10
        )
        await q2.close()

    asyncio.run(run())


def test_leased_records_keep_their_segments_until_acked(tmp_path: Path) -> None:
    """A lease is not an acknowledgement: records leased (every one of them, across
    several segments) and never acked keep their bytes in the bound and their segment
    files, and all of them are replayed after a restart."""

    async def run() -> None:
        m = SelfMetrics()
        q = make(tmp_path, m)
        for i in range(20):
            assert await q.put(Signal.TRACES, payload(i), 1)
        files_before = segments.list_segments(tmp_path)
        assert len(files_before) > 1  # 1 KiB segments: the lease spans several
        lease = await q.get(1 << 20, 0.0)
        assert lease is not None and len(lease.entries) == 20
        assert q.used_bytes == 20 * 100  # still held: nothing was acknowledged
        await q.close()  # awaits any deletion a wrong release might have started
        assert segments.list_segments(tmp_path) == files_before
        q2 = make(tmp_path, m)
        assert sorted(await drain_all(q2)) == [payload(i) for i in range(20)]
        await q2.close()

    asyncio.run(run())


def _record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> tuple[list[bool], list[int]]:
    """The ``fsync`` flag of every append, and every ``os.fsync`` of the segment files
    (the real ones still run)."""
    appends: list[bool] = []
    fsyncs: list[int] = []
    real_append = segments.SegmentWriter.append
    real_fsync = segments.os.fsync

    def append(self: segments.SegmentWriter, records: Any, fsync: bool) -> Any:
        appends.append(fsync)
        return real_append(self, records, fsync)

    def fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(segments.SegmentWriter, "append", append)
    monkeypatch.setattr(segments.os, "fsync", fsync)
    return appends, fsyncs


def test_fsync_interval_mode_writes_before_answering_and_fsyncs_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``interval``: put answers once the record is written (another reader sees it),
    without an fsync of its own; the sync loop fsyncs it afterwards."""
    appends, fsyncs = _record_fsyncs(monkeypatch)

    async def run() -> None:
        q = make(tmp_path, SelfMetrics(), fsync="interval", fsync_interval_s=0.2)
        assert await q.put(Signal.METRICS, payload(7), 3)
        assert appends == [False]  # the write did not wait for the disk
        records = [r for _, p in segments.list_segments(tmp_path) for r in segments.scan(p).records]
        assert [(r.signal, r.items) for r in records] == [(Signal.METRICS, 3)]
        assert await wait_for_async(lambda: fsyncs, 60, describe=lambda: (appends, fsyncs))
        await q.close()

    asyncio.run(run())


def test_fsync_always_mode_fsyncs_before_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    appends, fsyncs = _record_fsyncs(monkeypatch)

    async def run() -> None:
        q = make(tmp_path, SelfMetrics(), fsync="always", fsync_interval_s=3600)
        assert await q.put(Signal.METRICS, payload(7), 3)
        assert appends == [True] and fsyncs  # before put answered (the loop waits an hour)
        await q.close()

    asyncio.run(run())


def test_damage_is_counted_skipped_and_the_rest_delivered(tmp_path: Path) -> None:
    async def fill() -> None:
        q = make(tmp_path, SelfMetrics(), segment_max_bytes=400)
        for i in range(12):
            assert await q.put(Signal.TRACES, payload(i), 1)
        await q.close()

    asyncio.run(fill())
    segs = segments.list_segments(tmp_path)
    assert len(segs) >= 4
    # 1st segment: flip a payload byte of its first record (checksum).
    data = bytearray(segs[0][1].read_bytes())
    data[len(segments.MAGIC) + segments.HEADER_BYTES + 20] ^= 0xFF
    segs[0][1].write_bytes(bytes(data))
    # 2nd: cut mid-record (truncated tail).
    raw = segs[1][1].read_bytes()
    segs[1][1].write_bytes(raw[: len(raw) - 30])
    # 3rd: wrong magic (whole segment).
    raw = segs[2][1].read_bytes()
    segs[2][1].write_bytes(b"XXXXXXXX" + raw[8:])

    async def replay() -> list[bytes]:
        m = SelfMetrics()
        q = make(tmp_path, m, segment_max_bytes=400)
        got = await drain_all(q)
        assert corrupt(m, "checksum") == 1
        assert corrupt(m, "truncated") == 1
        assert corrupt(m, "bad_magic") == 1
        await q.close()
        return got

    got = asyncio.run(replay())
    lost = {payload(i) for i in range(12)} - set(got)
    per_segment = 3  # 400-byte segments of 113-byte records
    assert len(lost) == 1 + 1 + per_segment
    assert set(got) <= {payload(i) for i in range(12)}


def test_damage_found_when_leasing_is_dropped_and_counted(tmp_path: Path) -> None:
    async def run() -> None:
        m = SelfMetrics()
        q = make(tmp_path, m)
        for i in range(3):
            assert await q.put(Signal.TRACES, payload(i), 5)
        (_, path), *_ = segments.list_segments(tmp_path)
        with path.open("r+b") as f:  # damage record 1 behind the queue's back
            f.seek(len(segments.MAGIC) + 113 + segments.HEADER_BYTES + 5)
            f.write(b"!")
        got = await drain_all(q)
        assert got == [payload(0), payload(2)]
        assert corrupt(m, "checksum") == 1
        assert (
            m.registry.get_sample_value(
                "gym_sidecar_dropped_items_total", {"signal": "traces", "reason": "corrupt_segment"}
            )
            == 5
        )
        await q.close()

    asyncio.run(run())


def test_one_process_per_directory(tmp_path: Path) -> None:
    async def run() -> None:
        q = make(tmp_path, SelfMetrics())
        with pytest.raises(OSError, match="in use"):
            make(tmp_path, SelfMetrics())
        await q.close()
        make(tmp_path, SelfMetrics())

    asyncio.run(run())


def test_build_queue_defaults_to_memory(tmp_path: Path) -> None:
    assert isinstance(build_queue(QueueConfig(), SelfMetrics()), MemoryQueue)
    cfg = QueueConfig(persistent=True, directory=str(tmp_path / "q"))

    async def run() -> None:
        q = build_queue(cfg, SelfMetrics())
        assert isinstance(q, DiskQueue)
        await q.close()

    asyncio.run(run())
    with pytest.raises(ValueError, match="directory"):
        QueueConfig(persistent=True)


def test_a_get_cancelled_while_reading_puts_its_records_back(tmp_path: Path) -> None:
    """Shutdown can cancel a sender blocked in ``get`` while its payloads are read from
    disk: those records must stay queued (and their segment on disk), in order."""

    async def run() -> None:
        q = make(tmp_path, SelfMetrics())
        for i in range(5):
            assert await q.put(Signal.TRACES, payload(i), 1)
        original = q._reader.read
        reading, release = threading.Event(), threading.Event()

        def slow_read(positions: Any) -> Any:
            reading.set()
            release.wait(5)
            return original(positions)

        q._reader.read = slow_read  # type: ignore[method-assign]
        task = asyncio.create_task(q.get(250, 0.0))
        assert await asyncio.to_thread(reading.wait, 5)
        task.cancel()
        release.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        q._reader.read = original  # type: ignore[method-assign]
        assert await drain_all(q) == [payload(i) for i in range(5)]
        await q.close()

    asyncio.run(run())


def test_a_lease_holds_as_many_records_as_fit_and_at_least_one(tmp_path: Path) -> None:
    """``get(max_bytes)`` takes records in order while they fit (a batch of exactly
    ``max_bytes`` included), one record even when it alone is larger, and says which
    signal they are, with each record's item count and enqueue time."""

    async def run() -> None:
        q = make(tmp_path, SelfMetrics())
        for i in range(10):
            assert await q.put(Signal.LOGS, payload(i), i + 1)
        got: list[list[bytes]] = []
        for max_bytes in (350, 300, 50, 1 << 20):
            lease = await q.get(max_bytes, 0.0)
            assert lease is not None and lease.signal is Signal.LOGS
            got.append([e.payload for e in lease.entries])
            for e in lease.entries:
                assert e.items == int(e.payload[:8]) + 1
                assert isinstance(e.enqueued_at, float) and e.enqueued_at > 0
            await q.ack(lease)
        assert got == [
            [payload(0), payload(1), payload(2)],  # 300 <= 350 < 400
            [payload(3), payload(4), payload(5)],  # exactly 300
            [payload(6)],  # larger than 50 alone: still taken
            [payload(7), payload(8), payload(9)],
        ]
        await q.close()

    asyncio.run(run())


def test_the_bytes_left_pending_decide_when_a_batch_is_ready(tmp_path: Path) -> None:
    """With a long linger a batch is ready only once ``max_bytes`` are pending: after a
    lease takes 200 of 300 bytes, the 100 left are not a batch of 200 (this gives the
    queue a moment to answer wrongly; a slow machine only gives it more)."""

    async def run() -> None:
        q = make(tmp_path, SelfMetrics())
        for i in range(3):
            assert await q.put(Signal.TRACES, payload(i), 1)
        lease = await q.get(200, 3600.0)
        assert lease is not None and len(lease.entries) == 2
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.get(200, 3600.0), 0.5)
        assert await q.put(Signal.TRACES, payload(3), 1)  # now 200 pending: ready
        second = await asyncio.wait_for(q.get(200, 3600.0), 60)
        assert second is not None
        assert [e.payload for e in second.entries] == [payload(2), payload(3)]
        await q.close()

    asyncio.run(run())


def test_two_leases_are_acked_apart(tmp_path: Path) -> None:
    """Two leases outstanding, the first acked twice (harmless), the second never: after
    a restart every record of the second comes back, and the first's segment, all of
    it acked, is gone (replay is per segment: acked records that share a segment with
    unacked ones come back too; at least once)."""

    async def run() -> None:
        m = SelfMetrics()
        q = make(tmp_path, m)
        for i in range(20):
            assert await q.put(Signal.TRACES, payload(i), 1)
        first = await q.get(1000, 0.0)
        second = await q.get(1000, 0.0)
        assert first is not None and second is not None and first.id != second.id
        assert len(first.entries) == len(second.entries) == 10
        await q.ack(first)
        await q.ack(first)
        await q.close()
        q2 = make(tmp_path, m)
        replayed = set(await drain_all(q2))
        assert {payload(i) for i in range(10, 20)} <= replayed
        assert payload(0) not in replayed  # its segment held only acked records
        await q2.close()

    asyncio.run(run())


def test_records_appended_after_everything_was_acked_survive_a_restart(tmp_path: Path) -> None:
    """Acking every record must not delete the segment still being appended to: what is
    written next goes there (or to a new one) and is replayed after a restart."""

    async def run() -> None:
        m = SelfMetrics()
        q = make(tmp_path, m)
        for i in range(3):
            assert await q.put(Signal.TRACES, payload(i), 1)
        lease = await q.get(1 << 20, 0.0)
        assert lease is not None
        await q.ack(lease)
        for i in range(3, 6):
            assert await q.put(Signal.TRACES, payload(i), 1)
        await q.close()
        q2 = make(tmp_path, m)
        # the acked 0-2 may come back with them (same segment: at least once)
        assert {payload(i) for i in range(3, 6)} <= set(await drain_all(q2))
        await q2.close()

    asyncio.run(run())
