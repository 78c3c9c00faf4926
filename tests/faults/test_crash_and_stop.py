"""Process faults against a real ``gym-sidecar``: SIGKILL mid-stream and SIGTERM under load.

SIGKILL runs with the on-disk queue (both fsync policies) and restarts a second process
on the same directory: every span a client was answered OK for must arrive; duplicates
are allowed and counted. SIGTERM runs with both queue kinds: the process drains and
exits 0, and nothing that was acknowledged is lost (with the on-disk queue, whatever the
deadline left behind arrives after a restart). Damaged segment files found at a
restart are skipped and counted while the rest is delivered.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from gym_sidecar.export import segments
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from testkit.sink import RecordingSink
from tests.faults.support import (
    TRACE_METHOD,
    GrpcLoad,
    span_ids_of,
    span_request,
    wait_until,
)
from tests.support.ports import free_port
from tests.support.sidecar_proc import SidecarProcess

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
    in_flight = 2
    config = {
        "queue": disk_queue(
            qdir,
            fsync=fsync,
            fsync_interval_ms=500,
            segment_max_bytes=MiB,
            max_in_flight=in_flight,
        )
    }
    with RecordingSink() as sink:
        # The backend answers nothing until released: whatever the machine's speed, every
        # span acknowledged once both export slots are stuck is queued at the kill.
        sink.hold()
        first = SidecarProcess(backend=sink.endpoint, config=config).start()
        load = GrpcLoad(first.grpc_endpoint, threads=3, batch=50, pause_s=0.0).start()
        assert wait_until(lambda: sink.held_calls >= in_flight, 60), sink.held_calls
        stuck_at = load.acked_count()
        assert wait_until(lambda: load.acked_count() >= stuck_at + 500, 60)
        first.signal(signal.SIGKILL)  # mid-stream: clients are sending, exports in flight
        assert first.proc is not None
        first.proc.wait(10)
        load.stop()
        acked = set(load.acked)
        on_disk = sum(p.stat().st_size for p in qdir.glob("*.seg"))
        sink.release()  # exports the dead process had in flight still land at the sink
        assert wait_until(lambda: sink.held_calls == 0, 30)
        arrived_before = set(received(sink))
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
        f"not yet delivered at the kill ({on_disk // 1024} KiB on disk), {replayed:.0f} replayed, "
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
        assert wait_until(lambda: load.acked_count() >= 500, 60)  # a count, not a time
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


def test_damaged_segments_are_skipped_counted_and_the_rest_delivered(tmp_path: Path) -> None:
    """Stop with the backend down (the queue stays on disk), damage three segment files
    for real (a flipped payload byte, a wrong magic, a cut tail), restart with the
    backend up: exactly the undamaged records arrive; the damage is counted and logged."""
    qdir = tmp_path / "queue"
    port = free_port()  # the backend is down at first
    config = {
        "queue": disk_queue(qdir, segment_max_bytes=8 * 1024),
        "shutdown_timeout_s": 2,
    }
    with SidecarProcess(backend=f"127.0.0.1:{port}", config=config) as sc:
        channel = grpc.insecure_channel(sc.grpc_endpoint)
        call = channel.unary_unary(TRACE_METHOD)
        for i in range(30):
            call(span_request(range(i * 20, i * 20 + 20)), timeout=10)
        channel.close()
    assert sc.returncode == 0
    segs = segments.list_segments(qdir)
    assert len(segs) >= 4, segs

    def ids_in(path: Path, offsets: set[int] | None = None) -> set[int]:
        data = path.read_bytes()
        out: set[int] = set()
        for rec in segments.scan(path).records:
            if offsets is None or rec.offset in offsets:
                start = rec.offset + segments.HEADER_BYTES
                req = ExportTraceServiceRequest.FromString(data[start : start + rec.length])
                out.update(span_ids_of([req]))
        return out

    all_ids = set().union(*(ids_in(p) for _, p in segs))
    assert all_ids == set(range(600))
    first = segments.scan(segs[0][1]).records[0]
    last_path = segs[-1][1]
    last = segments.scan(last_path).records[-1]
    lost = (
        ids_in(segs[0][1], {first.offset}) | ids_in(segs[1][1]) | ids_in(last_path, {last.offset})
    )
    with segs[0][1].open("r+b") as f:  # checksum: one payload byte flipped
        f.seek(first.offset + segments.HEADER_BYTES + first.length // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with segs[1][1].open("r+b") as f:  # bad magic: the whole segment
        f.write(b"NOTASEG!")
    with last_path.open("r+b") as f:  # truncated: the last record cut short
        f.truncate(last_path.stat().st_size - 7)

    with (
        RecordingSink(port=port) as sink,
        SidecarProcess(backend=sink.endpoint, config=config) as again,
    ):
        want = all_ids - lost
        assert wait_until(lambda: want <= set(received(sink)), 30)
        time.sleep(1)
        got = set(received(sink))
        kinds = {
            k: again.metric("gym_sidecar_queue_corrupt_records_total", kind=k)
            for k in ("checksum", "bad_magic", "truncated")
        }
        assert wait_until(lambda: not list(qdir.glob("*.seg")), 20)
        log = again.log_text()
    print(
        f"\ndamaged segments: {len(all_ids)} spans on disk, {len(lost)} in damaged records, "
        f"{len(got)} delivered after restart, counted {kinds}"
    )
    assert got == want
    assert kinds == {"checksum": 1, "bad_magic": 1, "truncated": 1}
    assert log.count("record skipped") == 3


def test_second_sidecar_on_the_same_directory_refuses_to_start(tmp_path: Path) -> None:
    config = {"queue": disk_queue(tmp_path / "queue")}
    with RecordingSink() as sink, SidecarProcess(backend=sink.endpoint, config=config):
        second = SidecarProcess(backend=sink.endpoint, config=config)
        with pytest.raises(RuntimeError, match="exited early with code 1"):
            second.start()
        assert "in use by another process" in second.log_text()
