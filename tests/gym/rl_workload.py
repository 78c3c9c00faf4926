"""The workload of ``test_rl_view``: real Gym servers driven through every RL figure.

Five unmodified Gym server processes (the stub model, the shipped
``example_single_tool_call`` and ``simple_agent``, the example ``failing_weather`` server
and a second ``simple_agent`` whose resources server is reached through a
:class:`~tests.support.flaky_proxy.FlakyProxy`), auto-instrumented with
``GYM_TELEMETRY=1``, span groups ``per_rollout``, live events every 0.2 s and the lag probe
every 0.05 s, exporting to a recording OTLP/gRPC sink in this process. :func:`drive` runs,
in order: normal rollouts, a rollout whose first resources hop is dropped twice, direct
model calls in each dialect (plain and streamed) and a failing one, a hop that times out,
and a rollout whose first model call hangs until the test releases it (the live events
are collected while it hangs). Then the servers stop (SIGTERM: each sends its stop event).
"""

from __future__ import annotations

import copy
import http.client
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from testkit.gym_stack import (
    AGENT,
    FAILING_RESOURCES,
    MODEL,
    RESOURCES,
    GymStack,
    load_configs,
    post_json,
    run_body,
    telemetry_env,
)
from testkit.sink import RecordedSpan, RecordingSink, attrs
from tests.support.flaky_proxy import FlakyProxy

FLAKY_RESOURCES = "flaky_weather"
FLAKY_AGENT = "flaky_weather_simple_agent"
START = (MODEL, RESOURCES, AGENT, FAILING_RESOURCES, FLAKY_AGENT)
REQUEST_MODEL = "policy-7b"
SERVED_MODEL = "stub-served-v1"
USAGE_TOOL_CALL = (13, 5)  # the stub's usage for a tool call (its config below)
USAGE_TEXT = (21, 8)  # ... and for a text answer
ROLLOUTS = 3
DROPPED = 2  # connections the flaky proxy drops before it forwards
HUNG_ROLLOUT = "77-0"
FAIL_MARKER = "POLICY_FAIL"
#: Scenario -> the trace id its direct calls carry (``traceparent``).
TRACES = {
    "responses_stream": 0x101,
    "chat": 0x102,
    "chat_stream": 0x103,
    "messages": 0x104,
    "messages_stream": 0x105,
    "chat_failing": 0x106,
    "deadline": 0x107,
}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def config() -> dict[str, Any]:
    merged = load_configs("stack.yaml", "failing_verifier.yaml")
    stub = merged[MODEL]["responses_api_models"]["stub_model"]
    stub.update(
        served_model=SERVED_MODEL,
        usage_tool_call=list(USAGE_TOOL_CALL),
        usage_text=list(USAGE_TEXT),
        fail_markers=[FAIL_MARKER],
    )
    merged[FLAKY_RESOURCES] = copy.deepcopy(merged[RESOURCES])  # an address only: the proxy
    merged[FLAKY_AGENT] = copy.deepcopy(merged[AGENT])
    agent = merged[FLAKY_AGENT]["responses_api_agents"]["simple_agent"]
    agent["resources_server"]["name"] = FLAKY_RESOURCES
    del merged["failing_weather_simple_agent"]
    return merged


def rollout_body(task: int, rollout: int, text: str = "what's it like in sf?") -> dict[str, Any]:
    body = run_body(task, rollout)
    params = body["responses_create_params"]
    params["model"] = REQUEST_MODEL
    params["input"][-1]["content"] = text
    return body


def traceparent(n: int) -> dict[str, str]:
    return {"Content-Type": "application/json", "traceparent": f"00-{n:032x}-{n:016x}-01"}


def stream(port: int, path: str, body: Any, headers: dict[str, str]) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


@dataclass
class Run:
    answers: dict[str, Any] = field(default_factory=dict)
    spans: list[RecordedSpan] = field(default_factory=list)
    logs: list[tuple[dict[str, Any], LogRecord]] = field(default_factory=list)
    """Every live event with its resource, in arrival order."""
    during_hang: list[tuple[dict[str, Any], LogRecord]] = field(default_factory=list)
    """The live events that had arrived when the hung model call was released."""
    proxy_dropped: int = 0

    def events(
        self, name: str, service: str | None = None
    ) -> list[tuple[dict[str, Any], LogRecord]]:
        return [
            (resource, record)
            for resource, record in self.logs
            if record.event_name == name
            and (service is None or resource.get("service.name") == service)
        ]


