"""NeMo Gym's *own* telemetry through a real sidecar (issue 40): upstream's code, run.

Gym 0.7.0's ``nemo_gym.telemetry`` on PyPI's nemo-lens 0.1.0 (Python 3.13, the ``lens``
environment of ``scripts/gym_env.py``) with the test-only stand-in for what that Lens
lacks (``testkit/lens_standin``): Gym's own wrappers, Lens's own ``managed_span``,
providers, exporters and meter, Gym's own ``configure_telemetry_env`` for the
environment. Three Gym servers (stub model, ``failing_weather``, ``simple_agent``), 20
rollouts of which 4 have a verifier that raises, into one ``gym-sidecar run`` with
default settings (plus ``--local-store``, forwarding to a recording OTLP sink); then the
same with a mixed fleet (the agent server on this project's agent, which wins over Gym's
telemetry in its process, the other two on Gym's own). The checks are the issue's table
(docs/nemo-gym.md, "Gym's own telemetry"): every rollout listed, one derived rollout
point and one verify point per call (the failures with an ``error.type``), no span of a
group the default policy does not forward at the backend, one producer per metric name.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry_semconv import gym_dialect

from testkit.gym_fleet import (
    FAILING_AGENT,
    LENS_STANDIN,
    SIDECAR_SCOPE,
    FleetRun,
    fleet_table,
    gym_own_env,
    latest_points,
    lens_python,
    producers,
    run_fleet,
)
from testkit.gym_stack import FAILING_RESOURCES, MODEL

pytestmark = [pytest.mark.gym, pytest.mark.timeout(2400)]

ROLLOUTS = 20
FAILING = 4
OWNED = "gym_sidecar_owned_metric_points_total{action=rename}"


def service(name: str) -> str:
    return f"nemo-gym/{name}"


@pytest.fixture(scope="module")
def python() -> Path:
    try:
        return lens_python()
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def gym_fleet(python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    yield run_fleet(
        python,
        tmp_path_factory.mktemp("gym-fleet"),
        rollouts=ROLLOUTS,
        failing=FAILING,
        counters=[OWNED],
    )


@pytest.fixture(scope="module")
def mixed_fleet(python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    yield run_fleet(
        python,
        tmp_path_factory.mktemp("mixed-fleet"),
        agent_servers=[FAILING_AGENT],
        rollouts=ROLLOUTS,
        failing=FAILING,
        counters=[OWNED],
    )


def check_table(run: FleetRun) -> None:
    """The issue's table: 20/20 listed, 20 rollout points, 20 verify points (4 failed,
    with an error.type), 0 spans of not-forwarded groups, one producer per name."""
    statuses = Counter(status for status, _ in run.results.values())
    assert statuses == {200: ROLLOUTS - FAILING, 500: FAILING}, run.results
    assert run.sidecar_exit == 0, run.sidecar_log[-3000:]
    table = fleet_table(run)
    assert table.listed == ROLLOUTS
    failed_rows = [row for row in run.listed if row.failed]
    assert len(failed_rows) == FAILING
    assert all(row.verify == "-" for row in run.listed)  # verify: metrics mode, not stored
    assert table.rollout_points == ROLLOUTS
    assert table.verify_points == ROLLOUTS
    assert table.verify_failed == FAILING
    assert table.failed_error_types == ["VerifierCrash"] * FAILING
    assert table.gated_past == {}
    assert table.rollout_duration_producers == {SIDECAR_SCOPE}
    assert table.shared_names == {}


def check_one_trace_per_rollout(run: FleetRun) -> None:
    """Each rollout is one trace across the three servers, whoever recorded which span
    (the W3C context crosses producers)."""
    by_trace: dict[bytes, set[str]] = {}
    for span in run.spans:
        by_trace.setdefault(span.span.trace_id, set()).add(span.resource[semconv.SERVICE_NAME])
    rollout_traces = {s.span.trace_id for s in run.spans if s.span.name == semconv.SPAN_ROLLOUT}
    assert len(rollout_traces) == ROLLOUTS
    for trace in rollout_traces:
        assert by_trace[trace] == {
            service(MODEL),
            service(FAILING_RESOURCES),
            service(FAILING_AGENT),
        }


def test_gym_fleet_reads_as_the_issue_wants(gym_fleet: FleetRun) -> None:
    check_table(gym_fleet)
    check_one_trace_per_rollout(gym_fleet)


def test_gym_spans_arrive_in_gyms_own_dialect(gym_fleet: FleetRun) -> None:
    """What makes this a test of upstream's code: the spans came from Lens's scope, the
    resource from Gym's own init, the failures as exception events."""
    rollouts = [s for s in gym_fleet.spans if s.span.name == semconv.SPAN_ROLLOUT]
    assert {s.scope for s in rollouts} == {gym_dialect.SCOPE_LENS_HELPERS}
    assert {s.resource[gym_dialect.SERVICE_GROUP] for s in rollouts} == {"nemo-gym"}
    assert {s.resource[semconv.SERVER_TYPE] for s in rollouts} == {"responses_api_agents"}
    failed = [s for s in rollouts if s.span.status.code == 2]
    assert len(failed) == FAILING
    for span in failed:
        assert [e.name for e in span.span.events] == [gym_dialect.EXCEPTION_EVENT]
    assert {s.scope for s in gym_fleet.spans if s.span.kind == 3} == {gym_dialect.SCOPE_GYM_CLIENT}


