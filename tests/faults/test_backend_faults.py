"""Backend faults injected for real against a real ``gym-sidecar`` process.

- the backend goes away under steady load (at least 30 s, ``GYM_FAULTS_BACKEND_DOWN_S``,
  and until the queue is full and clients are pushed back, however long the load takes
  to fill it), once with the in-memory queue and once with the on-disk queue: after it
  comes back,
  every span a client was told OK arrives, and the sidecar's resident memory stays within
  the configured queue bound (plus a fixed allowance for the process itself);
- a slow backend: everything acknowledged arrives;
- an OTLP/HTTP backend answering 429 and 503 with ``Retry-After``: the hint is honoured;
- a backend rejecting everything permanently: drops are counted and each batch is tried
  exactly once (no retry storm).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from testkit.sink import RecordingSink
from tests.faults.support import GrpcLoad, rss_kib, span_ids_of, span_request, wait_until
from tests.sidecar.export.http_backend import ScriptedHttpBackend
from tests.support.sidecar_proc import SidecarProcess

MiB = 1024 * 1024
DOWN_S = float(os.environ.get("GYM_FAULTS_BACKEND_DOWN_S", "30"))
QUEUE_MAX_BYTES = 8 * MiB
RSS_ALLOWANCE_KIB = 48 * 1024
"""Memory the process may add beyond the queue bound: per in-flight batch copies, gRPC
and allocator slack. The point is that growth stops: without a bound, 30 s of this load
would queue hundreds of MiB."""

FAST_RETRY = {
    "retry_initial_interval_s": 0.2,
    "retry_max_interval_s": 1.0,
    "retry_max_elapsed_s": None,
}


class RssSampler:
    """Samples a process's VmRSS every 0.2 s in a thread; keeps the maximum."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_kib = max(self.peak_kib, rss_kib(self.pid))
            except (OSError, AssertionError):
                return
            self._stop.wait(0.2)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def received_ids(sink: RecordingSink) -> list[int]:
    with sink._lock:
        reqs = list(sink.requests["traces"])
    return span_ids_of(reqs)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("persistent", [False, True], ids=["memory", "disk"])
def test_backend_down_under_load_loses_nothing_and_memory_stays_bounded(
    tmp_path: Path, persistent: bool
) -> None:
    queue: dict[str, Any] = {"max_bytes": QUEUE_MAX_BYTES, **FAST_RETRY}
    if persistent:
        queue |= {"persistent": True, "directory": str(tmp_path / "queue")}
    sink = RecordingSink().start()
    port = sink.port
    with SidecarProcess(backend=sink.endpoint, config={"queue": queue}) as sc:
        assert sc.proc is not None
        base_kib = rss_kib(sc.proc.pid)
        load = GrpcLoad(sc.grpc_endpoint, threads=2, batch=50, pause_s=0.005).start()
        with RssSampler(sc.proc.pid) as rss:
            time.sleep(2)
            sink.stop()  # the backend goes away
            first = received_ids(sink)
            down_at = time.monotonic()
            acked_before_down = load.acked_count()
            time.sleep(DOWN_S)
            # Down until the bound is reached: a condition, not a time (a slow machine's
            # clients take longer to fill the queue).
            assert wait_until(lambda: load.codes.get("RESOURCE_EXHAUSTED", 0) > 0, 600)
            acked_while_down = load.acked_count() - acked_before_down
            pushed_back = load.codes.get("RESOURCE_EXHAUSTED", 0)
            sink = RecordingSink(port=port).start()  # it comes back on the same address
            up_after_s = time.monotonic() - down_at
            time.sleep(3)
            load.stop()
            acked = set(load.acked)

            def arrived() -> set[int]:
                return set(first) | set(received_ids(sink))

            assert wait_until(lambda: acked <= arrived(), 60), (
                f"{len(acked - arrived())} acknowledged spans never arrived"
            )
        held_mib = sc.metric("gym_sidecar_queue_capacity_bytes") / MiB
        dropped = sc.metric("gym_sidecar_dropped_items_total")
    sink.stop()
    growth_kib = rss.peak_kib - base_kib
    print(
        f"\nbackend down {up_after_s:.1f}s ({'disk' if persistent else 'memory'} queue "
        f"{held_mib:.0f} MiB): acked {len(acked)} spans ({acked_while_down} while down), "
        f"{pushed_back} pushbacks, peak RSS {rss.peak_kib // 1024} MiB "
        f"(+{growth_kib // 1024} MiB), dropped {dropped:.0f}, lost 0"
    )
    assert not load.errors, load.errors[:3]
    assert pushed_back > 0  # the bound was reached and clients were told to retry
    assert dropped == 0
    assert growth_kib <= QUEUE_MAX_BYTES // 1024 + RSS_ALLOWANCE_KIB


