"""Admin endpoints, readiness, signals and the shutdown sequence of a real sidecar."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from gym_sidecar.config import load_config
from gym_sidecar.server import SidecarServer

from testkit.otlp_samples import grpc_export, http_post, trace_request
from testkit.sink import RecordingSink
from testkit.wait import wait_for
from tests.support.ports import free_port
from tests.support.sidecar_proc import SidecarProcess


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


def test_admin_endpoints(sink: RecordingSink) -> None:
    with SidecarProcess(backend=sink.endpoint) as sc:
        assert sc.admin_get("/healthz") == (200, "ok\n")
        assert sc.admin_get("/readyz")[0] == 200
        grpc_export(sc.grpc_endpoint, "traces", trace_request("admin", 4))
        resp = httpx.get(sc.admin_url + "/metrics")
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/plain; version=")
        text = resp.text
        assert 'gym_sidecar_received_items_total{signal="traces",transport="grpc"} 4.0' in text
        assert "gym_sidecar_queue_capacity_bytes" in text
        assert httpx.get(sc.admin_url + "/nope").status_code == 404
    assert sc.returncode == 0


@pytest.mark.parametrize("native_env", ["0", None], ids=["GYM_SIDECAR_NATIVE=0", "default"])
def test_the_trace_scanner_in_use_is_on_metrics_and_logged_at_start(
    native_env: str | None,
) -> None:
    """Before any trace arrives, /metrics says which scanner runs (an operator's check
    that the fast path is in the image) and the log says it once, with the reason."""
    import importlib.util

    installed = importlib.util.find_spec("gym_sidecar_native") is not None
    env = {} if native_env is None else {"GYM_SIDECAR_NATIVE": native_env}
    want = "native" if installed and native_env is None else "python"
    with SidecarProcess(env=env) as sc:
        assert sc.metric("gym_sidecar_trace_scanner_info", scanner=want) == 1.0
        other = "python" if want == "native" else "native"
        assert (
            f'gym_sidecar_trace_scanner_info{{scanner="{other}"}}'
            not in httpx.get(sc.admin_url + "/metrics").text
        )
        lines = [ln for ln in sc.log_text().splitlines() if "trace scanner:" in ln]
    assert len(lines) == 1, lines
    if want == "native":
        assert lines[0].endswith("trace scanner: native (gym_sidecar_native)")
    elif native_env == "0":
        assert lines[0].endswith("trace scanner: python (GYM_SIDECAR_NATIVE=0)")
    else:
        assert lines[0].endswith("trace scanner: python (gym_sidecar_native is not installed)")


def test_readyz_503_while_draining_then_exit_0() -> None:
    """With the backend down, the drain takes until the deadline; /readyz says 503."""
    dead_backend = f"127.0.0.1:{free_port()}"
    with SidecarProcess(backend=dead_backend, env={"GYM_SIDECAR_SHUTDOWN_TIMEOUT_S": "5"}) as sc:
        grpc_export(sc.grpc_endpoint, "traces", trace_request("stuck", 5))
        sc.signal(signal.SIGTERM)
        seen_503 = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sc.proc is not None and sc.proc.poll() is None:
            status, body = sc.admin_get("/readyz")
            if status == 503:
                assert "shutting down" in body
                seen_503 = True
                break
            time.sleep(0.05)
        assert seen_503
        started = time.monotonic()
        assert sc.stop(timeout_s=60) == 0
        # Bounded by shutdown_timeout_s (5 s), not by the dead backend; generous for load.
        assert time.monotonic() - started < 30
    log = sc.log_text()
    assert "received SIGTERM" in log
    assert "traces: received=5 exported=0 dropped=5" in log, log
    assert "5 traces items could not be sent" in log, log


def test_sighup_keeps_running(sink: RecordingSink) -> None:
    with SidecarProcess(backend=sink.endpoint) as sc:
        sc.signal(signal.SIGHUP)
        time.sleep(0.3)
        assert sc.proc is not None and sc.proc.poll() is None
        assert sc.admin_get("/readyz")[0] == 200
    assert "received SIGHUP" in sc.log_text()
    assert sc.returncode == 0


@pytest.mark.parametrize("flag", ["--grpc-listen", "--http-listen", "--admin-listen"])
def test_port_in_use_exits_1_with_message(flag: str) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sc = SidecarProcess(extra_args=[flag, f"127.0.0.1:{port}"])
        with pytest.raises(RuntimeError, match="exited early with code 1"):
            sc.start()
    assert f"cannot listen on 127.0.0.1:{port}" in sc.log_text()


def test_sigterm_under_load_loses_nothing_accepted(sink: RecordingSink) -> None:
    """Clients send continuously over gRPC and HTTP to a slow backend; SIGTERM mid-load.

    Every span of every request the sidecar answered OK must reach the sink.
    """
    sink.delay_s = 0.03
    accepted: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def grpc_client(worker: int) -> None:
        i = 0
        while not stop.is_set():
            tag = f"g{worker}x{i}"
            try:
                grpc_export(sc.grpc_endpoint, "traces", trace_request(tag, 20))
            except grpc.RpcError:
                if stop.is_set():
                    return
                time.sleep(0.01)
                continue
            with lock:
                accepted.append(tag)
            i += 1

    def http_client(worker: int) -> None:
        i = 0
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                tag = f"h{worker}x{i}"
                body = trace_request(tag, 20).SerializeToString()
                try:
                    resp = client.post(
                        sc.http_url + "/v1/traces",
                        content=body,
                        headers={"Content-Type": "application/x-protobuf"},
                    )
                except httpx.HTTPError:
                    if stop.is_set():
                        return
                    time.sleep(0.01)
                    continue
                if resp.status_code == 200:
                    with lock:
                        accepted.append(tag)
                i += 1

    sc = SidecarProcess(
        backend=sink.endpoint,
        env={"GYM_SIDECAR_SHUTDOWN_TIMEOUT_S": "20", "GYM_SIDECAR_QUEUE__BATCH_MAX_BYTES": "20000"},
    )
    with sc:
        threads = [threading.Thread(target=grpc_client, args=(w,)) for w in range(2)]
        threads += [threading.Thread(target=http_client, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        # Mid-load: once some requests were accepted (a count, not a time).
        assert wait_for(lambda: len(accepted) > 10, 60), accepted
        sc.signal(signal.SIGTERM)
        assert sc.proc is not None
        sc.proc.wait(30)
        stop.set()
        for t in threads:
            t.join(15)
    assert sc.returncode == 0, sc.log_text()
    assert len(accepted) > 10
    arrived = {s.span.name for s in sink.spans()}
    missing = [tag for tag in accepted if not all(f"{tag}-{i}" in arrived for i in range(20))]
    assert not missing, f"{len(missing)} accepted requests lost, e.g. {missing[:5]}"
    assert "were not sent" not in sc.log_text()


def test_shutdown_safe_twice_and_without_start(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        {
            "GYM_SIDECAR_GRPC_LISTEN": "127.0.0.1:0",
            "GYM_SIDECAR_HTTP_LISTEN": "127.0.0.1:0",
            "GYM_SIDECAR_ADMIN_LISTEN": "127.0.0.1:0",
            # No backend: the local store opens; keep it out of the user's data directory.
            "GYM_SIDECAR_LOCAL_STORE__DATA_DIR": str(tmp_path),
        },
    )

    async def scenario() -> None:
        never_started = SidecarServer(cfg)
        await never_started.shutdown()
        await never_started.shutdown()

        server = SidecarServer(cfg)
        assert not server.readiness.ready
        await server.startup()
        assert server.readiness.ready
        assert server.http is not None and server.http.bound_port
        async with httpx.AsyncClient() as client:
            resp = await client.post(
                f"http://127.0.0.1:{server.http.bound_port}/v1/traces",
                content=trace_request("inproc", 2).SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert resp.status_code == 200
        await asyncio.gather(server.shutdown(), server.shutdown())
        assert not server.readiness.ready
        await server.shutdown()

    asyncio.run(scenario())


def test_http_post_after_stop_is_refused(sink: RecordingSink) -> None:
    with SidecarProcess(backend=sink.endpoint) as sc:
        url = sc.http_url
    with pytest.raises(httpx.HTTPError):
        http_post(url, "traces", trace_request("late", 1).SerializeToString())


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6_listeners(sink: RecordingSink) -> None:
    grpc_port, http_port = free_port(), free_port()
    flags = ["--grpc-listen", f"[::1]:{grpc_port}", "--http-listen", f"[::1]:{http_port}"]
    with SidecarProcess(backend=sink.endpoint, extra_args=flags) as sc:
        grpc_export(f"[::1]:{grpc_port}", "traces", trace_request("v6g", 1))
        resp = http_post(
            f"http://[::1]:{http_port}", "traces", trace_request("v6h", 1).SerializeToString()
        )
        assert resp.status_code == 200
        assert sink.wait_for(lambda: {"v6g-0", "v6h-0"} <= {s.span.name for s in sink.spans()})
    assert sc.returncode == 0


def test_port_zero_listeners_log_the_ports_they_got(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """``127.0.0.1:0`` is no address to connect to: the logs name the bound ports."""
    cfg = load_config(
        None,
        environ={},
        overrides={
            "grpc_listen": "127.0.0.1:0",
            "http_listen": "127.0.0.1:0",
            "admin_listen": "127.0.0.1:0",
            "backend": {"url": f"http://127.0.0.1:{free_port()}"},
            "local_store": {"enabled": False, "data_dir": str(tmp_path)},
            "shutdown_timeout_s": 2,
        },
    )

    async def scenario() -> tuple[int, int, int]:
        server = SidecarServer(cfg)
        await server.startup()
        try:
            assert server.grpc and server.http and server.admin
            return (
                int(server.grpc.bound_port or 0),
                int(server.http.bound_port or 0),
                int(server.admin.bound_port or 0),
            )
        finally:
            await server.shutdown()

    with caplog.at_level("INFO", logger="gym_sidecar"):
        grpc_port, http_port, admin_port = asyncio.run(scenario())
    assert 0 not in (grpc_port, http_port, admin_port)
    text = caplog.text
    assert f"OTLP/gRPC receiver listening on 127.0.0.1:{grpc_port}" in text
    assert f"OTLP/HTTP listening on 127.0.0.1:{http_port}" in text
    assert f"admin listening on 127.0.0.1:{admin_port}" in text
    assert (
        f"ready: grpc=127.0.0.1:{grpc_port} http=127.0.0.1:{http_port} admin=127.0.0.1:{admin_port}"
    ) in text
    assert "127.0.0.1:0" not in text
