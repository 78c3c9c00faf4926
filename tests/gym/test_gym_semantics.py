"""Gym server kinds beyond the shipped example, through Gym's own launcher and collector.

One stack (``examples/gym_stack/configs/semantics.yaml``) is started once for this module
with ``gym-telemetry-run gym env start``; its servers are real Gym 0.7.0 servers except
the stub model (policy and judge at once):

- ``equivalence_llm_judge``, an LLM-judge resources server; its judge fails (HTTP 500)
  when the task's expected answer is ``JUDGE_FAIL``, and Gym's ``judge_failsafe`` turns
  that into a 200 row with ``mask_sample: true`` / ``failure_kind: judge_failed``;
- ``judge_simple_agent`` behind ``judge_relay``, a ``legacy_agent`` relay;
- ``judge_episode``, a ``single_agent_turn`` environment server (episode protocol: its
  failures come back inside an HTTP 200) with its own session agent;
- ``blackjack``, a gymnasium resources server (its own ``FastAPI()``, ``/reset`` and
  ``/step``; reward from ``/step``), ``gymnasium_agent`` and a relay in front of it;
- Gym's own rollout collector, ``gym eval run --no-serve`` (0.7.0's name for
  ``ng_collect_rollouts``), collecting through ``judge_relay``.
- a top-level agent ``/run`` sent with the rollout id as W3C baggage (``CLIENT_BAGGAGE``):
  a rollout id alone does not make it nested.

A policy call fails when the user message holds ``POLICY_FAIL``. The sidecar forwards to
a recording sink and keeps a local store (for ``gym-sidecar rollouts --failed``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
import yaml
from gym_sidecar.store import db, queries
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from testkit.gym_stack import EXAMPLES, gym_env_start, launcher_config, launcher_env, post_json
from testkit.sink import RecordedSpan, RecordingSink
from tests.gym.traces import CLIENT, SERVER, Trace, traces
from tests.sidecar.metrics.collect import points
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

ERROR = Status.STATUS_CODE_ERROR
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
MODEL = "policy_model"
JUDGE = "equivalence_llm_judge"
JUDGE_AGENT = "judge_simple_agent"
JUDGE_RELAY = "judge_relay"
EPISODE = "judge_episode"
SESSION_AGENT = "judge_session_agent"
BLACKJACK = "blackjack"
BLACKJACK_AGENT = "blackjack_gymnasium_agent"
BLACKJACK_RELAY = "blackjack_relay"
COLLECTED = 6
"""Rows given to Gym's collector; every third one has a failing judge."""


def service(name: str) -> str:
    return f"nemo-gym/{name}"


def judge_task(task: int, *, judge_fails: bool = False, policy_fails: bool = False) -> Any:
    user = "POLICY_FAIL: what is 2+2?" if policy_fails else "What is 2+2?"
    return {
        "responses_create_params": {"input": [{"role": "user", "content": user}]},
        "expected_answer": "JUDGE_FAIL" if judge_fails else "4",
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
    }


def blackjack_task(task: int, *, policy_fails: bool = False) -> Any:
    user = "POLICY_FAIL" if policy_fails else "Deal me in."
    return {
        "responses_create_params": {"input": [{"role": "user", "content": user}]},
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
    }


def episode(rollout_id: str, *, judge_fails: bool = False, policy_fails: bool = False) -> Any:
    user = "POLICY_FAIL: what is 2+2?" if policy_fails else "What is 2+2?"
    return {
        "episode_id": {"rollout_id": rollout_id, "attempt": 0},
        "task": {
            "task_id": {"taskset": "semantics", "task_id": rollout_id},
            "task_input": {
                "responses_create_params": {"input": [{"role": "user", "content": user}]},
                "task_data": {"expected_answer": "JUDGE_FAIL" if judge_fails else "4"},
            },
        },
    }


