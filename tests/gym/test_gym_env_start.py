"""The same check once through Gym's official launcher, ``gym env start``.

The launcher, run from the cached Gym environment as
``gym-telemetry-run gym env start ...`` (which sets ``GYM_TELEMETRY=1``) with the
sidecar address in its environment, starts Ray, its head server, the stub model,
``example_single_tool_call``, ``simple_agent`` and the ``legacy_agent`` environment
server it generates, each as ``<venv python> app.py`` with ``os.environ`` copied. It
works offline with ``skip_venv_if_present: true`` and ``uv_venv_dir`` pointing at a
directory whose ``<type>/<name>/.venv`` entries are symlinks to the cached environment.
The stub model's directory is found through ``NEMO_GYM_EXTRA_ROOTS``. Stopped with
SIGTERM, as an operator would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from gym_telemetry import semconv

from tests.gym.stack import EXAMPLES, load_configs, post_json, run_body, server_location
from tests.gym.traces import SERVER, by_rollout, traces
from tests.support.ports import free_port, wait_listening
from tests.support.sidecar_proc import SidecarProcess
from tests.support.sink import RecordingSink

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

SERVERS = {
    "policy_model": "model",
    "example_single_tool_call": "resources",
    "example_single_tool_call_simple_agent": "agent",
}
VENV_DIRS = [
    "responses_api_models/stub_model",
    "resources_servers/example_single_tool_call",
    "responses_api_agents/simple_agent",
    "environment_servers/legacy_agent",
]
ROLLOUTS = 6


def _reap_group(pgid: int) -> None:
    """Kill what Ray left behind in the launcher's own process group (its agents)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(2)


def test_gym_env_start_one_trace_per_rollout(gym_python: Path, tmp_path: Path) -> None:
    env_root = gym_python.parent.parent
    venvs = tmp_path / "venvs"
    for rel in VENV_DIRS:
        (venvs / rel).mkdir(parents=True)
        (venvs / rel / ".venv").symlink_to(env_root, target_is_directory=True)
    config = load_configs("stack.yaml")
    config["head_server"]["port"] = free_port()
    ports = {}
    for name in SERVERS:
        _first, _second, block = server_location(config, name)
        block["port"] = ports[name] = free_port()
    config["skip_venv_if_present"] = True
    config["uv_venv_dir"] = str(venvs)
    config_path = tmp_path / "stack.yaml"
    config_path.write_text(yaml.safe_dump(config))

    with RecordingSink() as sink:
        sidecar = SidecarProcess(
            backend=sink.endpoint, config={"span_groups": {"spec": "per_rollout"}}, log_dir=tmp_path
        ).start()
        env = {k: v for k, v in os.environ.items() if k != "GYM_TELEMETRY"}
        env.update(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": sidecar.grpc_endpoint,
                "GYM_TELEMETRY_SPAN_GROUPS": "per_rollout",
                "GYM_TELEMETRY_SIDECAR_ADMIN_URL": sidecar.admin_url,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
                "NEMO_GYM_EXTRA_ROOTS": str(EXAMPLES),
                "RAY_USAGE_STATS_ENABLED": "0",
            }
        )
        log_path = tmp_path / "gym-env-start.log"
        with log_path.open("wb") as log:
            launcher = subprocess.Popen(
                [
                    # the opentelemetry-instrument-style launcher sets GYM_TELEMETRY=1
                    str(env_root / "bin" / "gym-telemetry-run"),
                    str(env_root / "bin" / "gym"),
                    "env",
                    "start",
                    f"+config_paths=[{config_path}]",
                ],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            try:
                for port in ports.values():
                    wait_listening(port, timeout_s=240)
            except TimeoutError:
                pytest.fail(
                    f"gym env start did not bring the servers up:\n{log_path.read_text()[-6000:]}"
                )
            agent_url = f"http://127.0.0.1:{ports['example_single_tool_call_simple_agent']}/run"
            bodies = {f"{50 + i}-0": run_body(50 + i, 0) for i in range(ROLLOUTS)}
            with ThreadPoolExecutor(3) as pool:
                results = dict(
                    zip(
                        bodies,
                        pool.map(lambda b: post_json(agent_url, b), bodies.values()),
                        strict=True,
                    )
                )
            assert all(status == 200 and body["reward"] == 1.0 for status, body in results.values())
            assert sink.wait_for(
                lambda: sum(s.span.name == semconv.SPAN_VERIFY for s in sink.spans()) >= ROLLOUTS,
                30,
            )
        finally:
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher_exit = launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher_exit = launcher.wait(timeout=10)
            _reap_group(launcher.pid)
            sidecar.stop()

    # Every server shut down gracefully on the launcher's SIGINT. The launcher process
    # itself ends with SIGABRT (-6) after a SIGTERM here, instrumented or not (measured
    # with GYM_TELEMETRY unset too: Ray's signal handler in the launcher), so its exit
    # status is not this project's to assert.
    log_text = log_path.read_text()
    for name in SERVERS:
        assert f"({name}) INFO:     Finished server process" in log_text, name
    assert launcher_exit in (0, -signal.SIGTERM, -signal.SIGABRT), log_text[-4000:]
    spans = sink.spans()
    grouped = by_rollout(spans)
    # health probes of the launcher are excluded: every trace is a rollout's
    assert set(grouped) == set(bodies)
    all_traces = traces(spans)
    assert len(all_traces) == ROLLOUTS
    expected_services = {f"nemo-gym/{name}" for name in SERVERS}
    for rollout_id, trace_ids in grouped.items():
        [trace_id] = trace_ids
        trace = all_traces[trace_id]
        assert trace.services() == expected_services, rollout_id
        assert trace.orphans() == []
        [root] = trace.roots()
        assert root.span.kind == SERVER and root.span.name == "POST /run"
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert trace.is_descendant(verify, rollout)
        assert len(trace.named("gym.model.responses")) == 2
    for span in spans:
        assert span.resource[semconv.SERVER_TYPE] == SERVERS[span.resource[semconv.SERVER_NAME]]