def test_slow_backend_everything_acknowledged_arrives() -> None:
    with RecordingSink() as sink:
        sink.delay_s = 0.3
        with SidecarProcess(backend=sink.endpoint, config={"queue": {"max_bytes": 2 * MiB}}) as sc:
            load = GrpcLoad(sc.grpc_endpoint, threads=2, batch=50, pause_s=0.01).start()
            assert wait_until(lambda: load.acked_count() >= 1000, 120)  # a count, not a time
            load.stop()
            acked = set(load.acked)
            assert wait_until(lambda: acked <= set(received_ids(sink)), 60)
            slow_calls = sink.calls
        print(
            f"\nslow backend (0.3 s per call): {len(acked)} spans acked and delivered "
            f"in {slow_calls} export calls, codes {load.codes}"
        )
        assert len(acked) > 0 and not load.errors


class TimedHttpBackend(ScriptedHttpBackend):
    """The scripted OTLP/HTTP backend, also recording when each request came in."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def _answer(self, path: str, body: bytes) -> tuple[int, str | None]:
        self.times.append(time.monotonic())
        return super()._answer(path, body)


def test_http_429_and_503_retry_after_is_honoured() -> None:
    with TimedHttpBackend() as backend:
        backend.fail_next(1, 429, "2")
        backend.fail_next(1, 503, "1")
        config = {
            "backend": {"protocol": "http/protobuf"},
            "queue": {"retry_initial_interval_s": 0.05, "retry_max_interval_s": 0.1},
        }
        with SidecarProcess(backend=backend.url, config=config) as sc:
            conn = grpc.insecure_channel(sc.grpc_endpoint)
            call = conn.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            call(span_request(range(5)), timeout=10)
            conn.close()
            assert wait_until(lambda: len(backend.span_names()) == 5, 20)
        assert backend.statuses[:3] == [429, 503, 200]
        gaps = [b - a for a, b in zip(backend.times, backend.times[1:], strict=False)]
        print(
            f"\n429 Retry-After 2 then 503 Retry-After 1: gaps {gaps[0]:.2f}s, {gaps[1]:.2f}s "
            "(own backoff would be <= 0.1 s)"
        )
        assert gaps[0] >= 1.9
        assert gaps[1] >= 0.9


def test_permanent_rejection_drops_are_counted_without_retry_storm() -> None:
    with RecordingSink() as sink:
        sink.fail_next(10_000, grpc.StatusCode.INVALID_ARGUMENT)
        queue = {"batch_timeout_s": 0.05, **FAST_RETRY}
        with SidecarProcess(backend=sink.endpoint, config={"queue": queue}) as sc:
            conn = grpc.insecure_channel(sc.grpc_endpoint)
            call = conn.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            requests = 40
            for i in range(requests):
                call(span_request(range(i * 10, i * 10 + 10)), timeout=10)
                time.sleep(0.02)
            conn.close()
            assert wait_until(
                lambda: (
                    sc.metric("gym_sidecar_dropped_items_total", reason="permanent_error")
                    == requests * 10
                ),
                20,
            )
            time.sleep(2)  # a retry storm would show up as more calls now
            attempts = sc.metric("gym_sidecar_export_attempts_total")
            calls = sink.calls
        print(
            f"\npermanent rejection: {requests} requests -> {calls} backend calls, "
            f"{attempts:.0f} attempts, {requests * 10} spans dropped and counted"
        )
        assert calls == attempts  # every attempt reached the backend once
        assert calls <= requests  # batching may merge requests; nothing is retried
        assert sink.span_count == 0