# name -> (server, path, body, expected HTTP status); the name is the rollout id
REQUESTS: dict[str, tuple[str, str, Any, int]] = {
    "100-0": (JUDGE_AGENT, "/run", judge_task(100), 200),
    "101-0": (JUDGE_AGENT, "/run", judge_task(101), 200),
    "102-0": (JUDGE_AGENT, "/run", judge_task(102, judge_fails=True), 200),
    "103-0": (JUDGE_AGENT, "/run", judge_task(103, judge_fails=True), 200),
    "104-0": (JUDGE_AGENT, "/run", judge_task(104), 200),
    "110-0": (JUDGE_RELAY, "/run", judge_task(110), 200),
    "111-0": (JUDGE_RELAY, "/run", judge_task(111, policy_fails=True), 500),
    "ep-ok": (EPISODE, "/run", episode("ep-ok"), 200),
    "ep-judge": (EPISODE, "/run", episode("ep-judge", judge_fails=True), 200),
    "ep-policy": (EPISODE, "/run", episode("ep-policy", policy_fails=True), 200),
    "120-0": (BLACKJACK_AGENT, "/run", blackjack_task(120), 200),
    "121-0": (BLACKJACK_AGENT, "/run", blackjack_task(121), 200),
    "122-0": (BLACKJACK_RELAY, "/run", blackjack_task(122), 200),
    "123-0": (BLACKJACK_RELAY, "/run", blackjack_task(123, policy_fails=True), 500),
}
FAILED_DIRECT = {"102-0", "103-0", "111-0", "ep-judge", "ep-policy", "123-0"}
"""Rollouts (among ``REQUESTS``) that failed: a masked judge row, a relayed 500 or an
episode failure."""
RELAYED = {"110-0", "111-0", "122-0", "123-0"}
CLIENT_BAGGAGE = {"104-0"}
"""Top-level ``/run`` requests sent with the rollout id as W3C baggage, as a client that
propagates it would: no recorded rollout encloses them, so they are not nested."""
# A /step a gymnasium server fails on: "hit" with no session (its state is empty).
FAILING_STEP: Any = {
    "responses_create_params": {"input": []},
    "response": {
        "id": "resp_step",
        "object": "response",
        "created_at": 0,
        "model": "stub-model",
        "output": [
            {
                "id": "msg_step",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "annotations": [], "text": "<action>hit</action>"}
                ],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
    },
}


@dataclass
class Run:
    answers: dict[str, tuple[int, Any]]
    step_answer: tuple[int, Any]
    prefixed_answer: tuple[int, Any]
    collected: list[dict[str, Any]]
    collector_failures: list[dict[str, Any]]
    collector_log: str
    spans: list[RecordedSpan]
    traces: dict[bytes, Trace]
    metric_points: dict[str, list[Any]]
    store_dir: Path
    sidecar_exit: int | None
    failed_cli: str


