"""Process faults against a real ``gym-sidecar``: SIGKILL mid-stream and SIGTERM under load.

SIGKILL runs with the on-disk queue (both fsync policies) and restarts a second process
on the same directory: every span a client was answered OK for must arrive; duplicates
are allowed and counted. SIGTERM runs with both queue kinds: the process drains and
exits 0, and nothing that was acknowledged is lost (with the on-disk queue, whatever the
deadline left behind arrives after a restart).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.faults.support import GrpcLoad, span_ids_of, wait_until
from tests.support.sidecar_proc import SidecarProcess
from tests.support.sink import RecordingSink

MiB = 1024 * 1024


def received(sink: RecordingSink) -> list[int]:
    with sink._lock:
        reqs = list(sink.requests["traces"])
    return span_ids_of(reqs)


def duplicates(ids: list[int]) -> int:
    return sum(n - 1 for n in Counter(ids).values() if n > 1)


def disk_queue(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"persistent": True, "directory": str(directory), "max_bytes": 32 * MiB, **extra}


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_sigkill_mid_stream_then_restart_delivers_every_acknowledged_span(
    tmp_path: Path, fsync: str
) -> None:
    qdir = tmp_path / "queue"
    config = {"queue": disk_queue(qdir, fsync=fsync, fsync_interval_ms=500, segment_max_bytes=MiB)}
    with RecordingSink() as sink:
        sink.delay_s = 0.2  # a slow backend, so the queue holds data when the kill comes
        first = SidecarProcess(backend=sink.endpoint, config=config).start()
        load = GrpcLoad(first.grpc_endpoint, threads=3, batch=50, pause_s=0.0).start()
        time.sleep(3)
        first.signal(signal.SIGKILL)  # mid-stream: clients are sending, exports in flight
        assert first.proc is not None
        first.proc.wait(10)
        load.stop()
        acked = set(load.acked)
        on_disk = sum(p.stat().st_size for p in qdir.glob("*.seg"))
        arrived_before = set(received(sink))
        sink.delay_s = 0.0
        with SidecarProcess(backend=sink.endpoint, config=config) as second:
            assert wait_until(lambda: acked <= set(received(sink)), 60), (
                f"{len(acked - set(received(sink)))} acknowledged spans lost"
            )
            replayed = second.metric("gym_sidecar_queue_replayed_items_total")
            corrupt = second.metric("gym_sidecar_queue_corrupt_records_total")
            # Delivered segments are deleted: the footprint shrinks back to nothing.
            assert wait_until(lambda: not list(qdir.glob("*.seg")), 20)
        ids = received(sink)
    dups = duplicates(ids)
    print(
        f"\nSIGKILL (fsync={fsync}): {len(acked)} spans acked, {len(acked - arrived_before)} "
        f"still queued at the kill ({on_disk // 1024} KiB on disk), {replayed:.0f} replayed, "
        f"{dups} duplicates, {corrupt:.0f} corrupt records skipped, lost 0"
    )
    assert len(acked - arrived_before) > 0  # the kill really left queued data behind
    assert replayed > 0
    assert not load.errors, load.errors[:3]


@pytest.mark.parametrize("persistent", [False, True], ids=["memory", "disk"])
def test_sigterm_under_load_drains_and_loses_nothing(tmp_path: Path, persistent: bool) -> None:
    qdir = tmp_path / "queue"
    queue: dict[str, Any] = disk_queue(qdir) if persistent else {"max_bytes": 8 * MiB}
    config = {"queue": queue, "shutdown_timeout_s": 20}
    with RecordingSink() as sink:
        sink.delay_s = 0.05
        sc = SidecarProcess(backend=sink.endpoint, config=config).start()
        load = GrpcLoad(sc.grpc_endpoint, threads=3, batch=50, pause_s=0.0).start()
        time.sleep(3)
        sc.signal(signal.SIGTERM)  # while the clients keep sending
        code = sc.stop(timeout_s=40)
        load.stop()
        acked = set(load.acked)
        arrived = set(received(sink))
        left = acked - arrived
        if persistent and left:  # past the deadline: kept on disk, sent after restart
            with SidecarProcess(backend=sink.endpoint, config=config):
                assert wait_until(lambda: acked <= set(received(sink)), 60)
        log = sc.log_text()
    print(
        f"\nSIGTERM under load ({'disk' if persistent else 'memory'} queue): exit {code}, "
        f"{len(acked)} spans acked, {len(acked) - len(left)} delivered before exit, "
        f"client answers {load.codes}, lost {len(acked - set(received(sink)))}"
    )
    assert code == 0, log[-2000:]
    assert acked <= set(received(sink))
    assert len(acked) > 0 and not load.errors
    if not persistent:
        assert not left
