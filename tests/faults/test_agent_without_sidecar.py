"""The agent with no sidecar, or a stalled one: a real agent process under a fixed amount
of load (``GYM_FAULTS_AGENT_REQUESTS`` requests, default 4000, from 4 client threads).

Nothing here depends on how fast the machine is: the load is a number of requests, not a
time window, and every assertion holds whatever the ratio between the speed spans are
produced at and the speed export attempts fail at.

- Sidecar down (nothing listens): the handlers answer every request as usual, memory
  stays bounded (the SDK's span queue is bounded: ``OTEL_BSP_MAX_QUEUE_SIZE``, 2048
  here), and every span is either counted as lost (dropped, or failed to export) or
  still held within that bound. When the sidecar then starts, the agent delivers again.
- Sidecar stalled (its port answers no call until released): the exporter is provably
  stuck in one call, so the queue fills and every span beyond it is dropped and counted;
  on release, exactly the spans not dropped are delivered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from testkit.sink import RecordingSink
from testkit.wait import wait_for
from tests.support.ports import free_port, wait_listening
from tests.support.sidecar_proc import SidecarProcess

REQUESTS = int(os.environ.get("GYM_FAULTS_AGENT_REQUESTS", "4000"))
CLIENTS = 4
MAX_QUEUE = 2048
BATCH = 512  # the SDK's default export batch: at most this many spans are in flight
RSS_GROWTH_LIMIT_KIB = 32 * 1024


@contextmanager
def agent_process(endpoint: str, **env: str) -> Iterator[str]:
    """``tests.faults.agent_app`` exporting to ``endpoint``; yields its base URL."""
    port = free_port()
    # A file, not a pipe nobody reads: the agent's export warnings must never block it.
    log = tempfile.TemporaryFile()  # noqa: SIM115  (closed in the finally below)
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.faults.agent_app",
            "--port",
            str(port),
            "--endpoint",
            endpoint,
        ],
        env={
            **os.environ,
            "OTEL_BSP_MAX_QUEUE_SIZE": str(MAX_QUEUE),
            "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        wait_listening(port, 60)
        yield f"http://127.0.0.1:{port}"
    finally:
        agent.terminate()
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        log.close()


def stats(url: str) -> dict[str, int]:
    answer: dict[str, int] = httpx.get(url + "/_stats", timeout=30).json()
    return answer


def drive(url: str, requests: int) -> tuple[list[Any], int]:
    """Send ``requests`` POST /run calls from ``CLIENTS`` threads; return the wrong
    answers and the peak RSS (KiB) sampled between them."""
    failures: list[Any] = []
    peak_rss = [0]
    lock = threading.Lock()
    per_client = requests // CLIENTS

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            for n in range(per_client):
                r = c.post("/run", json={"n": n})
                if r.status_code != 200 or r.json() != {"done": n, "reward": 1.0}:
                    with lock:
                        failures.append((r.status_code, r.text))
                if k == 0 and n % 100 == 0:
                    rss = c.get("/_stats").json()["rss_kib"]
                    with lock:
                        peak_rss[0] = max(peak_rss[0], rss)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures, peak_rss[0]


def test_agent_keeps_serving_with_the_sidecar_down() -> None:
    sink = RecordingSink().start()
    sidecar = SidecarProcess(backend=sink.endpoint)  # its port is reserved, not started
    try:
        with agent_process(sidecar.grpc_endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="2") as url:
            with httpx.Client(base_url=url, timeout=30) as c:
                for i in range(300):  # warm up before the baseline
                    assert c.post("/run", json={"n": i}).status_code == 200
            base = stats(url)
            failures, peak_rss = drive(url, REQUESTS)
            after = stats(url)
            held = after["ended"] - after["dropped"] - after["failed"] - after["exported"]
            print(
                f"\nagent, sidecar down, {REQUESTS} requests: {len(failures)} wrong answers, "
                f"RSS {base['rss_kib'] // 1024} -> peak {peak_rss // 1024} MiB, spans ended "
                f"{after['ended']}, dropped {after['dropped']}, exported {after['exported']}, "
                f"failed {after['failed']}, held {held}"
            )
            assert not failures, failures[:3]
            assert peak_rss - base["rss_kib"] <= RSS_GROWTH_LIMIT_KIB
            assert after["ended"] >= 300 + REQUESTS
            assert after["exported"] == 0
            # Every span not counted as lost is held, within the bounded queue plus the
            # batch with the exporter: how the spans split between "dropped" (queue
            # full) and "failed" (export attempt failed) depends on the machine's
            # speed, so only their sum is asserted.
            assert 0 <= held <= MAX_QUEUE + BATCH
            # The sidecar comes up on the agent's endpoint: the agent delivers again.
            with sidecar:
                with httpx.Client(base_url=url, timeout=30) as c:
                    assert c.post("/run", json={"n": -1}).status_code == 200
                assert sink.wait_for(lambda: sink.span_count > 0, 120), stats(url)
            print(f"{sink.span_count} spans delivered once the sidecar started")
    finally:
        sink.stop()


def test_agent_drops_and_counts_while_the_sidecar_stalls() -> None:
    """The exporter is held in one call (the sink answers nothing until released), so
    every span beyond the queue is dropped, whatever the machine's speed."""
    sink = RecordingSink()
    sink.hold()
    sink.start()
    try:
        # The export deadline outlasts the test: the held call never times out.
        with agent_process(sink.endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="600") as url:
            with httpx.Client(base_url=url, timeout=30) as c:
                assert c.post("/run", json={"n": 0}).status_code == 200
            # The batch processor exports that span after its schedule delay (5 s):
            # from then on its one export worker is stuck in that call. (The agent's live
            # events are held too, on their own calls: the span export is the one that
            # counts here.)
            assert sink.wait_for(lambda: sink.held["traces"] == 1, 120)
            requests = MAX_QUEUE + 1000
            failures, _ = drive(url, requests)
            after = stats(url)
            print(
                f"\nagent, sidecar stalled, {requests} requests: spans ended "
                f"{after['ended']}, dropped {after['dropped']}, exported {after['exported']}"
            )
            assert not failures, failures[:3]
            assert after["ended"] == 1 + requests
            assert (after["exported"], after["failed"]) == (0, 0)
            # One span is in the held call; the queue holds MAX_QUEUE; the rest dropped.
            assert after["dropped"] == after["ended"] - 1 - MAX_QUEUE
            sink.release()
            expected = after["ended"] - after["dropped"]
            assert sink.wait_for(lambda: sink.span_count >= expected, 120), sink.span_count
            assert wait_for(lambda: stats(url)["exported"] == expected, 60), stats(url)
            assert sink.span_count == expected
    finally:
        sink.stop()