def _post_with_baggage(url: str, body: Any, baggage: str) -> tuple[int, Any]:
    """POST ``body`` as JSON with a W3C ``baggage`` header; (status, parsed JSON)."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "baggage": baggage},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _wait_stable(sink: RecordingSink, quiet_s: float = 2.0) -> None:
    last = -1
    while sink.span_count != last:
        seen = last = sink.span_count
        sink.wait_for(lambda seen=seen: sink.span_count != seen, quiet_s)  # type: ignore[misc]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def run(gym_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("gym-semantics")
    env_root = gym_python.parent.parent
    config = yaml.safe_load((EXAMPLES / "configs" / "semantics.yaml").read_text())
    servers = [name for name in config if name != "head_server"]
    config_path, ports = launcher_config(config, servers, tmp, env_root)
    tasks = tmp / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {
                    "responses_create_params": {
                        "input": [{"role": "user", "content": f"What is 2+2? ({i})"}]
                    },
                    "expected_answer": "JUDGE_FAIL" if i % 3 == 2 else "4",
                    "agent_ref": {"type": "responses_api_agents", "name": JUDGE_AGENT},
                }
            )
            + "\n"
            for i in range(COLLECTED)
        )
    )
    store_dir = tmp / "store"
    with RecordingSink() as sink:
        sidecar = SidecarProcess(
            backend=sink.endpoint,
            config={"span_groups": {"spec": "per_rollout"}, "metrics": {"interval_s": 2}},
            extra_args=["--local-store", "--store-dir", str(store_dir)],
            log_dir=tmp,
        ).start()
        env = launcher_env(sidecar.grpc_endpoint, sidecar.admin_url)
        sidecar_exit: int | None = None
        try:
            with gym_env_start(env_root, config_path, ports, env, tmp) as launched:

                def send(item: tuple[str, tuple[str, str, Any, int]]) -> tuple[int, Any]:
                    name, (server, path, body, _status) = item
                    if name in CLIENT_BAGGAGE:
                        return _post_with_baggage(
                            launched.url(server, path), body, f"{semconv.ROLLOUT_ID}={name}"
                        )
                    return post_json(launched.url(server, path), body, timeout_s=120)

                with ThreadPoolExecutor(4) as pool:
                    answers = dict(zip(REQUESTS, pool.map(send, REQUESTS.items()), strict=True))
                step_answer = post_json(launched.url(BLACKJACK, "/step"), FAILING_STEP)
                prefixed_answer = post_json(
                    launched.url(MODEL, "/ng-rollout/prefixed-1/v1/responses"),
                    {"input": [{"role": "user", "content": "hello"}]},
                )
                # Gym's own collector, against the running servers (it resolves them through
                # the head server named in the same config), as an operator would run it
                collect = subprocess.run(
                    [
                        str(env_root / "bin" / "gym-telemetry-run"),
                        str(env_root / "bin" / "gym"),
                        "eval",
                        "run",
                        "--no-serve",
                        "--config",
                        str(config_path),
                        "--input",
                        str(tasks),
                        "--output",
                        str(tmp / "out.jsonl"),
                        "--no-health-check",
                    ],
                    cwd=tmp,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
                collector_log = collect.stdout + collect.stderr
                assert collect.returncode == 0, collector_log[-6000:]
                sink.wait_for(
                    lambda: (
                        sum(s.span.name == semconv.SPAN_ROLLOUT for s in sink.spans())
                        >= len(REQUESTS) + len(RELAYED) + 2 * COLLECTED
                    ),
                    60,
                )
                _wait_stable(sink)
        finally:
            sidecar_exit = sidecar.stop()
        failed_cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "gym_sidecar.cli",
                "rollouts",
                "--failed",
                "--limit",
                "100",
                "--store-dir",
                str(store_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "250"},
            check=False,
        )
        assert failed_cli.returncode == 0, failed_cli.stdout + failed_cli.stderr
        spans = sink.spans()
        metric_points: dict[str, list[Any]] = {}
        for req in sink.metric_requests():
            for name in (
                semconv.METRIC_ROLLOUT_DURATION,
                semconv.METRIC_VERIFY_COUNT,
                semconv.METRIC_ENV_STEP_COUNT,
            ):
                metric_points.setdefault(name, []).extend(points(req, name))
        yield Run(
            answers=answers,
            step_answer=step_answer,
            prefixed_answer=prefixed_answer,
            collected=_jsonl(tmp / "out.jsonl"),
            collector_failures=_jsonl(tmp / "out_failures.jsonl"),
            collector_log=collector_log,
            spans=spans,
            traces=traces(spans),
            metric_points=metric_points,
            store_dir=store_dir,
            sidecar_exit=sidecar_exit,
            failed_cli=failed_cli.stdout,
        )


def _totals(points: list[Any], value: Callable[[Any], int]) -> dict[tuple[str, Any], int]:
    """(service, attributes) -> count over the run: latest cumulative point per series."""
    latest: dict[Any, Any] = {}
    for p in points:
        assert p.temporality == CUMULATIVE
        key = (p.resource[semconv.SERVICE_NAME], tuple(sorted(p.attrs.items())))
        if key not in latest or p.point.time_unix_nano >= latest[key].point.time_unix_nano:
            latest[key] = p
    return {key: value(p) for key, p in latest.items()}


def _rollout_traces(run: Run) -> dict[str, Trace]:
    """Rollout id -> its trace (every span of a rollout's trace carries its id)."""
    out: dict[str, Trace] = {}
    for trace in run.traces.values():
        ids = trace.rollout_ids() - {None}
        if len(ids) == 1:
            out[str(next(iter(ids)))] = trace
    return out


def _collected_ids(run: Run) -> set[str]:
    """Rollout ids of the rows Gym's collector dispatched (all through ``judge_relay``)."""
    by_id = _rollout_traces(run)
    return {
        rid
        for rid, trace in by_id.items()
        if rid not in REQUESTS and service(JUDGE_RELAY) in trace.services()
    }


def _outer_rollout(trace: Trace) -> RecordedSpan:
    [outer] = [
        s for s in trace.named(semconv.SPAN_ROLLOUT) if not s.attributes.get(semconv.ROLLOUT_NESTED)
    ]
    return outer


def test_the_requests_answered_as_gym_does(run: Run) -> None:
    for name, (_server, _path, _body, status) in REQUESTS.items():
        assert run.answers[name][0] == status, (name, run.answers[name])
    for name in ("102-0", "103-0"):  # judge_failsafe: a 200 masked row
        body = run.answers[name][1]
        assert body["mask_sample"] is True and body["failure_kind"] == "judge_failed"
    assert run.answers["ep-policy"][1]["failure"]["stage"] == "agent"
    assert run.answers["ep-judge"][1]["result"]["failure_kind"] == "judge_failed"
    assert run.step_answer[0] == 500
    assert run.prefixed_answer[0] == 200
    # Gym's collector filed every third row (a failing judge) as a failure
    assert len(run.collected) == COLLECTED - COLLECTED // 3, run.collector_log[-4000:]
    assert [r["failure_kind"] for r in run.collector_failures] == ["judge_failed"] * (
        COLLECTED // 3
    )


def test_failed_judge_is_a_failed_verification(run: Run) -> None:
    verifies = [s for s in run.spans if s.span.name == semconv.SPAN_VERIFY]
    assert {s.resource[semconv.SERVER_NAME] for s in verifies} == {JUDGE}
    by_id = _rollout_traces(run)
    judge_failed = {"102-0", "103-0", "ep-judge"} | {
        rid
        for rid in _collected_ids(run)
        if by_id[rid].named(semconv.SPAN_VERIFY)[0].attributes.get(semconv.VERIFY_SUCCEEDED)
        is False
    }
    # as many failed verifications among the collected rows as Gym's failures file has
    assert len(judge_failed) == 3 + len(run.collector_failures)
    for rid, trace in by_id.items():
        for verify in trace.named(semconv.SPAN_VERIFY):
            if rid in judge_failed:
                assert verify.attributes[semconv.VERIFY_SUCCEEDED] is False, rid
                assert verify.attributes[semconv.ERROR_TYPE] == "judge_failed", rid
                assert verify.span.status.code == ERROR, rid
            else:
                assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True, rid
                assert verify.span.status.code != ERROR, rid
    counts = _totals(run.metric_points[semconv.METRIC_VERIFY_COUNT], lambda p: p.point.as_int)
    ok = ((semconv.VERIFY_SUCCEEDED, True),)
    failed = ((semconv.ERROR_TYPE, "judge_failed"), (semconv.VERIFY_SUCCEEDED, False))
    assert counts == {
        (service(JUDGE), ok): len(verifies) - len(judge_failed),
        (service(JUDGE), failed): len(judge_failed),
    }


def test_gymnasium_steps_have_their_own_semantic_spans_and_metrics(run: Run) -> None:
    by_id = _rollout_traces(run)
    ok_steps = 0
    for rid in ("120-0", "121-0", "122-0"):
        trace = by_id[rid]
        steps = trace.named(semconv.SPAN_ENV_STEP)
        assert steps, rid  # the stub stands at once: one step ends the hand
        for step in steps:
            assert step.attributes[semconv.VERIFY_SUCCEEDED] is True
            assert step.resource[semconv.SERVER_NAME] == BLACKJACK
            assert step.attributes[semconv.SERVER_NAME] == BLACKJACK
            assert step.attributes[semconv.ROLLOUT_ID] == rid
            assert trace.is_descendant(step, _outer_rollout(trace))
        ok_steps += len(steps)
        # /reset keeps its SERVER span only (no semantic span); the caller's CLIENT span
        # is named after the same route (HTTP semconv)
        reset = sorted((s.span.kind, s.span.name) for s in trace.spans if "reset" in s.span.name)
        assert reset == sorted([(SERVER, "POST /reset"), (CLIENT, "POST /reset")])
    [failed] = [
        s
        for s in run.spans
        if s.span.name == semconv.SPAN_ENV_STEP and s.attributes[semconv.VERIFY_SUCCEEDED] is False
    ]
    assert failed.attributes[semconv.ERROR_TYPE] == "IndexError"
    assert failed.span.status.code == ERROR
    counts = _totals(run.metric_points[semconv.METRIC_ENV_STEP_COUNT], lambda p: p.point.as_int)
    assert counts == {
        (service(BLACKJACK), ((semconv.VERIFY_SUCCEEDED, True),)): ok_steps,
        (
            service(BLACKJACK),
            ((semconv.ERROR_TYPE, "IndexError"), (semconv.VERIFY_SUCCEEDED, False)),
        ): 1,
    }


def test_failed_rollouts_fail_on_their_rollout_span(run: Run) -> None:
    by_id = _rollout_traces(run)
    for rid in REQUESTS:
        outer = _outer_rollout(by_id[rid])
        assert (outer.span.status.code == ERROR) is (rid in FAILED_DIRECT), rid
    # the relays relayed a 500: their own gym.rollout says so (and the agent's, inside)
    for rid in ("111-0", "123-0"):
        outer = _outer_rollout(by_id[rid])
        assert outer.resource[semconv.SERVER_TYPE] == "environment"
        assert outer.attributes[semconv.ERROR_TYPE] == "500"
        [inner] = [s for s in by_id[rid].named(semconv.SPAN_ROLLOUT) if s is not outer]
        assert inner.span.status.code == ERROR
    # the episode protocol answered 200 with a failure
    policy = _outer_rollout(by_id["ep-policy"])
    assert policy.attributes[semconv.ERROR_TYPE] == "environment_server_failed"
    assert policy.attributes[semconv.FAILURE_STAGE] == "agent"
    assert _outer_rollout(by_id["ep-judge"]).attributes[semconv.ERROR_TYPE] == "judge_failed"
    # a masked judge row fails the agent's rollout too
    for rid in ("102-0", "103-0"):
        assert _outer_rollout(by_id[rid]).attributes[semconv.ERROR_TYPE] == "judge_failed"


def test_rollouts_failed_lists_exactly_the_failed_rollouts(run: Run) -> None:
    collected_failed = {
        rid
        for rid in _collected_ids(run)
        if _outer_rollout(_rollout_traces(run)[rid]).span.status.code == ERROR
    }
    assert len(collected_failed) == len(run.collector_failures)
    for rid in collected_failed:  # the relay's own span reads the masked row it relayed
        outer = _outer_rollout(_rollout_traces(run)[rid])
        assert outer.resource[semconv.SERVER_NAME] == JUDGE_RELAY
        assert outer.attributes[semconv.ERROR_TYPE] == "judge_failed"
    expected = FAILED_DIRECT | collected_failed
    with closing(db.connect(run.store_dir / "traces.db", readonly=True)) as conn:
        failed = queries.rollouts(conn, failed_only=True, limit=100)
        everything = queries.rollouts(conn, limit=100)
    assert sorted(r.rollout_id for r in failed) == sorted(expected)
    # one row per rollout: a relayed /run is part of the relay's rollout
    ids = [r.rollout_id for r in everything]
    assert len(ids) == len(set(ids)) == len(REQUESTS) + COLLECTED
    for rid in expected:
        assert rid in run.failed_cli, (rid, run.failed_cli)
    for rid in set(REQUESTS) - expected:
        assert rid not in run.failed_cli, (rid, run.failed_cli)


def test_one_duration_point_per_rollout(run: Run) -> None:
    by_id = _rollout_traces(run)
    relayed = RELAYED | _collected_ids(run)
    for rid in set(REQUESTS) | _collected_ids(run):
        trace = by_id[rid]
        rollouts = trace.named(semconv.SPAN_ROLLOUT)
        nested = [s for s in rollouts if s.attributes.get(semconv.ROLLOUT_NESTED) is True]
        if rid in relayed:  # the relay's span, and the agent's marked nested (kept)
            assert len(rollouts) == 2 and len(nested) == 1, rid
            assert nested[0].resource[semconv.SERVER_TYPE] == "agent"
            assert trace.is_descendant(nested[0], _outer_rollout(trace))
        else:  # CLIENT_BAGGAGE too: a rollout id from a client is no enclosing rollout
            assert len(rollouts) == 1 and not nested, rid
    durations = _totals(
        run.metric_points[semconv.METRIC_ROLLOUT_DURATION], lambda p: int(p.point.count)
    )
    assert sum(durations.values()) == len(REQUESTS) + COLLECTED
    per_service: dict[str, int] = defaultdict(int)
    for (name, _attrs), count in durations.items():
        per_service[name] += count
    assert per_service == {
        service(JUDGE_AGENT): 4 + len(CLIENT_BAGGAGE),
        service(JUDGE_RELAY): 2 + COLLECTED,
        service(EPISODE): 3,
        service(BLACKJACK_AGENT): 2,
        service(BLACKJACK_RELAY): 2,
    }


def test_rollout_spans_name_their_server_and_prefixed_routes_have_a_template(run: Run) -> None:
    for span in run.spans:
        if span.span.name == semconv.SPAN_ROLLOUT:
            assert span.attributes[semconv.SERVER_NAME] == span.resource[semconv.SERVER_NAME]
    model_servers = [
        s
        for s in run.spans
        if s.span.kind == SERVER and s.resource.get(semconv.SERVER_NAME) == MODEL
    ]
    assert model_servers
    for span in model_servers:
        assert span.attributes.get("http.route") == "/v1/responses", span.span.name
    [prefixed] = [s for s in model_servers if s.attributes.get(semconv.ROLLOUT_ID) == "prefixed-1"]
    assert prefixed.span.name == "POST /v1/responses"


def test_every_trace_is_one_rollout_and_whole(run: Run) -> None:
    assert run.sidecar_exit == 0
    by_id = _rollout_traces(run)
    assert set(REQUESTS) <= set(by_id)
    assert len(_collected_ids(run)) == COLLECTED
    for rid, trace in by_id.items():
        assert trace.orphans() == [], rid
        [root] = trace.roots()
        assert root.span.kind == SERVER, rid
    assert {s.scope.split(".")[0] for s in run.spans} == {"gym_telemetry"}
