"""One real ``mini_swe_agent_2`` rollout, offline, through Gym's launcher: the harness runs
in a Ray task, and its spans join the rollout's trace.

``mini_swe_agent_2`` (``mini-swe-agent`` 2.1.0 and ``swebench`` 4.1.0 in the cached Gym
environment) runs the whole harness inside a Ray task. The stack:

- ``policy_model``: the stub model; on a chat call that offers tools it calls the first
  one (``bash``) with ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, which makes
  mini-swe-agent submit at once;
- ``swe_agent``: ``mini_swe_agent_2`` with the ``local`` sandbox provider (commands run
  in a temporary directory, as no user, without conda);
- the row's repository is unknown to swebench, so the evaluation stops before it would
  build or run anything (the task fails there, and the rollout's reward is 0).

The launcher starts Ray with gym_telemetry's tracing startup hook (``ray_tasks``), so the
Ray worker sets up the SDK, the task's context and rollout id come from the agent's
``gym.rollout``, and litellm's httpx calls carry ``traceparent`` and the rollout
baggage (OpenTelemetry's httpx instrumentation). litellm is kept off the network
(``LITELLM_LOCAL_MODEL_COST_MAP``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.gym_stack import gym_env_start, launcher_config, launcher_env, post_json
from testkit.sink import RecordingSink
from tests.gym.traces import SERVER, traces, write_shapes
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

SERVERS = {"policy_model": "model", "swe_agent": "agent", "swe_env": "environment"}
ROLLOUT_ID = "7-0"
CONSUMER = Span.SpanKind.SPAN_KIND_CONSUMER
PRODUCER = Span.SpanKind.SPAN_KIND_PRODUCER
CLIENT = Span.SpanKind.SPAN_KIND_CLIENT


def _config(tmp: Path) -> dict[str, Any]:
    workdir = tmp / "workdir"
    workdir.mkdir()
    return {
        "head_server": {"host": "127.0.0.1", "port": 0},
        "policy_model_name": "stub",
        "policy_model": {
            "responses_api_models": {"stub_model": {"entrypoint": "app.py", "host": "127.0.0.1"}}
        },
        "swe_agent": {
            "responses_api_agents": {
                "mini_swe_agent_2": {
                    "entrypoint": "app.py",
                    "domain": "coding",
                    "host": "127.0.0.1",
                    "model_server": {"type": "responses_api_models", "name": "policy_model"},
                    "concurrency": 2,
                    "env": "sandbox",
                    "sandbox_provider": {
                        "local": {
                            "workspace_root": str(tmp / "sandboxes"),
                            "shell": "/bin/bash",
                            "default_timeout_s": 60,
                            "concurrency": 2,
                        }
                    },
                    "sandbox_spec": {},
                    "sandbox_environment_kwargs": {
                        "cwd": str(workdir),
                        "activate_conda": False,
                        "user": None,
                    },
                    "step_timeout": 60,
                    "eval_timeout": 60,
                    "step_limit": 3,
                }
            }
        },
        # declared (else the launcher generates it) so that it gets the cached env too
        "swe_env": {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "agent_server": {"type": "responses_api_agents", "name": "swe_agent"},
                }
            }
        },
    }


def _row() -> dict[str, Any]:
    return {
        "responses_create_params": {"input": "Fix the bug."},
        "instance_id": "nobody__nothing-1",
        "repo": "nobody/nothing",
        "base_commit": "0" * 40,
        "version": "0.0",
        "problem_statement": "Nothing to fix; submit at once.",
        "subset": "verified",
        "split": "test",
        "patch": "",
        "test_patch": "",
        "FAIL_TO_PASS": "[]",
        "PASS_TO_PASS": "[]",
        "_ng_task_index": 7,
        "_ng_rollout_index": 0,
    }


def test_mini_swe_agent_2_rollout_is_one_trace(gym_python: Path, tmp_path: Path) -> None:
    env_root = gym_python.parent.parent
    config_path, ports = launcher_config(_config(tmp_path), SERVERS, tmp_path, env_root)
    with RecordingSink() as sink:
        sidecar = SidecarProcess(
            backend=sink.endpoint, config={"span_groups": {"spec": "all"}}, log_dir=tmp_path
        ).start()
        env = launcher_env(sidecar.grpc_endpoint, sidecar.admin_url)
        if os.environ.get("GYM_TELEMETRY_TEST_AGENT_SRC"):  # a before/after comparison
            env["PYTHONPATH"] = os.environ["GYM_TELEMETRY_TEST_AGENT_SRC"]
        env.update(
            {
                "GYM_TELEMETRY_SPAN_GROUPS": "all",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MSWEA_CONFIGURED": "true",
            }
        )
        try:
            with gym_env_start(
                env_root, config_path, ports, env, tmp_path, up_timeout_s=600, stop_timeout_s=120
            ) as launched:
                status, answer = post_json(launched.url("swe_agent", "/run"), _row(), 600)
                assert status == 200, answer
                # the harness ran and submitted; the unknown repository stopped the
                # evaluation inside the task (swebench has no spec for it): reward 0
                assert answer["reward"] == 0.0, answer
                assert "nobody/nothing" in str(answer["metadata"].get("error")), answer

                def arrived() -> bool:
                    names = {s.span.name for s in sink.spans()}
                    return {"gym.sandbox.start", "gym.sandbox.exec", "gym.sandbox.stop"} <= names

                all_arrived = sink.wait_for(arrived, 120)
        finally:
            sidecar.stop()
    spans = sink.spans()
    all_traces = traces(spans)
    write_shapes(
        "GYM_TELEMETRY_TEST_SHAPES",
        {
            f"trace {i} ({', '.join(sorted(t.services()))})": t.spans
            for i, t in enumerate(all_traces.values())
        },
    )
    assert all_arrived, sorted({s.span.name for s in spans})
    rollout_traces = {
        s.span.trace_id for s in spans if s.attributes.get(semconv.ROLLOUT_ID) == ROLLOUT_ID
    }
    assert len(rollout_traces) == 1, launched.log()[-6000:]
    [trace] = [t for tid, t in all_traces.items() if tid in rollout_traces]
    names = sorted(s.span.name for s in trace.spans)
    assert trace.orphans() == [], names
    [root] = trace.roots()
    assert root.span.kind == SERVER and root.span.name == "POST /run"
    assert trace.services() == {
        "nemo-gym/swe_agent",
        "nemo-gym/ray-worker",
        "nemo-gym/policy_model",
    }, names
    assert trace.rollout_ids() == {ROLLOUT_ID}, [
        (s.span.name, s.attributes.get(semconv.ROLLOUT_ID)) for s in trace.spans
    ]
    rollout = trace.named(semconv.SPAN_ROLLOUT)[0]
    [produced] = [s for s in trace.spans if s.span.kind == PRODUCER]
    [consumed] = [s for s in trace.spans if s.span.kind == CONSUMER]
    assert trace.is_descendant(produced, rollout) and trace.parent(consumed) is produced
    assert consumed.resource[semconv.SERVICE_NAME] == "nemo-gym/ray-worker"
    for name in ("gym.sandbox.start", "gym.sandbox.exec", "gym.sandbox.stop"):
        [span] = trace.named(name)
        assert trace.is_descendant(span, consumed), name
        assert span.attributes["nemo.gym.sandbox.provider"] == "local"
    # litellm's call: a CLIENT span in the worker (httpx instrumentation), the model
    # server's SERVER span under it, and the model call's span
    model_calls = trace.named("gym.model.chat_completions")
    assert model_calls, names
    for call in model_calls:
        server = trace.parent(call)
        assert server is not None and server.span.kind == SERVER
        client = trace.parent(server)
        assert client is not None and client.span.kind == CLIENT
        assert client.resource[semconv.SERVICE_NAME] == "nemo-gym/ray-worker"
        assert trace.is_descendant(client, consumed)
