"""issue 15.1: the headline metrics with no span-group configuration at all.

Real NeMo Gym 0.7.0 servers (stub model, ``example_single_tool_call`` and its
``simple_agent``), auto-instrumented with only ``GYM_TELEMETRY=1`` and the sidecar's
addresses in their environment: no ``GYM_TELEMETRY_SPAN_GROUPS``, and a ``gym-sidecar``
with no ``span_groups`` section. Rollouts run; then every derived metric
(``gym.rollout.duration_ms`` and all of ``gym.verify.*``) reaches the backend, and no
``gym.verify`` span does (verify is in ``metrics`` mode by default).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gym_telemetry_semconv as semconv
import pytest

from testkit.gym_stack import GymStack, load_configs, post_json, run_body
from testkit.sink import RecordedSpan, RecordingSink
from tests.sidecar.metrics.collect import points
from tests.support.sidecar_proc import SidecarProcess

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1200)]

MODEL = "policy_model"
RESOURCES = "example_single_tool_call"
AGENT = "example_single_tool_call_simple_agent"
ROLLOUTS = 4
DERIVED = (
    semconv.METRIC_ROLLOUT_DURATION,
    semconv.METRIC_VERIFY_DURATION,
    semconv.METRIC_VERIFY_COUNT,
    semconv.METRIC_VERIFY_SUCCESS_RATE,
)


@dataclass
class Run:
    results: list[tuple[int, Any]]
    spans: list[RecordedSpan]
    metrics: dict[str, list[Any]]
    span_groups: dict[str, Any]


@pytest.fixture(scope="module")
def run(gym_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("gym-default-groups")
    saved = os.environ.pop("GYM_TELEMETRY_SPAN_GROUPS", None)  # the servers inherit it
    try:
        with RecordingSink() as sink:
            # No span_groups section: only the metrics interval is shortened.
            sidecar = SidecarProcess(
                backend=sink.endpoint, config={"metrics": {"interval_s": 1}}, log_dir=workdir
            ).start()
            env = {
                "GYM_TELEMETRY": "1",
                "OTEL_EXPORTER_OTLP_ENDPOINT": sidecar.grpc_endpoint,
                # where the sidecar is (its admin port is a free one), not what it says
                "GYM_TELEMETRY_SIDECAR_ADMIN_URL": sidecar.admin_url,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            }
            stack = GymStack(
                gym_python, load_configs("stack.yaml"), [MODEL, RESOURCES, AGENT], env, workdir
            )
            try:
                answer = _get_json(sidecar.admin_url + semconv.SPAN_GROUPS_PATH)
                with stack:
                    url = stack.url(AGENT) + "/run"
                    results = [post_json(url, run_body(t, 0)) for t in range(ROLLOUTS)]
                    sink.wait_for(lambda: _rollout_spans(sink) >= ROLLOUTS, 60)
            finally:
                sidecar.stop()  # SIGTERM flushes the last interval's derived metrics
            metrics: dict[str, list[Any]] = {}
            for req in sink.metric_requests():
                for name in DERIVED:
                    metrics.setdefault(name, []).extend(points(req, name))
            yield Run(results, sink.spans(), metrics, answer)
    finally:
        if saved is not None:
            os.environ["GYM_TELEMETRY_SPAN_GROUPS"] = saved


def _get_json(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, json.loads(response.read())


def _rollout_spans(sink: RecordingSink) -> int:
    return sum(1 for s in sink.spans() if s.span.name == semconv.SPAN_ROLLOUT)


def test_rollouts_succeeded(run: Run) -> None:
    assert [status for status, _ in run.results] == [200] * ROLLOUTS
    assert all(body["reward"] == 1.0 for _, body in run.results)


def test_default_answer_has_verify_in_metrics_mode(run: Run) -> None:
    status, doc = run.span_groups
    assert status == 200
    assert doc["modes"]["verify"] == "metrics"
    assert "verify" in doc["enabled"] and "verify" not in doc["forwarded"]


def test_every_derived_metric_is_exported(run: Run) -> None:
    for name in DERIVED:
        assert run.metrics.get(name), f"{name} never reached the backend"
    latest_counts: dict[tuple[Any, ...], int] = {}
    for p in run.metrics[semconv.METRIC_VERIFY_COUNT]:
        key = (p.resource.get(semconv.SERVICE_NAME), tuple(sorted(p.attrs.items())))
        latest_counts[key] = max(latest_counts.get(key, 0), p.point.as_int)
    assert sum(latest_counts.values()) == ROLLOUTS
    rollouts = max(p.point.count for p in run.metrics[semconv.METRIC_ROLLOUT_DURATION])
    assert rollouts == ROLLOUTS
    rates = [p.point.as_double for p in run.metrics[semconv.METRIC_VERIFY_SUCCESS_RATE]]
    assert all(0.0 <= r <= 1.0 for r in rates) and rates[-1] == 1.0


def test_no_verify_span_reaches_the_backend(run: Run) -> None:
    names = {s.span.name for s in run.spans}
    assert semconv.SPAN_ROLLOUT in names  # rollout is on by default: forwarded
    assert semconv.SPAN_VERIFY not in names
    assert not [s for s in run.spans if s.scope == semconv.scope_name(semconv.GROUP_VERIFY)]
