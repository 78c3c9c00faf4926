"""The queue's limits reached for real: backpressure reaches the clients.

The backend is down (nothing listens on its port), so the sidecar's queue fills. gRPC
clients then get RESOURCE_EXHAUSTED with a ``RetryInfo`` delay and HTTP clients 429 with
``Retry-After``; once the backend listens, everything that was answered OK arrives.
With the on-disk queue the same holds when the *filesystem* fills first (a real 256 KiB
tmpfs under a 64 MiB bound): a full disk is backpressure, not loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from testkit.sink import RecordingSink
from tests.faults.support import TRACE_METHOD, small_filesystem, span_ids_of, span_request
from tests.support.ports import free_port
from tests.support.sidecar_proc import SidecarProcess

KiB = 1024


def retry_delay_s(err: grpc.RpcError) -> float | None:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


def fill_until_pushed_back(sc: SidecarProcess, limit: int = 2000) -> tuple[set[int], float]:
    """Send 20-span requests until the sidecar pushes back; (acked ids, RetryInfo s)."""
    channel = grpc.insecure_channel(sc.grpc_endpoint)
    call = channel.unary_unary(TRACE_METHOD)
    acked: set[int] = set()
    try:
        for i in range(limit):
            ids = range(i * 20, i * 20 + 20)
            try:
                call(span_request(ids, attr_bytes=200), timeout=10)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                delay = retry_delay_s(err)
                assert delay is not None and delay > 0
                return acked, delay
            acked.update(ids)
    finally:
        channel.close()
    raise AssertionError(f"no backpressure after {limit} requests")


@contextlib.contextmanager
def queue_config(kind: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if kind == "memory":
        yield {"max_bytes": 64 * KiB, "batch_max_bytes": 16 * KiB}
    elif kind == "disk":
        yield {
            "max_bytes": 64 * KiB,
            "batch_max_bytes": 16 * KiB,
            "persistent": True,
            "directory": str(tmp_path / "q"),
            "segment_max_bytes": 16 * KiB,
        }
    else:  # disk full: the filesystem is much smaller than the bound
        try:
            with small_filesystem(256) as fs:
                yield {
                    "max_bytes": 64 * 1024 * KiB,
                    "persistent": True,
                    "directory": str(fs / "q"),
                    "segment_max_bytes": 32 * KiB,
                }
        except PermissionError as err:
            pytest.skip(f"cannot mount a tmpfs here: {err}")


@pytest.mark.parametrize("kind", ["memory", "disk", "disk_full"])
def test_limit_reached_pushes_back_on_grpc_and_http_clients(tmp_path: Path, kind: str) -> None:
    port = free_port()  # the backend: nothing listens yet
    with queue_config(kind, tmp_path) as queue:
        queue |= {"retry_initial_interval_s": 0.2, "retry_max_interval_s": 0.5}
        with SidecarProcess(backend=f"127.0.0.1:{port}", config={"queue": queue}) as sc:
            acked, delay = fill_until_pushed_back(sc)
            for i in range(50):  # the gRPC refusal may have left room for a smaller one
                ids = range(10**6 + i * 20, 10**6 + i * 20 + 20)
                resp = httpx.post(
                    sc.http_url + "/v1/traces",
                    content=span_request(ids, attr_bytes=200),
                    headers={"Content-Type": "application/x-protobuf"},
                )
                if resp.status_code != 200:
                    break
                acked.update(ids)
            assert resp.status_code == 429, resp.text
            assert int(resp.headers["Retry-After"]) >= 1
            refused = sc.metric("gym_sidecar_refused_items_total", reason="queue_full")
            assert refused >= 40
            with RecordingSink(port=port) as sink:  # the backend comes up
                assert sink.wait_for(
                    lambda: acked <= set(span_ids_of(list(sink.requests["traces"]))), 30
                )
                # Room again: new data is accepted.
                ok = httpx.post(
                    sc.http_url + "/v1/traces",
                    content=span_request(range(2 * 10**6, 2 * 10**6 + 5)),
                    headers={"Content-Type": "application/x-protobuf"},
                )
                assert ok.status_code == 200
                dropped = sc.metric("gym_sidecar_dropped_items_total")
        print(
            f"\nqueue limit ({kind}): {len(acked)} spans accepted before pushback "
            f"(RetryInfo {delay:.1f}s, HTTP 429 Retry-After {resp.headers['Retry-After']}), "
            f"{refused:.0f} items refused, all accepted delivered, dropped {dropped:.0f}"
        )
        assert dropped == 0
