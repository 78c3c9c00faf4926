"""Real NeMo Gym 0.7.0 servers, auto-instrumented, through a real sidecar: one trace per rollout.

Five unmodified Gym server processes (the stub model, the shipped
``example_single_tool_call`` and ``simple_agent``, plus a second agent in front of a
resources server whose verifier raises on request), started the way Gym's launcher
starts them, with only ``GYM_TELEMETRY=1`` and the sidecar address added to their
environment. Their OTLP goes to a real ``gym-sidecar`` process that forwards to a
recording OTLP sink. 20 rollouts run 5 at a time, then 2 whose verifier raises; the
sidecar is stopped (SIGTERM flushes its derived metrics, exported every 2 s before that)
and everything the sink received is checked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, NumberDataPoint

from testkit.gym_stack import (
    AGENT,
    FAILING_AGENT,
    FAILING_RESOURCES,
    MODEL,
    RESOURCES,
    SERVERS,
    GymStack,
    load_configs,
    post_json,
    run_body,
    telemetry_env,
)
from testkit.sink import RecordedSpan, RecordingSink
from tests.gym.traces import CLIENT, SERVER, Trace, by_rollout, traces
from tests.sidecar.metrics.collect import Point, points
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

ROLLOUTS = 20
CONCURRENCY = 5
FAILING_ROLLOUTS = 2
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
ROLLOUT_TEMPLATE = "/ng-rollout/{rollout_id}"


def service(name: str) -> str:
    return f"nemo-gym/{name}"


@dataclass
class Run:
    ok: dict[str, tuple[int, Any]]
    failing: dict[str, tuple[int, Any]]
    spans: list[RecordedSpan]
    traces: dict[bytes, Trace]
    metric_points: dict[str, list[Any]]
    sidecar_exit: int


@pytest.fixture(scope="module")
def run(gym_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("gym-stack")
    with RecordingSink() as sink:
        sidecar = SidecarProcess(
            backend=sink.endpoint,
            config={
                "span_groups": {"spec": "per_rollout"},
                # several cumulative exports during the run, then the SIGTERM flush:
                # the count check must take each series' latest point, not their sum
                "metrics": {"interval_s": 2},
            },
            log_dir=workdir,
        ).start()
        env = telemetry_env(sidecar.grpc_endpoint, sidecar.admin_url)
        config = load_configs("stack.yaml", "failing_verifier.yaml")
        stack = GymStack(gym_python, config, list(SERVERS), env, workdir)
        try:
            with stack:
                agent_url = stack.url(AGENT) + "/run"
                jobs = {f"{t}-{r}": run_body(t, r) for t in range(ROLLOUTS // 2) for r in range(2)}
                with ThreadPoolExecutor(CONCURRENCY) as pool:
                    results = pool.map(lambda body: post_json(agent_url, body), jobs.values())
                    ok = dict(zip(jobs, results, strict=True))
                failing_url = stack.url(FAILING_AGENT) + "/run"
                failing = {
                    f"{100 + i}-0": post_json(failing_url, run_body(100 + i, 0, fail_verify=True))
                    for i in range(FAILING_ROLLOUTS)
                }
                # every server's batch processor flushes within ~200 ms; wait until the
                # sink has stopped growing
                sink.wait_for(lambda: _rollout_spans(sink) >= ROLLOUTS + FAILING_ROLLOUTS, 30)
                _wait_stable(sink)
        finally:
            sidecar_exit = sidecar.stop()
        spans = sink.spans()
        metric_points: dict[str, list[Any]] = {}
        for req in sink.metric_requests():
            for name in (
                semconv.METRIC_ROLLOUT_DURATION,
                semconv.METRIC_VERIFY_COUNT,
            ):
                metric_points.setdefault(name, []).extend(points(req, name))
        yield Run(ok, failing, spans, traces(spans), metric_points, sidecar_exit)


def _rollout_spans(sink: RecordingSink) -> int:
    return sum(1 for s in sink.spans() if s.span.name == semconv.SPAN_ROLLOUT)


def _wait_stable(sink: RecordingSink, quiet_s: float = 1.5) -> None:
    last = -1
    while sink.span_count != last:
        seen = last = sink.span_count
        sink.wait_for(lambda seen=seen: sink.span_count != seen, quiet_s)  # type: ignore[misc]


def _ok_traces(run: Run) -> dict[str, Trace]:
    """Rollout id -> its trace, for the rollouts that should succeed."""
    grouped = by_rollout(run.spans)
    out: dict[str, Trace] = {}
    for rollout_id in run.ok:
        [trace_id] = grouped[rollout_id]
        out[rollout_id] = run.traces[trace_id]
    return out


def test_every_rollout_succeeded(run: Run) -> None:
    assert len(run.ok) == ROLLOUTS
    for rollout_id, (status, body) in run.ok.items():
        assert status == 200, (rollout_id, body)
        assert body["reward"] == 1.0
        assert [o["type"] for o in body["response"]["output"]] == [
            "function_call",
            "function_call_output",
            "message",
        ]


def test_exactly_one_trace_per_rollout(run: Run) -> None:
    grouped = by_rollout(run.spans)
    assert None not in grouped, "spans without a rollout id arrived"
    for rollout_id in run.ok:
        assert len(grouped[rollout_id]) == 1, rollout_id
    # no other traces: every trace belongs to exactly one rollout
    assert len(run.traces) == ROLLOUTS + FAILING_ROLLOUTS
    assert set(grouped) == set(run.ok) | set(run.failing)


def test_rollout_id_on_every_span_of_the_rollout(run: Run) -> None:
    for rollout_id, trace in _ok_traces(run).items():
        assert trace.rollout_ids() == {rollout_id}


def test_only_this_agents_scopes(run: Run) -> None:
    # FastAPI's built-in telemetry (fastapi >= 0.165, scope "fastapi") stays off
    assert {s.scope.split(".")[0] for s in run.spans} == {"gym_telemetry"}


def test_spans_from_all_three_services(run: Run) -> None:
    for rollout_id in run.ok:
        trace = _ok_traces(run)[rollout_id]
        assert trace.services() == {service(MODEL), service(RESOURCES), service(AGENT)}


def test_identity_resource_attributes(run: Run) -> None:
    types = {MODEL: "model", RESOURCES: "resources", AGENT: "agent"}
    for span in run.spans:
        name = span.resource[semconv.SERVER_NAME]
        if name in types:
            assert span.resource[semconv.SERVICE_NAME] == service(name)
            assert span.resource[semconv.SERVER_TYPE] == types[name]


def test_parent_child_edges_across_processes(run: Run) -> None:
    for rollout_id, trace in _ok_traces(run).items():
        assert trace.orphans() == [], rollout_id
        [root] = trace.roots()
        assert root.span.kind == SERVER and root.span.name == "POST /run"
        assert root.resource[semconv.SERVICE_NAME] == service(AGENT)
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert trace.parent(rollout) is root
        for span in trace.spans:
            if span.span.kind != SERVER or span is root:
                continue
            # every SERVER span (all other processes, and the agent's self-call) is the
            # child of a CLIENT span of the agent, under the rollout span
            parent = trace.parent(span)
            assert parent is not None and parent.span.kind == CLIENT, span.span.name
            assert parent.resource[semconv.SERVICE_NAME] == service(AGENT)
            assert trace.is_descendant(span, rollout)
            # the CLIENT span is named "{method} {url.template}" (HTTP semconv); its route
            # is the server's, with the rollout prefix (if any) as a template
            template = parent.attributes[semconv.URL_TEMPLATE]
            assert parent.span.name == f"POST {template}", parent.span.name
            assert template.removeprefix(ROLLOUT_TEMPLATE) == span.span.name.split(" ", 1)[1]
            assert parent.span.status.code == parent.span.status.STATUS_CODE_UNSET
        model_calls = trace.named("gym.model.responses")
        assert len(model_calls) == 2  # tool call turn, then the final message
        for call in model_calls:
            assert call.resource[semconv.SERVICE_NAME] == service(MODEL)
            assert trace.is_descendant(call, rollout)
        [agent_call] = trace.named("gym.agent.responses")  # the agent's own /v1/responses
        assert agent_call.resource[semconv.SERVICE_NAME] == service(AGENT)
        assert agent_call.scope == semconv.scope_name(semconv.GROUP_AGENT)
        assert trace.is_descendant(agent_call, rollout)
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert trace.is_descendant(verify, rollout)
        server_routes = sorted(s.span.name for s in trace.spans if s.span.kind == SERVER)
        assert server_routes == sorted(
            [
                "POST /run",
                "POST /seed_session",
                "POST /v1/responses",  # the agent's own /v1/responses
                "POST /v1/responses",  # the model, twice
                "POST /v1/responses",
                "POST /get_weather",
                "POST /verify",
            ]
        )


def test_one_successful_verify_per_rollout(run: Run) -> None:
    for rollout_id, trace in _ok_traces(run).items():
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True, rollout_id
        assert verify.resource[semconv.SERVICE_NAME] == service(RESOURCES)


def test_raising_verifier_is_a_failed_verification(run: Run) -> None:
    grouped = by_rollout(run.spans)
    for rollout_id, (status, _body) in run.failing.items():
        assert status == 500  # Gym's exception middleware answers the agent's call
        [trace_id] = grouped[rollout_id]
        trace = run.traces[trace_id]
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.attributes[semconv.VERIFY_SUCCEEDED] is False
        assert verify.attributes[semconv.ERROR_TYPE] == "VerifierCrash"
        assert verify.span.status.code == verify.span.status.STATUS_CODE_ERROR
        assert verify.resource[semconv.SERVICE_NAME] == service(FAILING_RESOURCES)
        [rollout] = trace.named(semconv.SPAN_ROLLOUT)
        assert trace.is_descendant(verify, rollout)
        assert rollout.span.status.code == rollout.span.status.STATUS_CODE_ERROR
        # the agent's hop to /verify answered 500: its CLIENT span is an error (HTTP semconv)
        route = trace.parent(verify)
        call = trace.parent(route) if route is not None else None
        assert call is not None and call.span.kind == CLIENT
        assert call.span.name.startswith("POST ") and call.span.name.endswith("/verify")
        assert call.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 500
        assert call.attributes[semconv.ERROR_TYPE] == "500"
        assert call.span.status.code == call.span.status.STATUS_CODE_ERROR


def _series_totals(points: list[Any], value: Callable[[Any], int]) -> dict[Any, int]:
    """Per series (service, attributes), the count over the whole run.

    A cumulative series reports its running total in every export, so only its latest
    point counts (summing them would count a rollout once per export when the run
    outlasts ``metrics.interval_s``); delta points are summed.
    """
    latest: dict[Any, Any] = {}
    totals: dict[Any, int] = defaultdict(int)
    for p in points:
        key = (p.resource[semconv.SERVICE_NAME], tuple(sorted(p.attrs.items())))
        if p.temporality == CUMULATIVE:
            if key not in latest or p.point.time_unix_nano >= latest[key].point.time_unix_nano:
                latest[key] = p
        else:
            totals[key] += value(p)
    for key, p in latest.items():
        totals[key] += value(p)
    return dict(totals)


def test_series_totals_take_the_latest_cumulative_point() -> None:
    res = {semconv.SERVICE_NAME: "s"}
    ok = {semconv.VERIFY_SUCCEEDED: True}
    cumulative = [
        Point(res, "", "", "", "sum", CUMULATIVE, ok, NumberDataPoint(time_unix_nano=t, as_int=n))
        for t, n in ((1, 3), (3, 7), (2, 5))
    ]
    delta = [
        Point(res, "", "", "", "sum", DELTA, {}, NumberDataPoint(time_unix_nano=t, as_int=n))
        for t, n in ((1, 3), (2, 4))
    ]
    totals = _series_totals(cumulative + delta, lambda p: int(p.point.as_int))
    assert totals == {("s", ((semconv.VERIFY_SUCCEEDED, True),)): 7, ("s", ()): 7}


def test_derived_metrics_count_exactly_these_rollouts(run: Run) -> None:
    assert run.sidecar_exit == 0
    rollouts: dict[str, int] = defaultdict(int)
    for (name, _attrs), count in _series_totals(
        run.metric_points[semconv.METRIC_ROLLOUT_DURATION], lambda p: int(p.point.count)
    ).items():
        rollouts[name] += count
    assert rollouts == {service(AGENT): ROLLOUTS, service(FAILING_AGENT): FAILING_ROLLOUTS}
    verify_counts: dict[tuple[str, bool], int] = defaultdict(int)
    for (name, attrs), count in _series_totals(
        run.metric_points[semconv.METRIC_VERIFY_COUNT], lambda p: int(p.point.as_int)
    ).items():
        verify_counts[(name, dict(attrs)[semconv.VERIFY_SUCCEEDED])] += count
    assert verify_counts == {
        (service(RESOURCES), True): ROLLOUTS,
        (service(FAILING_RESOURCES), False): FAILING_ROLLOUTS,
    }
