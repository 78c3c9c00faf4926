"""The agent with no sidecar: a real agent process runs while nothing listens on its
OTLP endpoint (default 20 s of load, ``GYM_FAULTS_AGENT_S``).

Its handlers answer every request as usual, its memory stays bounded (the SDK's span
queue is bounded: ``OTEL_BSP_MAX_QUEUE_SIZE``, 2048 here), and the spans it had to drop
are counted. When the sidecar then starts on that endpoint, what the agent still holds
is delivered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from tests.support.ports import free_port, wait_listening
from tests.support.sidecar_proc import SidecarProcess
from tests.support.sink import RecordingSink

LOAD_S = float(os.environ.get("GYM_FAULTS_AGENT_S", "20"))
MAX_QUEUE = 2048
RSS_GROWTH_LIMIT_KIB = 32 * 1024


def test_agent_keeps_serving_with_the_sidecar_down() -> None:
    port = free_port()
    sink = RecordingSink().start()
    sidecar = SidecarProcess(backend=sink.endpoint)  # its port is reserved, not started
    env = {
        **os.environ,
        "OTEL_BSP_MAX_QUEUE_SIZE": str(MAX_QUEUE),
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
        "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
    }
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.faults.agent_app",
            "--port",
            str(port),
            "--endpoint",
            sidecar.grpc_endpoint,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_listening(port, 30)
        with httpx.Client(base_url=url, timeout=5) as c:
            for i in range(300):  # warm up before the baseline
                assert c.post("/run", json={"n": i}).status_code == 200
            base = c.get("/_stats").json()
        latencies: list[float] = []
        failures: list[Any] = []
        lock = threading.Lock()
        stop = time.monotonic() + LOAD_S

        def client(k: int) -> None:
            with httpx.Client(base_url=url, timeout=5) as c:
                n = 0
                while time.monotonic() < stop:
                    t0 = time.perf_counter()
                    r = c.post("/run", json={"n": n})
                    dt = time.perf_counter() - t0
                    with lock:
                        latencies.append(dt)
                        if r.status_code != 200 or r.json() != {"done": n, "reward": 1.0}:
                            failures.append((r.status_code, r.text))
                    n += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        peak_rss = 0
        while any(t.is_alive() for t in threads):
            stats = httpx.get(url + "/_stats", timeout=5).json()
            peak_rss = max(peak_rss, stats["rss_kib"])
            time.sleep(0.5)
        for t in threads:
            t.join()
        after = httpx.get(url + "/_stats", timeout=5).json()
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[int(len(latencies) * 0.99)] * 1000
        # The sidecar comes up on the agent's endpoint: what the agent holds arrives.
        with sidecar:
            sink.wait_for(lambda: sink.span_count > 0, 30)
            delivered = sink.span_count
        print(
            f"\nagent, sidecar down {LOAD_S:.0f}s: {len(latencies)} requests all answered "
            f"(p50 {p50:.1f} ms, p99 {p99:.1f} ms), RSS {base['rss_kib'] // 1024} -> peak "
            f"{peak_rss // 1024} MiB, spans ended {after['ended']}, dropped "
            f"{after['dropped']}, exported {after['exported']}, failed {after['failed']}; "
            f"{delivered} delivered once the sidecar started"
        )
        assert not failures, failures[:3]
        assert peak_rss - base["rss_kib"] <= RSS_GROWTH_LIMIT_KIB
        assert after["exported"] == 0
        # Every span beyond what the bounded queue (plus one batch being exported) can
        # hold was dropped and counted.
        assert after["dropped"] >= after["ended"] - MAX_QUEUE - 512 - after["failed"]
        assert after["dropped"] > 0
        assert delivered > 0
    finally:
        agent.terminate()
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        sink.stop()
