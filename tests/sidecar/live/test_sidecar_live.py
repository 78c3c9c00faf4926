"""Rollouts live through a real ``gym-sidecar run``: live events sent as OTLP log requests
(built with opentelemetry-proto, over OTLP/HTTP and OTLP/gRPC) and rollout spans as trace
requests; read back through ``GET /v1/rollouts/live``, ``/metrics`` and the OTLP metrics it
exports to a recording backend.

Thresholds are small and every wait is for a condition with a generous timeout: nothing
here asserts how fast the sidecar is. What is asserted about time is only what cannot
depend on speed: a rollout is never stalled before ``stall_after_s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry_demo.sidecar import SidecarProcess
from gym_telemetry_semconv import live

from testkit.live_events import heartbeat, ids, logs_request, resource, start, step, stop
from testkit.otlp_samples import grpc_export, http_post
from testkit.sink import RecordingSink
from testkit.wait import wait_for
from tests.sidecar.metrics.traces import ROLLOUT_SCOPE, SpanSpec, request

pytestmark = pytest.mark.timeout(300)

WAIT_S = 60.0
STALL_S = 1.5


def now() -> int:
    return time.time_ns()


def send_http(sc: SidecarProcess, events: list[Any], **res: str) -> None:
    body = logs_request(resource(**res), events).SerializeToString()
    assert http_post(sc.http_url, "logs", body).status_code == 200


def send_grpc(sc: SidecarProcess, events: list[Any], **res: str) -> None:
    grpc_export(sc.grpc_endpoint, "logs", logs_request(resource(**res), events))


def end(sc: SidecarProcess, n: int, server: str = "agent_a", instance: str = "i-1") -> None:
    trace_id, span_id = ids(n)
    span = SpanSpec(semconv.SPAN_ROLLOUT, 50.0, {semconv.ROLLOUT_ID: f"r{n}"}, start_ns=now())
    span.trace_id, span.span_id = trace_id, span_id
    attrs = {
        "service.name": f"nemo-gym/{server}",
        semconv.SERVER_NAME: server,
        "service.instance.id": instance,
    }
    body = request({ROLLOUT_SCOPE: [span]}, attrs).SerializeToString()
    assert http_post(sc.http_url, "traces", body).status_code == 200


def view(sc: SidecarProcess) -> dict[str, Any]:
    status, text = sc.admin_get("/v1/rollouts/live")
    assert status == 200, text
    doc: dict[str, Any] = json.loads(text)
    return doc


def states(sc: SidecarProcess) -> dict[str, str]:
    doc = view(sc)
    out = {r["rollout_id"]: "stalled" if r["stalled"] else "running" for r in doc["in_flight"]}
    out.update({r["rollout_id"]: f"lost:{r['lost_reason']}" for r in doc["lost"]})
    return out


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


def sidecar(sink: RecordingSink, **rollouts: Any) -> SidecarProcess:
    cfg = {"stall_after_s": STALL_S, "check_interval_s": 0.2, **rollouts}
    return SidecarProcess(
        backend=sink.endpoint,
        config={"rollouts": cfg, "metrics": {"interval_s": 0.5}},
    )


def test_in_flight_stalled_ended_and_stopped(sink: RecordingSink) -> None:
    with sidecar(sink, lost_after_s=120.0, stop_grace_s=0.5) as sc:
        t0 = now()
        send_http(sc, [start(1, t0, rollout_id="r1"), start(2, t0, rollout_id="r2"), heartbeat(2)])
        send_grpc(sc, [step(2, t0, "POST /v1/responses", "policy_model", 1)])
        # applied before the requests were answered (running or, on a slow run, stalled)
        assert set(states(sc)) == {"r1", "r2"}
        assert wait_for(lambda: states(sc) == {"r1": "stalled", "r2": "stalled"}, WAIT_S)
        assert (now() - t0) / 1e9 >= STALL_S  # never before stall_after_s
        r2 = next(r for r in view(sc)["in_flight"] if r["rollout_id"] == "r2")
        assert (r2["step"], r2["step_target"], r2["turns"]) == (
            "POST /v1/responses",
            "policy_model",
            1,
        )
        assert wait_for(
            lambda: sc.metric("gym_rollout_stalled", nemo_gym_server_name="agent_a") == 2, WAIT_S
        )
        assert sc.metric("gym_rollout_in_flight", nemo_gym_server_name="agent_a") == 2
        # a new step: its start is r1's last activity (active again until stall_after_s)
        t_step = now()
        send_http(sc, [step(1, t_step, "POST /verify", "weather", 2)])
        r1 = next(r for r in view(sc)["in_flight"] if r["rollout_id"] == "r1")
        assert r1["last_activity_unix_nano"] >= t_step and r1["step"] == "POST /verify"
        # r1's span arrives: it ended
        end(sc, 1)
        assert wait_for(lambda: "r1" not in states(sc), WAIT_S)
        # the instance stops: r2 is lost once the grace is over
        send_grpc(sc, [stop()])
        assert wait_for(lambda: states(sc) == {"r2": "lost:stopped"}, WAIT_S)
        assert wait_for(
            lambda: (
                (
                    sc.metric("gym_rollout_in_flight", nemo_gym_server_name="agent_a"),
                    sc.metric("gym_rollout_stalled", nemo_gym_server_name="agent_a"),
                    sc.metric("gym_rollout_lost_total", nemo_gym_server_name="agent_a"),
                )
                == (0, 0, 1)
            ),
            WAIT_S,
        )
        assert sc.metric("gym_sidecar_live_rollouts_total", outcome="ended") == 1
        # the same figures reach the backend as OTLP metrics, every interval
        assert wait_for(lambda: _exported(sink) == (0, 0, 1), WAIT_S)
    assert sink.log_requests() == []  # the live events are not forwarded by default


def _exported(sink: RecordingSink) -> tuple[int, int, int] | None:
    """The latest exported (in flight, stalled, lost) of agent_a."""
    latest: dict[str, int] = {}
    for req in sink.metric_requests():
        for rm in req.resource_metrics:
            names = {
                kv.value.string_value
                for kv in rm.resource.attributes
                if kv.key == semconv.SERVER_NAME
            }
            if names != {"agent_a"}:
                continue
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name in (semconv.METRIC_ROLLOUT_IN_FLIGHT, semconv.METRIC_ROLLOUT_STALLED):
                        latest[m.name] = m.gauge.data_points[-1].as_int
                    elif m.name == semconv.METRIC_ROLLOUT_LOST:
                        latest[m.name] = m.sum.data_points[-1].as_int
    if len(latest) < 3:
        return None
    return (
        latest[semconv.METRIC_ROLLOUT_IN_FLIGHT],
        latest[semconv.METRIC_ROLLOUT_STALLED],
        latest[semconv.METRIC_ROLLOUT_LOST],
    )


def test_silence_loses_rollouts(sink: RecordingSink) -> None:
    with sidecar(sink, lost_after_s=2.0) as sc:
        send_http(sc, [start(1, now(), rollout_id="silent-1"), heartbeat(1)], server="agent_s")
        assert wait_for(lambda: states(sc).get("silent-1") == "lost:silent", WAIT_S)
        assert sc.metric("gym_rollout_lost_total", nemo_gym_server_name="agent_s") == 1


def test_a_restart_loses_rollouts(sink: RecordingSink) -> None:
    # lost_after_s long: only the new instance of the server can explain the loss
    with sidecar(sink, lost_after_s=600.0) as sc:
        t0 = now()
        send_http(
            sc, [start(2, t0, rollout_id="old-2"), heartbeat(1, interval_s=0.5)], server="agent_r"
        )
        send_http(
            sc, [start(3, t0, rollout_id="new-3"), heartbeat(1)], server="agent_r", instance="i-2"
        )
        assert wait_for(lambda: states(sc).get("old-2") == "lost:restarted", WAIT_S)
        assert "new-3" in states(sc) and states(sc)["new-3"] != "lost:restarted"
        assert sc.metric("gym_rollout_lost_total", nemo_gym_server_name="agent_r") == 1


def test_forward_events_sends_them_on(sink: RecordingSink) -> None:
    with sidecar(sink, forward_events=True) as sc:
        send_http(sc, [start(1, now(), rollout_id="f1"), heartbeat(1)])
        assert wait_for(lambda: "f1" in states(sc), WAIT_S)
        assert sink.wait_for(lambda: len(sink.log_requests()) == 1)
        [req] = sink.log_requests()
        [rl] = req.resource_logs
        assert [r.event_name for r in rl.scope_logs[0].log_records] == [
            live.EVENT_ROLLOUT_START,
            live.EVENT_HEARTBEAT,
        ]


def test_gym_sidecar_live_prints_the_view(sink: RecordingSink) -> None:
    with sidecar(sink, lost_after_s=120.0) as sc:
        send_http(
            sc,
            [
                start(1, now(), rollout_id="term-1"),
                step(1, now(), "POST /v1/responses", "policy_model", 3),
            ],
        )
        assert wait_for(lambda: "term-1" in states(sc), WAIT_S)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
        out = subprocess.run(
            [sys.executable, "-m", "gym_sidecar.cli", "live", "--admin-url", sc.admin_url],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "COLUMNS": "200"},
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert "term-1" in out.stdout and "policy_model" in out.stdout, out.stdout
        assert "1 rollouts in flight" in out.stdout
    gone = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "live", "--admin-url", sc.admin_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gone.returncode == 1 and "not reachable" in gone.stdout
