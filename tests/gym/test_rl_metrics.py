"""issue 41, the sidecar's part, on real Gym servers: every RL metric the sidecar derives,
checked exactly against the driven workload, through the sidecar's Prometheus endpoint and
the OTLP metrics it exports to a real OTLP receiver.

Six unmodified Gym server processes (the stub model answering with usage, the shipped
``example_single_tool_call`` and ``simple_agent``, the example ``failing_weather`` server
and its own ``simple_agent``, and a second ``simple_agent`` whose resources server is
reached through a connection-dropping proxy), auto-instrumented with ``GYM_TELEMETRY=1``
and **no span-group configuration** (the agents' and the sidecar's defaults: the
``model_call`` group is created and derived out of the box), into one ``gym-sidecar``.

The workload (:func:`drive`): 3 rollouts, 2 rollouts whose verifier raises, 1 rollout
whose first resources-server connection is dropped twice (Gym retries), one direct model
call per dialect plain and streamed, one failing model call (HTTP 500), and one hop that
times out (its model call is cancelled at the model server).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.gym_stack import (
    AGENT,
    FAILING_AGENT,
    FAILING_RESOURCES,
    MODEL,
    RESOURCES,
    GymStack,
    load_configs,
    post_json,
)
from testkit.sink import RecordingSink
from tests.gym import rl_workload as w
from tests.sidecar.metrics.collect import Point, points
from tests.support.flaky_proxy import FlakyProxy
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

START = (MODEL, RESOURCES, AGENT, FAILING_RESOURCES, FAILING_AGENT, w.FLAKY_AGENT)
ROLLOUTS = 3
FAILING = 2
DIRECT_PLAIN = ("chat", "messages")  # a tool call each (13/5 tokens)
DIRECT_STREAMED = ("responses_stream", "chat_stream", "messages_stream")  # text (21/8)
CHAT = (semconv.GEN_AI_OPERATION_NAME, semconv.GEN_AI_OPERATION_CHAT)
POLICY = (semconv.GEN_AI_REQUEST_MODEL, w.REQUEST_MODEL)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def config() -> dict[str, Any]:
    merged = w.config()
    failing = load_configs("failing_verifier.yaml")
    merged[FAILING_AGENT] = copy.deepcopy(failing[FAILING_AGENT])
    return merged


@dataclass
class Run:
    answers: dict[str, Any] = field(default_factory=dict)
    samples: Samples = field(default_factory=dict)
    otlp: dict[str, list[Point]] = field(default_factory=dict)
    proxy_dropped: int = 0


def drive(stack: GymStack, run: Run) -> None:
    agent = stack.url(AGENT)
    for i in range(ROLLOUTS):
        run.answers[f"rollout-{i}"] = post_json(agent + "/run", w.rollout_body(i, 0))
    failing = stack.url(FAILING_AGENT)
    for i in range(FAILING):
        body = {**w.rollout_body(20 + i, 0), "fail_verify": True}
        run.answers[f"failing-{i}"] = post_json(failing + "/run", body)
    flaky_port = int(
        stack.config[w.FLAKY_RESOURCES]["resources_servers"]["example_single_tool_call"]["port"]
    )
    with FlakyProxy(stack.processes[RESOURCES].port, drop_first=w.DROPPED, port=flaky_port) as p:
        run.answers["flaky"] = post_json(stack.url(w.FLAKY_AGENT) + "/run", w.rollout_body(50, 0))
        run.proxy_dropped = p.dropped
    model = stack.processes[MODEL].port
    base = f"http://127.0.0.1:{model}"
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    chat = {"model": w.REQUEST_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    messages = {"model": w.REQUEST_MODEL, "max_tokens": 64}
    calls = {
        "responses_stream": lambda: w.stream(
            model,
            "/v1/responses",
            {"model": w.REQUEST_MODEL, "input": "hello", "stream": True},
            w.traceparent(0x201),
        ),
        "chat": lambda: post_json(base + "/v1/chat/completions", {**chat, "tools": tools}),
        "chat_stream": lambda: w.stream(
            model,
            "/v1/chat/completions",
            {**chat, "stream": True, "stream_options": {"include_usage": True}},
            w.traceparent(0x202),
        ),
        "messages": lambda: post_json(
            base + "/v1/messages",
            {
                **messages,
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": [{"name": "get_weather", "input_schema": w.TOOL["parameters"]}],
            },
        ),
        "messages_stream": lambda: w.stream(
            model,
            "/v1/messages",
            {**messages, "messages": [{"role": "user", "content": "hi"}], "stream": True},
            w.traceparent(0x203),
        ),
        "chat_failing": lambda: post_json(
            base + "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": w.FAIL_MARKER}]},
        ),
        "deadline": lambda: post_json(
            stack.url(FAILING_RESOURCES) + "/deadline_call",
            {
                "server": MODEL,
                "path": "/v1/responses",
                "body": {"model": w.REQUEST_MODEL, "input": "SLEEP:5"},
                "timeout_s": 0.3,
            },
        ),
    }
    for name, call in calls.items():
        run.answers[name] = call()


def scrape(sidecar: SidecarProcess) -> Samples:
    status, text = sidecar.admin_get("/metrics")
    assert status == 200, text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and want <= got)


EXPECTED_CALLS = (ROLLOUTS + FAILING + 1) * 2 + len(DIRECT_PLAIN) + len(DIRECT_STREAMED)
"""Model calls that completed: two per rollout (a tool call, then the answer) and one per
direct call; plus one that failed (500) and one cancelled (the hop's timeout)."""


def _settled(samples: Samples) -> bool:
    calls = total(samples, "gen_ai_client_operation_duration_count")
    return calls >= EXPECTED_CALLS + 2 and total(samples, "gym_http_client_timeouts_total") >= 1


@pytest.fixture(scope="module")
def run(gym_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import os

    workdir = tmp_path_factory.mktemp("rl-metrics")
    result = Run()
    saved = os.environ.pop("GYM_TELEMETRY_SPAN_GROUPS", None)  # the servers inherit it
    try:
        with RecordingSink() as sink:
            sidecar = SidecarProcess(
                backend=sink.endpoint, config={"metrics": {"interval_s": 1}}, log_dir=workdir
            ).start()
            env = {
                "GYM_TELEMETRY": "1",
                "OTEL_EXPORTER_OTLP_ENDPOINT": sidecar.grpc_endpoint,
                "GYM_TELEMETRY_SIDECAR_ADMIN_URL": sidecar.admin_url,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            }
            stack = GymStack(gym_python, config(), list(START), env, workdir)
            try:
                with stack:
                    drive(stack, result)
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline and not _settled(scrape(sidecar)):
                        time.sleep(0.5)
                    time.sleep(1.0)  # one more batch delay: nothing late is missed
                result.samples = scrape(sidecar)
            finally:
                sidecar.stop()  # flushes the last interval's derived metrics
            # the last export is cumulative: every series' latest point is its total
            for req in sink.metric_requests():
                for point in points(req):
                    result.otlp.setdefault(point.metric, []).append(point)
    finally:
        if saved is not None:
            os.environ["GYM_TELEMETRY_SPAN_GROUPS"] = saved
    yield result


def server(name: str) -> dict[str, str]:
    return {"nemo_gym_server_name": name}


def test_the_workload_ran_as_designed(run: Run) -> None:
    for i in range(ROLLOUTS):
        assert run.answers[f"rollout-{i}"][0] == 200
    for i in range(FAILING):
        assert run.answers[f"failing-{i}"][0] >= 500  # the verifier raised
    assert run.answers["flaky"][0] == 200 and run.proxy_dropped == w.DROPPED
    for name in (*DIRECT_PLAIN, *DIRECT_STREAMED):
        assert run.answers[name][0] == 200, (name, run.answers[name])
    assert run.answers["chat_failing"][0] == 500
    assert run.answers["deadline"] == (200, {"outcome": "timeout"})


def test_model_call_durations_at_the_model_server(run: Run) -> None:
    s = run.samples
    name = "gen_ai_client_operation_duration_count"
    ok = total(s, name, gen_ai_operation_name="chat", gen_ai_request_model=w.REQUEST_MODEL)
    failed_500 = total(s, name, error_type="500")
    cancelled = total(s, name, error_type="CancelledError")
    assert (failed_500, cancelled) == (1, 1)
    assert ok == EXPECTED_CALLS + 2  # the failed ones carry the same model and operation
    assert total(s, name) == EXPECTED_CALLS + 2
    # counted at the model server only: no GenAI point from an agent's relay or a hop
    assert total(s, name, **server(MODEL)) == EXPECTED_CALLS + 2
    assert total(s, "gen_ai_client_token_usage_count", **server(AGENT)) == 0


def test_token_usage_per_call(run: Run) -> None:
    s = run.samples
    tool, text = w.USAGE_TOOL_CALL, w.USAGE_TEXT
    rollouts = ROLLOUTS + FAILING + 1  # a tool call and a text answer each
    plain, streamed = len(DIRECT_PLAIN), len(DIRECT_STREAMED)
    for token_type, i in (("input", 0), ("output", 1)):
        labels = {"gen_ai_token_type": token_type, **server(MODEL)}
        assert total(s, "gen_ai_client_token_usage_count", **labels) == EXPECTED_CALLS
        expected = rollouts * (tool[i] + text[i]) + plain * tool[i] + streamed * text[i]
        assert total(s, "gen_ai_client_token_usage_sum", **labels) == expected


def test_time_to_first_token_of_streamed_calls(run: Run) -> None:
    s = run.samples
    count = total(s, "gen_ai_server_time_to_first_token_count", **server(MODEL))
    assert count == len(DIRECT_STREAMED)
    ttft = total(s, "gen_ai_server_time_to_first_token_sum")
    durations = total(s, "gen_ai_client_operation_duration_sum")
    assert 0 < ttft < durations


def test_rollout_turns_and_tokens_per_agent_server(run: Run) -> None:
    s = run.samples
    for agent, n in ((AGENT, ROLLOUTS), (w.FLAKY_AGENT, 1), (FAILING_AGENT, FAILING)):
        assert total(s, "gym_rollout_turns_count", **server(agent)) == n, agent
        assert total(s, "gym_rollout_turns_sum", **server(agent)) == 2 * n, agent
        assert total(s, "gym_rollout_turns_bucket", le="2.0", **server(agent)) == n
        assert total(s, "gym_rollout_turns_bucket", le="1.0", **server(agent)) == 0
    tool, text = w.USAGE_TOOL_CALL, w.USAGE_TEXT
    for agent, n in ((AGENT, ROLLOUTS), (w.FLAKY_AGENT, 1)):
        for token_type, i in (("input", 0), ("output", 1)):
            labels = {"gen_ai_token_type": token_type, **server(agent)}
            assert total(s, "gym_rollout_tokens_count", **labels) == n
            assert total(s, "gym_rollout_tokens_sum", **labels) == n * (tool[i] + text[i])
    # a rollout whose /run failed has no answer, so no summed usage: its turns only
    assert total(s, "gym_rollout_tokens_count", **server(FAILING_AGENT)) == 0


def test_verify_reward_per_resources_server(run: Run) -> None:
    s = run.samples
    ok = {"succeeded": "true", **server(RESOURCES)}
    assert total(s, "gym_verify_reward_count", **ok) == ROLLOUTS + 1  # the flaky one too
    assert total(s, "gym_verify_reward_sum", **ok) == ROLLOUTS + 1  # reward 1.0 each
    assert total(s, "gym_verify_reward_bucket", le="1.0", **ok) == ROLLOUTS + 1
    assert total(s, "gym_verify_reward_bucket", le="0.9", **ok) == 0
    # the verifier that raised: failed verifications counted, no reward point
    failed = {"succeeded": "false", **server(FAILING_RESOURCES)}
    assert total(s, "gym_verify_count_total", **failed) == FAILING
    assert total(s, "gym_verify_reward_count", **server(FAILING_RESOURCES)) == 0
    assert total(s, "gym_verify_reward_count") == ROLLOUTS + 1


def test_retries_and_timeouts_per_target_server(run: Run) -> None:
    s = run.samples
    retried = {"nemo_gym_target_server_name": w.FLAKY_RESOURCES, **server(w.FLAKY_AGENT)}
    assert total(s, "gym_http_client_retries_total", **retried) == w.DROPPED
    assert total(s, "gym_http_client_retries_total") == w.DROPPED
    timed_out = {"nemo_gym_target_server_name": MODEL, **server(FAILING_RESOURCES)}
    assert total(s, "gym_http_client_timeouts_total", **timed_out) == 1
    assert total(s, "gym_http_client_timeouts_total") == 1


def test_nothing_overflowed_or_was_invalid(run: Run) -> None:
    s = run.samples
    assert total(s, "gym_sidecar_derived_invalid_values_total") == 0
    assert total(s, "gym_sidecar_derived_overflow_points_total") == 0


def test_the_otlp_export_says_the_same(run: Run) -> None:
    """The derived metrics the sidecar exported over OTLP (cumulative: each series'
    last point is its total) carry the same figures, units and attributes."""

    def last(name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        out: dict[frozenset[tuple[str, Any]], Any] = {}
        for p in run.otlp[name]:
            key = frozenset({**p.attrs, "server": p.resource[semconv.SERVER_NAME]}.items())
            out[key] = p  # later points replace earlier ones
        return out

    usage = last(semconv.METRIC_GEN_AI_TOKEN_USAGE)
    inputs = [p for k, p in usage.items() if ("gen_ai.token.type", "input") in k]
    assert [p.unit for p in inputs] == ["{token}"]
    assert sum(p.point.count for p in inputs) == EXPECTED_CALLS
    assert {dict(k)["server"] for k in usage} == {MODEL}
    durations = last(semconv.METRIC_GEN_AI_OPERATION_DURATION)
    assert sum(p.point.count for p in durations.values()) == EXPECTED_CALLS + 2
    assert {p.unit for p in durations.values()} == {"s"}
    assert {dict(k).get(semconv.ERROR_TYPE) for k in durations} == {None, "500", "CancelledError"}
    turns = last(semconv.METRIC_ROLLOUT_TURNS)
    assert sum(p.point.sum for p in turns.values()) == 2 * (ROLLOUTS + FAILING + 1)
    rewards = last(semconv.METRIC_VERIFY_REWARD)
    assert [
        (dict(k)["server"], dict(k)["succeeded"], p.point.count) for k, p in rewards.items()
    ] == [(RESOURCES, True, ROLLOUTS + 1)]
    retries = last(semconv.METRIC_HTTP_CLIENT_RETRIES)
    assert [p.point.as_int for p in retries.values()] == [w.DROPPED]
    assert all(p.point.explicit_bounds for p in durations.values())
    assert CHAT in next(iter(durations))
    assert POLICY in next(iter(durations))
