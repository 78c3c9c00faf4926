"""Helpers for the fault suite: memory of a process, a small real filesystem, span ids.

Everything here works on real processes and real kernels (Linux ``/proc``, ``tmpfs``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from testkit.wait import wait_for

TRACE_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of ``pid`` from /proc/<pid>/status (``VmRSS`` or ``VmHWM``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@contextlib.contextmanager
def small_filesystem(size_kib: int) -> Iterator[Path]:
    """A real tmpfs of ``size_kib`` mounted on a fresh directory (needs root: the
    caller skips when it cannot mount)."""
    path = Path(tempfile.mkdtemp(prefix="gym-faults-fs-"))
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if res.returncode != 0:
        path.rmdir()
        raise PermissionError(res.stderr.decode(errors="replace").strip())
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.rmdir()


def span_request(ids: range, attr_bytes: int = 64, service: str = "faults") -> bytes:
    """A trace export request whose spans are named ``s<id>`` (ids tracked end to end)."""
    spans = [
        Span(
            trace_id=i.to_bytes(16, "big"),
            span_id=(i + 1).to_bytes(8, "big"),
            name=f"s{i}",
            start_time_unix_nano=1,
            end_time_unix_nano=2,
            attributes=[KeyValue(key="pad", value=AnyValue(string_value="p" * attr_bytes))],
        )
        for i in ids
    ]
    req = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(
                    attributes=[KeyValue(key="service.name", value=AnyValue(string_value=service))]
                ),
                scope_spans=[ScopeSpans(spans=spans)],
            )
        ]
    )
    return req.SerializeToString()


def span_ids_of(requests: list[ExportTraceServiceRequest]) -> list[int]:
    """The ``s<id>`` names of every span in ``requests`` as ints (duplicates kept)."""
    return [
        int(sp.name[1:])
        for r in requests
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for sp in ss.spans
        if sp.name.startswith("s") and sp.name[1:].isdigit()
    ]


class GrpcLoad:
    """Background threads sending span requests over OTLP/gRPC; tracks what was acked.

    Each request carries ``batch`` spans with fresh ids. A request answered OK adds its
    ids to ``acked``; RESOURCE_EXHAUSTED / UNAVAILABLE (and CANCELLED or DEADLINE_EXCEEDED when
    the server stops mid-call) are counted and the same ids are
    retried after a short pause (like an SDK exporter would); nothing else is expected.
    """

    def __init__(
        self, endpoint: str, threads: int = 2, batch: int = 20, pause_s: float = 0.01
    ) -> None:
        self.endpoint = endpoint
        self.batch = batch
        self.pause_s = pause_s
        self.acked: set[int] = set()
        self.codes: dict[str, int] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _ids(self) -> range:
        with self._lock:
            start = self._next
            self._next += self.batch
        return range(start, start + self.batch)

    def _count(self, code: str) -> None:
        with self._lock:
            self.codes[code] = self.codes.get(code, 0) + 1

    def _run(self) -> None:
        channel = grpc.insecure_channel(self.endpoint)
        call = channel.unary_unary(TRACE_METHOD)
        ids = self._ids()
        try:
            while not self._stop.is_set():
                try:
                    call(span_request(ids), timeout=10)
                except grpc.RpcError as err:
                    code = err.code().name
                    self._count(code)
                    if err.code() not in (
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        grpc.StatusCode.CANCELLED,  # the server stopped mid-call
                    ):
                        self.errors.append(f"{code}: {err.details()}")
                    self._stop.wait(0.1)
                    continue
                self._count("OK")
                with self._lock:
                    self.acked.update(ids)
                ids = self._ids()
                if self.pause_s:
                    self._stop.wait(self.pause_s)
        finally:
            channel.close()

    def start(self) -> GrpcLoad:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.1) -> bool:
    """:func:`testkit.wait.wait_for` with a required timeout and the fault suite's
    coarser poll (its predicates read whole sinks and directories)."""
    return wait_for(predicate, timeout_s, interval_s)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
