"""The compose stack's topology without Docker: the gym-server image's launcher starts the
three real Gym servers from deploy/compose/gym-stack.yaml (re-addressed to loopback),
with the agent on (``GYM_TELEMETRY=1``) sending to a real sidecar, which forwards to a
recording OTLP backend standing where Jaeger stands; the image's rollout driver then
runs rollouts and the backend must hold their spans under their rollout ids.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
import yaml

from testkit.sink import RecordingSink
from tests.deploy.support import REPO
from tests.gym.conftest import gym_python  # noqa: F401  (the session fixture)
from tests.support.ports import free_port, wait_listening
from tests.support.sidecar_proc import SidecarProcess

pytestmark = pytest.mark.gym

DOCKER = REPO / "deploy" / "docker"
SERVERS = ["policy_model", "example_single_tool_call", "example_single_tool_call_simple_agent"]


def loopback_config(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    config: dict[str, Any] = yaml.safe_load(
        (REPO / "deploy" / "compose" / "gym-stack.yaml").read_text()
    )
    config["head_server"] = {"host": "127.0.0.1", "port": free_port()}
    ports = {}
    for name in SERVERS:
        [(_kind, impls)] = config[name].items()
        [(_impl, settings)] = impls.items()
        ports[name] = free_port()
        settings.update(host="127.0.0.1", port=ports[name])
    path = tmp_path / "stack.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, ports


@pytest.fixture
def stack(
    gym_python: Path,  # noqa: F811
    tmp_path: Path,
) -> Iterator[tuple[RecordingSink, dict[str, int], Path]]:
    config, ports = loopback_config(tmp_path)
    with (
        RecordingSink() as sink,
        SidecarProcess(backend=sink.endpoint, config={"span_groups": {"spec": "all"}}) as sidecar,
    ):
        env = {
            **os.environ,
            "GYM_TELEMETRY": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{sidecar.grpc_endpoint}",
            "GYM_SERVER_PATH": str(REPO / "examples" / "gym_stack"),
        }
        procs = []
        try:
            for name in SERVERS:
                log = (tmp_path / f"{name}.log").open("wb")
                procs.append(
                    subprocess.Popen(
                        [str(gym_python), str(DOCKER / "gym_server_launch.py"), str(config), name],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            for name in SERVERS:
                try:
                    wait_listening(ports[name], timeout_s=120)
                except TimeoutError:
                    log_text = (tmp_path / f"{name}.log").read_text()[-3000:]
                    pytest.fail(f"{name} did not start:\n{log_text}")
            yield sink, ports, tmp_path
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)


def test_rollout_driver_through_launched_servers_reaches_the_backend(
    stack: tuple[RecordingSink, dict[str, int], Path],
) -> None:
    sink, ports, _tmp = stack
    agent = ports["example_single_tool_call_simple_agent"]
    driver = subprocess.run(
        [sys.executable, str(DOCKER / "rollout_driver.py")],
        env={
            **os.environ,
            "AGENT_URL": f"http://127.0.0.1:{agent}",
            "ROLLOUTS": "2",
            "TASK_INDEX": "7",
            "WAIT_S": "60",
        },
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert driver.returncode == 0, driver.stdout + driver.stderr
    assert "rollout 7-0: reward=1.0" in driver.stdout
    assert "rollout 7-1: reward=1.0" in driver.stdout

    def rollout_ids() -> set[str]:
        return {
            str(s.attributes[semconv.ROLLOUT_ID])
            for s in sink.spans()
            if semconv.ROLLOUT_ID in s.attributes
        }

    assert sink.wait_for(lambda: {"7-0", "7-1"} <= rollout_ids(), timeout_s=60), rollout_ids()
