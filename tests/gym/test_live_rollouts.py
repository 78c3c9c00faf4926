"""Rollouts live on real Gym servers with the real agent: its live events reach a real
``gym-sidecar run``, which shows rollouts in flight, a hung one stalled (the stub model
hangs on request, as ``make demo --hang`` does it, with the demo's own functions), and
lost when its agent server is killed (``kill -9``: silence) or restarted (a new instance
of the same server); the live gauges go back to 0 and the event-loop lag of every server
arrives from the heartbeats.

Thresholds are small; every wait is for a condition, with a generous timeout. The only
timing asserted is one no speed can break: a rollout is never stalled before
``stall_after_s``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from gym_sidecar.live.client import fetch_live
from gym_sidecar.live.view import LiveView
from gym_telemetry_demo import hang
from gym_telemetry_demo.ports import wait_listening
from gym_telemetry_demo.sidecar import SidecarProcess

from testkit.gym_stack import (
    AGENT,
    MODEL,
    RESOURCES,
    GymStack,
    load_configs,
    post_json,
    run_body,
    telemetry_env,
)
from testkit.wait import wait_for

pytestmark = [pytest.mark.gym, pytest.mark.timeout(900)]

NAMES = [MODEL, RESOURCES, AGENT]
STALL_S = 3.0
WAIT_S = 120.0


@contextmanager
def live_stack(
    tmp_path: Path, gym_python: Path, lost_after_s: float, **agent_env: str
) -> Iterator[tuple[SidecarProcess, GymStack, str]]:
    """A sidecar and the Gym servers sending to it, and the stub model's hang marker
    (``WAIT_FILE``: released before the servers stop, so the model server stops at once)."""
    release = tmp_path / "release-the-hang"
    config = {
        "rollouts": {
            "stall_after_s": STALL_S,
            "lost_after_s": lost_after_s,
            "check_interval_s": 0.25,
        },
        "metrics": {"interval_s": 1.0},
    }
    with SidecarProcess(config=config, log_dir=tmp_path) as sc:
        env = telemetry_env(sc.grpc_endpoint, sc.admin_url)
        env["GYM_TELEMETRY_LIVE_INTERVAL_S"] = "0.5"
        env.update(agent_env)
        stack = GymStack(gym_python, load_configs("stack.yaml"), NAMES, env, tmp_path / "gym")
        with stack:
            try:
                yield sc, stack, f"WAIT_FILE:{release}"
            finally:
                release.touch()  # before the servers stop


def live(sc: SidecarProcess) -> LiveView:
    return fetch_live(sc.admin_url, 100)


def gauges(sc: SidecarProcess) -> tuple[float, float, float]:
    labels = {"nemo_gym_server_name": AGENT}
    return (
        sc.metric("gym_rollout_in_flight", **labels),
        sc.metric("gym_rollout_stalled", **labels),
        sc.metric("gym_rollout_lost_total", **labels),
    )


def respawn(stack: GymStack, name: str) -> None:
    """Start server ``name`` again as :meth:`GymStack.start` started it (a new process:
    a new ``service.instance.id``) and wait until it listens."""
    process = stack.processes[name]
    env = dict(os.environ)
    env.update(stack.env)
    env["NEMO_GYM_CONFIG_DICT"] = stack.resolved_yaml
    env["NEMO_GYM_CONFIG_PATH"] = name
    env["PYTHONPATH"] = ":".join(p for p in (str(process.directory), env.get("PYTHONPATH")) if p)
    with (process.log_path.parent / f"{name}-2.log").open("wb") as log:
        process.proc = subprocess.Popen(
            [str(stack.python), "app.py"],
            cwd=process.directory,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_listening(process.port, timeout_s=WAIT_S)


def kill_9(stack: GymStack, name: str) -> None:
    proc = stack.processes[name].proc
    assert proc is not None
    proc.kill()
    proc.wait()


def test_a_hung_rollout_stalls_and_is_lost_when_its_server_is_killed(
    gym_python: Path, tmp_path: Path
) -> None:
    # lost_after_s: 30 heartbeats of the agent (0.5 s), so a loaded machine's late one
    # cannot end the rollout before it is seen stalled
    with live_stack(tmp_path, gym_python, lost_after_s=15.0) as (sc, stack, marker):
        agent_url = stack.url(AGENT)
        # every server process sends heartbeats: each is a known instance
        assert wait_for(lambda: {i.server for i in live(sc).instances} >= set(NAMES), WAIT_S)
        # a rollout slower than the live interval is announced, then ended by its span
        body = run_body(1, 0)
        body["responses_create_params"]["input"][-1]["content"] += " SLEEP:2"
        status, answer = post_json(agent_url + "/run", body)
        assert status == 200, answer
        assert wait_for(
            lambda: sc.metric("gym_sidecar_live_rollouts_total", outcome="ended") >= 1, WAIT_S
        )
        assert live(sc).in_flight_total == 0
        # the hung rollout: in flight, then stalled at its model call
        started = time.monotonic()
        hang.start_hung_rollout(agent_url, 2, marker)
        stalled = hang.wait_view(sc.admin_url, hang.stalled_on(AGENT), WAIT_S)
        assert stalled is not None, live(sc)
        assert time.monotonic() - started >= STALL_S  # never before stall_after_s
        assert (stalled.step, stalled.step_target, stalled.turns) == (
            "POST /v1/responses",
            MODEL,
            1,
        )
        assert stalled.rollout_id == "2-0"
        assert wait_for(lambda: gauges(sc) == (1, 1, 0), WAIT_S), gauges(sc)
        # kill -9: no stop event, no last spans; the silence makes it lost
        kill_9(stack, AGENT)
        lost = hang.wait_view(sc.admin_url, hang.lost_rollout(stalled.trace_id), WAIT_S)
        assert lost is not None and lost.lost_reason == "silent", live(sc)
        assert wait_for(lambda: gauges(sc) == (0, 0, 1), WAIT_S), gauges(sc)
        # the heartbeats' event-loop lag, merged per server
        for name in NAMES:
            count = sc.metric("gym_server_event_loop_lag_ms_count", nemo_gym_server_name=name)
            assert count > 0, name


def test_a_restarted_agent_server_loses_its_rollouts(gym_python: Path, tmp_path: Path) -> None:
    # lost_after_s is long: only the new instance of the same server can explain the loss
    with live_stack(tmp_path, gym_python, lost_after_s=600.0) as (sc, stack, marker):
        hang.start_hung_rollout(stack.url(AGENT), 3, marker)
        found = hang.wait_view(sc.admin_url, lambda v: next(iter(v.in_flight), None), WAIT_S)
        assert found is not None
        kill_9(stack, AGENT)
        respawn(stack, AGENT)
        lost = hang.wait_view(sc.admin_url, hang.lost_rollout(found.trace_id), WAIT_S)
        assert lost is not None and lost.lost_reason == "restarted", live(sc)
        assert wait_for(lambda: gauges(sc) == (0, 0, 1), WAIT_S), gauges(sc)
        # the new instance serves: its rollout runs and ends
        status, answer = post_json(stack.url(AGENT) + "/run", run_body(4, 0))
        assert status == 200, answer
        [agent] = [i for i in live(sc).instances if i.server == AGENT]
        assert agent.state == "alive"


def test_a_cleanly_stopped_server_sends_stop_and_loses_nothing_whose_span_came(
    gym_python: Path, tmp_path: Path
) -> None:
    # SIGTERM while a rollout runs: Gym's uvicorn cancels it when its short graceful
    # shutdown runs out (the /run answers 500) and the agent ends its span; spans leave
    # only at the shutdown flush here (a 60 s batch delay), which the agent runs after it
    # sent gym.agent.stop: the span arrives after the stop (milliseconds later here; the
    # rollouts.stop_grace_s of 5 s is for slower flushes) and ends the rollout, so
    # nothing is counted lost
    with live_stack(tmp_path, gym_python, lost_after_s=600.0, OTEL_BSP_SCHEDULE_DELAY="60000") as (
        sc,
        stack,
        _marker,
    ):
        body = run_body(5, 0)
        body["responses_create_params"]["input"][-1]["content"] += " SLEEP:30"
        answers: list[int] = []
        thread = threading.Thread(
            target=lambda: answers.append(post_json(stack.url(AGENT) + "/run", body)[0])
        )
        thread.start()
        assert hang.wait_view(sc.admin_url, lambda v: next(iter(v.in_flight), None), WAIT_S)
        proc = stack.processes[AGENT].proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        thread.join(WAIT_S)
        assert len(answers) == 1  # the /run was answered (not left hanging)
        assert wait_for(
            lambda: sc.metric("gym_sidecar_live_events_total", event="gym.agent.stop") >= 1,
            WAIT_S,
        )
        # the stopped instance is gone once stop_grace_s passed; its rollout ended
        assert wait_for(lambda: AGENT not in {i.server for i in live(sc).instances}, WAIT_S)
        view = live(sc)
        assert view.lost == [] and view.in_flight_total == 0, view
        assert sc.metric("gym_sidecar_live_rollouts_total", outcome="ended") == 1
        assert gauges(sc) == (0, 0, 0)