def live_events(sink: RecordingSink) -> list[tuple[dict[str, Any], LogRecord]]:
    out = []
    for request in sink.log_requests():
        for resource_logs in request.resource_logs:
            resource = attrs(resource_logs.resource.attributes)
            for scope_logs in resource_logs.scope_logs:
                out.extend((resource, r) for r in scope_logs.log_records)
    return out


def _hung_step(sink: RecordingSink) -> bool:
    for _resource, record in live_events(sink):
        found = attrs(record.attributes)
        if (
            record.event_name == "gym.rollout.step"
            and found.get("nemo.gym.rollout.id") == HUNG_ROLLOUT
            and found.get("nemo.gym.rollout.step.target") == MODEL
        ):
            return True
    return False


def drive(stack: GymStack, sink: RecordingSink, release: Path, run: Run) -> None:
    """Run the workload (module doc) against started servers; fill ``run.answers``."""
    agent = stack.url(AGENT)
    for i in range(ROLLOUTS):
        run.answers[f"rollout-{i}"] = post_json(agent + "/run", rollout_body(i, 0))
    flaky_port = int(
        stack.config[FLAKY_RESOURCES]["resources_servers"]["example_single_tool_call"]["port"]
    )
    resources_port = stack.processes[RESOURCES].port
    with FlakyProxy(resources_port, drop_first=DROPPED, port=flaky_port) as proxy:
        run.answers["flaky"] = post_json(stack.url(FLAKY_AGENT) + "/run", rollout_body(50, 0))
        run.proxy_dropped = proxy.dropped
    model_port = stack.processes[MODEL].port
    calls: dict[str, Callable[[], Any]] = {
        "responses_stream": lambda: stream(
            model_port,
            "/v1/responses",
            {"model": REQUEST_MODEL, "input": "hello", "stream": True},
            traceparent(TRACES["responses_stream"]),
        ),
        "chat": lambda: post_json(
            f"http://127.0.0.1:{model_port}/v1/chat/completions",
            {
                "model": REQUEST_MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "parameters": {"type": "object", "properties": {}},
                        },
                    }
                ],
            },
            headers=traceparent(TRACES["chat"]),
        ),
        "chat_stream": lambda: stream(
            model_port,
            "/v1/chat/completions",
            {
                "model": REQUEST_MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            traceparent(TRACES["chat_stream"]),
        ),
        "messages": lambda: post_json(
            f"http://127.0.0.1:{model_port}/v1/messages",
            {
                "model": REQUEST_MODEL,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": [{"name": "get_weather", "input_schema": TOOL["parameters"]}],
            },
            headers=traceparent(TRACES["messages"]),
        ),
        "messages_stream": lambda: stream(
            model_port,
            "/v1/messages",
            {
                "model": REQUEST_MODEL,
                "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            },
            traceparent(TRACES["messages_stream"]),
        ),
        "chat_failing": lambda: post_json(
            f"http://127.0.0.1:{model_port}/v1/chat/completions",
            {"model": REQUEST_MODEL, "messages": [{"role": "user", "content": FAIL_MARKER}]},
            headers=traceparent(TRACES["chat_failing"]),
        ),
        "deadline": lambda: post_json(
            stack.url(FAILING_RESOURCES) + "/deadline_call",
            {
                "server": MODEL,
                "path": "/v1/responses",
                "body": {"model": REQUEST_MODEL, "input": "SLEEP:5"},
                "timeout_s": 0.3,
            },
            headers=traceparent(TRACES["deadline"]),
        ),
    }
    for name, call in calls.items():
        run.answers[name] = call()
    hung: dict[str, Any] = {}
    body = rollout_body(77, 0, f"what's it like in sf? WAIT_FILE:{release}")
    thread = threading.Thread(
        target=lambda: hung.update(answer=post_json(agent + "/run", body, 300))
    )
    thread.start()
    try:
        # the hung model call is announced as the rollout's step; then one more interval,
        # so that a heartbeat follows it
        sink.wait_for(lambda: _hung_step(sink), 120)
        seen = len(sink.log_requests())
        sink.wait_for(lambda: len(sink.log_requests()) >= seen + 3, 120)
        run.during_hang = live_events(sink)
    finally:
        release.touch()
        thread.join(300)
    run.answers["hung"] = hung.get("answer")


def start(gym_python: Path, workdir: Path, sink: RecordingSink) -> GymStack:
    env = telemetry_env(sink.endpoint, "http://127.0.0.1:9")  # no sidecar admin here
    env.update(
        GYM_TELEMETRY_POLL_INTERVAL_S="0",
        GYM_TELEMETRY_LIVE_INTERVAL_S="0.2",
        GYM_TELEMETRY_LAG_PROBE_INTERVAL_S="0.05",
    )
    return GymStack(gym_python, config(), list(START), env, workdir).start()
