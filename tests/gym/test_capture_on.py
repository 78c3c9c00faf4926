"""With Gym's own rollout capture on (``observability_enabled: true``) the trace is the same.

Gym then carries the rollout id itself, as a ``/ng-rollout/<id>/`` URL prefix on the
agent's calls, and its ``RolloutContextMiddleware`` strips it on the receiving side.
The agent's OTLP goes straight to a recording sink here (the sidecar path is covered by
``test_rollout_traces``).
"""

from __future__ import annotations

from pathlib import Path

import gym_telemetry_semconv as semconv
import pytest

from testkit.gym_stack import GymStack, load_configs, post_json, run_body
from testkit.sink import RecordingSink
from tests.gym.traces import SERVER, by_rollout, traces

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

NAMES = ["policy_model", "example_single_tool_call", "example_single_tool_call_simple_agent"]


def test_capture_on_one_trace_per_rollout(gym_python: Path, tmp_path: Path) -> None:
    config = load_configs("stack.yaml")
    config["observability_enabled"] = True
    config["model_call_capture_dir"] = str(tmp_path / "capture")
    with RecordingSink() as sink:
        env = {
            "GYM_TELEMETRY": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "GYM_TELEMETRY_SPAN_GROUPS": "per_rollout",
            "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        with GymStack(gym_python, config, NAMES, env, tmp_path) as stack:
            url = stack.url("example_single_tool_call_simple_agent") + "/run"
            ids = [f"{30 + i}-1" for i in range(3)]
            for i in range(3):
                status, body = post_json(url, run_body(30 + i, 1))
                assert status == 200 and body["reward"] == 1.0, body
            assert sink.wait_for(
                lambda: sum(s.span.name == semconv.SPAN_VERIFY for s in sink.spans()) >= 3, 30
            )
        spans = sink.spans()
    grouped = by_rollout(spans)
    assert set(grouped) == set(ids)
    all_traces = traces(spans)
    for rollout_id in ids:
        [trace_id] = grouped[rollout_id]
        trace = all_traces[trace_id]
        assert trace.rollout_ids() == {rollout_id}
        assert trace.orphans() == [] and len(trace.roots()) == 1
        names = sorted(s.span.name for s in trace.spans if s.span.kind == SERVER)
        # prefixed calls are named after the route Gym dispatched them to
        assert names == sorted(
            [
                "POST /run",
                "POST /ng-rollout/{rollout_id}/v1/responses",  # the agent's own route
                "POST /seed_session",
                "POST /v1/responses",
                "POST /v1/responses",
                "POST /get_weather",
                "POST /verify",
            ]
        )
        # each hop's CLIENT span is named "{method} {url.template}" (HTTP semconv), the
        # rollout prefix templated; its route is the one the server dispatched to
        prefixed = 0
        for span in trace.spans:
            parent = trace.parent(span)
            if span.span.kind != SERVER or parent is None:
                continue
            template = parent.attributes[semconv.URL_TEMPLATE]
            assert parent.span.name == f"POST {template}", parent.span.name
            route = template.removeprefix("/ng-rollout/{rollout_id}")
            prefixed += route != template
            assert span.span.name.endswith(route), (span.span.name, template)
        assert prefixed >= 3, rollout_id  # the model calls and the agent's own route
        [verify] = trace.named(semconv.SPAN_VERIFY)
        assert verify.attributes[semconv.VERIFY_SUCCEEDED] is True
