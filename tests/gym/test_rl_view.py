"""issue 41, the agent's part, on real Gym servers: every RL figure checked against the
workload that produced it (``rl_workload``: what runs, in which order).

- rollouts: ``nemo.gym.rollout.turns`` = the model calls the trace shows, the reward =
  the verifier's span's = the ``/run`` answer's, the rollout's tokens = the stub's usage
  summed = the answer's ``response.usage``;
- model calls in each dialect, plain and streamed: GenAI attributes equal to what the
  stub returned; the time to first chunk on streams; a failing call's ``error.type``;
- hops: the target server, Gym's retries (``http.request.resend_count`` = the
  connections the proxy dropped), a timeout (``error.type=timeout``);
- live events at a real OTLP receiver: a rollout whose model call hangs is announced with
  its ids and its step while it hangs, heartbeats from every server with the lag probe's
  samples, one stop event per server at shutdown.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry_semconv import live
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from testkit.gym_stack import AGENT, FAILING_RESOURCES, MODEL, RESOURCES
from testkit.sink import RecordedSpan, RecordingSink, attrs
from tests.gym import rl_workload as w
from tests.gym.traces import CLIENT, Trace, traces

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]


def service(name: str) -> str:
    return f"nemo-gym/{name}"


@pytest.fixture(scope="module")
def run(gym_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[w.Run]:
    workdir = tmp_path_factory.mktemp("rl-stack")
    result = w.Run()
    with RecordingSink() as sink:
        stack = w.start(gym_python, workdir, sink)
        try:
            w.drive(stack, sink, workdir / "release", result)
            _wait_stable(sink)
        finally:
            stack.stop()  # SIGTERM: each server flushes and sends gym.agent.stop
        sink.wait_for(lambda: len(_stops(sink)) >= len(w.START), 60)
        result.spans = sink.spans()
        result.logs = w.live_events(sink)
    yield result


def _stops(sink: RecordingSink) -> list[Any]:
    return [r for _res, r in w.live_events(sink) if r.event_name == live.EVENT_STOP]


def _wait_stable(sink: RecordingSink, quiet_s: float = 1.5, polls: int = 200) -> None:
    """Until the sink's span count stopped growing for ``quiet_s`` (each server's batch
    processor flushes within 200 ms here), at most ``polls`` times."""
    last = -1
    for _ in range(polls):
        if sink.span_count == last:
            return
        last = sink.span_count
        time.sleep(quiet_s)


def _trace(run: w.Run, scenario: str) -> Trace:
    wanted = w.TRACES[scenario].to_bytes(16, "big")
    return Trace(wanted, [s for s in run.spans if s.span.trace_id == wanted])


def _one(spans: list[RecordedSpan]) -> RecordedSpan:
    assert len(spans) == 1, [s.span.name for s in spans]
    return spans[0]


def _rollout(run: w.Run, rollout_id: str) -> tuple[RecordedSpan, Trace]:
    spans = [
        s
        for s in run.spans
        if s.span.name == semconv.SPAN_ROLLOUT
        and s.attributes.get(semconv.ROLLOUT_ID) == rollout_id
    ]
    span = _one(spans)
    return span, traces(run.spans)[span.span.trace_id]


# --- rollouts ---------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(w.ROLLOUTS))
def test_rollout_turns_reward_and_tokens(run: w.Run, index: int) -> None:
    status, answer = run.answers[f"rollout-{index}"]
    assert status == 200, answer
    span, trace = _rollout(run, f"{index}-0")
    model_calls = trace.named(semconv.SPAN_MODEL_RESPONSES)
    assert len(model_calls) == 2  # the tool call, then the answer
    assert span.attributes[semconv.ROLLOUT_TURNS] == len(model_calls)
    verify = _one(trace.named(semconv.SPAN_VERIFY))
    assert (
        span.attributes[semconv.REWARD]
        == verify.attributes[semconv.REWARD]
        == answer["reward"]
        == 1.0
    )
    assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True
    expected = (w.USAGE_TOOL_CALL[0] + w.USAGE_TEXT[0], w.USAGE_TOOL_CALL[1] + w.USAGE_TEXT[1])
    usage = answer["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == expected
    assert (
        span.attributes[semconv.ROLLOUT_INPUT_TOKENS],
        span.attributes[semconv.ROLLOUT_OUTPUT_TOKENS],
    ) == expected
    summed = tuple(
        sum(int(m.attributes[key]) for m in model_calls)
        for key in (semconv.GEN_AI_USAGE_INPUT_TOKENS, semconv.GEN_AI_USAGE_OUTPUT_TOKENS)
    )
    assert summed == expected
    # the rollout span itself carries no gen_ai.usage (it would be counted twice)
    assert not any(key.startswith("gen_ai.") for key in span.attributes)


def test_model_calls_of_a_rollout_carry_genai_attributes(run: w.Run) -> None:
    _span, trace = _rollout(run, "0-0")
    first, second = sorted(
        trace.named(semconv.SPAN_MODEL_RESPONSES), key=lambda s: s.span.start_time_unix_nano
    )
    for call, usage in ((first, w.USAGE_TOOL_CALL), (second, w.USAGE_TEXT)):
        assert call.resource[semconv.SERVICE_NAME] == service(MODEL)
        assert call.attributes[semconv.GEN_AI_OPERATION_NAME] == "chat"
        assert call.attributes[semconv.OPENAI_API_TYPE] == "responses"
        assert call.attributes[semconv.GEN_AI_REQUEST_MODEL] == w.REQUEST_MODEL
        assert call.attributes[semconv.GEN_AI_RESPONSE_MODEL] == w.SERVED_MODEL
        assert (
            call.attributes[semconv.GEN_AI_USAGE_INPUT_TOKENS],
            call.attributes[semconv.GEN_AI_USAGE_OUTPUT_TOKENS],
        ) == usage
        assert list(call.attributes[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == ["completed"]
        assert semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK not in call.attributes  # not streamed


def test_the_rollouts_hops_name_their_target(run: w.Run) -> None:
    _span, trace = _rollout(run, "0-0")
    hops = [
        s
        for s in trace.spans
        if s.span.kind == CLIENT and s.resource[semconv.SERVICE_NAME] == service(AGENT)
    ]
    targets = {(s.span.name, s.attributes.get(semconv.TARGET_SERVER_NAME)) for s in hops}
    assert targets == {
        ("POST /seed_session", RESOURCES),
        ("POST /v1/responses", AGENT),  # simple_agent's call to its own /v1/responses
        ("POST /get_weather", RESOURCES),
        ("POST /verify", RESOURCES),
        ("POST /v1/responses", MODEL),
    }
    assert not any(semconv.HTTP_REQUEST_RESEND_COUNT in s.attributes for s in hops)


# --- dialects, streams, failures ------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "span_name", "usage", "reasons", "api_type", "streamed"),
    [
        (
            "responses_stream",
            semconv.SPAN_MODEL_RESPONSES,
            w.USAGE_TEXT,
            ["completed"],
            "responses",
            True,
        ),
        (
            "chat",
            semconv.SPAN_MODEL_CHAT,
            w.USAGE_TOOL_CALL,
            ["tool_calls"],
            "chat_completions",
            False,
        ),
        ("chat_stream", semconv.SPAN_MODEL_CHAT, w.USAGE_TEXT, ["stop"], "chat_completions", True),
        ("messages", semconv.SPAN_MODEL_MESSAGES, w.USAGE_TOOL_CALL, ["tool_use"], None, False),
        ("messages_stream", semconv.SPAN_MODEL_MESSAGES, w.USAGE_TEXT, ["end_turn"], None, True),
    ],
)
def test_each_dialect_plain_and_streamed(
    run: w.Run,
    scenario: str,
    span_name: str,
    usage: tuple[int, int],
    reasons: list[str],
    api_type: str | None,
    streamed: bool,
) -> None:
    status, _body = run.answers[scenario]
    assert status == 200
    call = _one(_trace(run, scenario).named(span_name))
    found = call.attributes
    assert found[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert found.get(semconv.OPENAI_API_TYPE) == api_type
    assert found[semconv.GEN_AI_REQUEST_MODEL] == w.REQUEST_MODEL
    # Messages answers with the model the request named (Gym's mapping); the others with
    # the model that served it
    served = w.REQUEST_MODEL if span_name == semconv.SPAN_MODEL_MESSAGES else w.SERVED_MODEL
    assert found[semconv.GEN_AI_RESPONSE_MODEL] == served
    assert (
        found[semconv.GEN_AI_USAGE_INPUT_TOKENS],
        found[semconv.GEN_AI_USAGE_OUTPUT_TOKENS],
    ) == usage
    assert list(found[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == reasons
    assert call.span.status.code != Status.STATUS_CODE_ERROR
    if streamed:
        ttfc = found[semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK]
        duration_s = (call.span.end_time_unix_nano - call.span.start_time_unix_nano) / 1e9
        assert 0.0 < ttfc <= duration_s
    else:
        assert semconv.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK not in found


def test_a_failing_model_call(run: w.Run) -> None:
    assert run.answers["chat_failing"][0] == 500
    call = _one(_trace(run, "chat_failing").named(semconv.SPAN_MODEL_CHAT))
    assert call.span.status.code == Status.STATUS_CODE_ERROR
    assert call.attributes[semconv.ERROR_TYPE] == "500"
    assert call.attributes[semconv.GEN_AI_REQUEST_MODEL] == w.REQUEST_MODEL
    assert not any(
        key.startswith("gen_ai.usage") or key.startswith("gen_ai.response")
        for key in call.attributes
    )


# --- retries and timeouts -------------------------------------------------------------------


def test_a_retried_hop_counts_its_resends(run: w.Run) -> None:
    status, answer = run.answers["flaky"]
    assert status == 200 and answer["reward"] == 1.0
    assert run.proxy_dropped == w.DROPPED
    _span, trace = _rollout(run, "50-0")
    hops = [
        s
        for s in trace.spans
        if s.span.kind == CLIENT
        and s.attributes.get(semconv.TARGET_SERVER_NAME) == w.FLAKY_RESOURCES
    ]
    resent = {s.span.name: s.attributes.get(semconv.HTTP_REQUEST_RESEND_COUNT) for s in hops}
    assert resent == {
        "POST /seed_session": w.DROPPED,
        "POST /get_weather": None,
        "POST /verify": None,
    }
    seed = next(s for s in hops if s.span.name == "POST /seed_session")
    assert seed.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert seed.span.status.code != Status.STATUS_CODE_ERROR


def test_a_hop_that_timed_out(run: w.Run) -> None:
    assert run.answers["deadline"] == (200, {"outcome": "timeout"})
    trace = _trace(run, "deadline")
    hop = _one([s for s in trace.spans if s.span.kind == CLIENT])
    assert hop.resource[semconv.SERVICE_NAME] == service(FAILING_RESOURCES)
    assert hop.span.name == "POST /v1/responses"
    assert hop.attributes[semconv.TARGET_SERVER_NAME] == MODEL
    assert hop.attributes[semconv.ERROR_TYPE] == semconv.ERROR_TYPE_TIMEOUT
    assert hop.span.status.code == Status.STATUS_CODE_ERROR
    assert semconv.HTTP_RESPONSE_STATUS_CODE not in hop.attributes
    assert [e.name for e in hop.span.events] == ["exception"]


# --- live events ----------------------------------------------------------------------------


def test_the_hung_rollout_is_announced_with_its_step(run: w.Run) -> None:
    assert run.answers["hung"][0] == 200  # released: it completed
    span, _trace = _rollout(run, w.HUNG_ROLLOUT)
    agent = service(AGENT)
    mine = [
        r
        for res, r in run.during_hang
        if res.get("service.name") == agent
        and attrs(r.attributes).get(semconv.ROLLOUT_ID) == w.HUNG_ROLLOUT
    ]
    assert mine and mine[0].event_name == live.EVENT_ROLLOUT_START
    start = mine[0]
    assert (start.trace_id, start.span_id) == (span.span.trace_id, span.span.span_id)
    assert start.time_unix_nano == span.span.start_time_unix_nano
    assert start.flags == 1
    steps = [r for r in mine if r.event_name == live.EVENT_ROLLOUT_STEP]
    assert [r.event_name for r in mine].count(live.EVENT_ROLLOUT_START) == 1
    assert all((r.trace_id, r.span_id) == (start.trace_id, start.span_id) for r in steps)
    times = [r.time_unix_nano for r in steps]
    assert times == sorted(times) and times[0] >= start.time_unix_nano
    last = attrs(steps[-1].attributes)  # what it hangs in
    assert last[live.ROLLOUT_STEP] == "POST /v1/responses"
    assert last[live.ROLLOUT_STEP_TARGET] == MODEL
    assert last[semconv.ROLLOUT_TURNS] == 1
    assert span.attributes[semconv.ROLLOUT_TURNS] == 2  # after the release
    beats = [
        attrs(r.attributes)
        for res, r in run.during_hang
        if res.get("service.name") == agent
        and r.event_name == live.EVENT_HEARTBEAT
        and r.time_unix_nano > steps[-1].time_unix_nano
    ]
    assert beats and all(b[live.ROLLOUTS_IN_FLIGHT] == 1 for b in beats)
    assert all(r.event_name != live.EVENT_STOP for _res, r in run.during_hang)


def test_every_server_heartbeats_with_its_loop_lag(run: w.Run) -> None:
    for name in w.START:
        beats = [attrs(r.attributes) for _res, r in run.events(live.EVENT_HEARTBEAT, service(name))]
        assert beats, name
        assert all(b[live.LIVE_INTERVAL_S] == 0.2 for b in beats)
        # the first heartbeats may come before uvicorn started the loop (and the probe)
        with_lag = [b for b in beats if b.get(live.LAG_COUNT, 0) > 0]
        assert with_lag, name  # the probe ran on the server's loop
        for b in with_lag:
            assert len(b[live.LAG_BUCKET_COUNTS]) == len(live.EVENT_LOOP_LAG_BOUNDS_MS) + 1
            assert sum(b[live.LAG_BUCKET_COUNTS]) == b[live.LAG_COUNT]
            assert 0.0 <= b[live.LAG_MAX] <= b[live.LAG_SUM]


def test_one_stop_event_per_server_after_its_last_heartbeat(run: w.Run) -> None:
    for name in w.START:
        names = [r.event_name for res, r in run.logs if res.get("service.name") == service(name)]
        assert names.count(live.EVENT_STOP) == 1, name
        assert names[-1] == live.EVENT_STOP
        resource = next(res for res, r in run.logs if res.get("service.name") == service(name))
        assert resource["nemo.gym.server.name"] == name
        assert resource.get("service.instance.id")


def test_every_announced_rollout_is_a_real_rollout_span(run: w.Run) -> None:
    rollouts = {
        (s.span.trace_id, s.span.span_id): s
        for s in run.spans
        if s.span.name == semconv.SPAN_ROLLOUT
    }
    for _res, record in run.events(live.EVENT_ROLLOUT_START) + run.events(live.EVENT_ROLLOUT_STEP):
        span = rollouts[(record.trace_id, record.span_id)]
        assert (
            attrs(record.attributes).get(semconv.ROLLOUT_ID) == span.attributes[semconv.ROLLOUT_ID]
        )
    assert not run.events(live.EVENT_ROLLOUT_START, service(MODEL))