def test_gyms_in_process_copies_are_renamed(gym_fleet: FleetRun) -> None:
    made_by = producers(gym_fleet.metric_requests)
    assert made_by[semconv.METRIC_ROLLOUT_DURATION] == {SIDECAR_SCOPE}
    assert made_by["gym.inprocess.rollout.duration_ms"] == {gym_dialect.METRIC_SCOPE}
    assert made_by["gym.inprocess.verify.success_rate"] == {gym_dialect.METRIC_SCOPE}
    assert gym_fleet.counters[OWNED] > 0


def test_gyms_own_model_calls_give_the_genai_durations(gym_fleet: FleetRun) -> None:
    """issue 41, both dialects: Gym's own ``gym.model.responses`` spans (Lens's scope, no
    GenAI attributes) give ``gen_ai.client.operation.duration`` points as the agent's do:
    one per call, at the model server, ``gen_ai.operation.name=chat``; no token usage
    (Gym's spans carry none) and no reward (nor do they)."""
    points = latest_points(
        gym_fleet.metric_requests, semconv.METRIC_GEN_AI_OPERATION_DURATION, SIDECAR_SCOPE
    )
    assert sum(p.count for p in points) == 2 * ROLLOUTS  # a tool call, then the answer
    for p in points:
        attrs = {kv.key: kv.value.string_value for kv in p.attributes}
        assert attrs == {semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT}
    for name in (semconv.METRIC_GEN_AI_TOKEN_USAGE, semconv.METRIC_VERIFY_REWARD):
        assert not latest_points(gym_fleet.metric_requests, name, SIDECAR_SCOPE), name
    made_by = producers(gym_fleet.metric_requests)
    assert made_by[semconv.METRIC_GEN_AI_OPERATION_DURATION] == {SIDECAR_SCOPE}


def test_mixed_fleet_reads_as_one_fleet(mixed_fleet: FleetRun) -> None:
    check_table(mixed_fleet)
    check_one_trace_per_rollout(mixed_fleet)
    rollout_scopes = {s.scope for s in mixed_fleet.spans if s.span.name == semconv.SPAN_ROLLOUT}
    assert rollout_scopes == {semconv.scope_name(semconv.GROUP_ROLLOUT)}  # the agent's


def test_in_the_mixed_fleet_the_agent_wins_in_its_process(mixed_fleet: FleetRun) -> None:
    """One process, one telemetry: the server running the agent exports only the agent's
    spans (no Lens scope, no FastAPI instrumentor) and no metrics (Gym's meter was never
    set up there); the other two export Gym's own."""
    ours = service(FAILING_AGENT)
    scopes: dict[str, set[str]] = {}
    for span in mixed_fleet.spans:
        scopes.setdefault(span.resource[semconv.SERVICE_NAME], set()).add(span.scope)
    assert all(scope.startswith(semconv.SCOPE_PREFIX) for scope in scopes[ours]), scopes[ours]
    # Gym's own SERVER spans (its gym.verify spans are derived, then gated: metrics mode)
    assert scopes[service(FAILING_RESOURCES)] == {"opentelemetry.instrumentation.fastapi"}
    metric_services = {  # metrics the servers sent (not the sidecar's derived ones)
        kv.value.string_value
        for req in mixed_fleet.metric_requests
        for rm in req.resource_metrics
        if any(sm.scope.name != SIDECAR_SCOPE for sm in rm.scope_metrics)
        for kv in rm.resource.attributes
        if kv.key == semconv.SERVICE_NAME
    }
    assert ours not in metric_services
    assert service(FAILING_RESOURCES) in metric_services


_PROBE = """
import json, types
from opentelemetry import metrics, trace
from nemo_gym.server_utils import SimpleServer
from nemo_gym.telemetry.setup import get_telemetry
server = types.SimpleNamespace(config=types.SimpleNamespace(name="probe"))
SimpleServer.setup_telemetry(server)
import threading
print(json.dumps({
    "gym_handle": get_telemetry() is not None,
    "tracer_provider": type(trace.get_tracer_provider()).__module__,
    "meter_provider": type(metrics.get_meter_provider()).__name__,
    "span_threads": sorted(t.name for t in threading.enumerate() if "Span" in t.name),
}))
"""


@pytest.mark.parametrize("agent", [True, False])
def test_one_process_one_telemetry(python: Path, agent: bool) -> None:
    """Gym's ``setup_telemetry`` in the lens environment with Gym's telemetry switched on:
    with ``GYM_TELEMETRY=1`` only the agent's SDK exports (Gym's handle stays None, no
    meter provider, one span batch thread); without it, Gym's own does."""
    env = {k: v for k, v in os.environ.items() if k != "GYM_TELEMETRY"}
    env.update(gym_own_env(python, "http://127.0.0.1:9"))
    env["PYTHONPATH"] = str(LENS_STANDIN)
    if agent:
        env["GYM_TELEMETRY"] = "1"
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"
    out = subprocess.run(
        [str(python), "-c", _PROBE],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    if agent:
        assert probe["gym_handle"] is False
        assert probe["meter_provider"] != "MeterProvider"  # no SDK meter: nothing exported
        assert len(probe["span_threads"]) == 1, probe
    else:
        assert probe["gym_handle"] is True
        assert probe["meter_provider"] == "MeterProvider"
        assert len(probe["span_threads"]) == 1, probe
    assert probe["tracer_provider"].startswith("opentelemetry.sdk.trace")
