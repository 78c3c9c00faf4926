"""init_telemetry / shutdown_telemetry: real OTLP/gRPC export to a recording sink, a
sidecar that is down or hangs, environment precedence, an existing provider."""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gym_telemetry
import httpx
import pytest
from fastapi import FastAPI
from gym_telemetry import endpoints, provider, span_groups

from testkit.sink import RecordingSink
from tests.agent.conftest import Spans
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _child(
    scenario: str, endpoint: str | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    child_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_TELEMETRY_"))
    }
    child_env.update(
        {
            "GYM_TELEMETRY_POLL_INTERVAL_S": "0",
            "PYTHONPATH": str(ROOT),
            # What blocking on the exporter would cost: far above the bounds below.
            "OTEL_EXPORTER_OTLP_TIMEOUT": str(EXPORT_TIMEOUT_S),
        }
    )
    child_env.update(env or {})
    args = [sys.executable, "-m", "tests.agent.provider_child", scenario]
    if endpoint:
        args.append(endpoint)
    proc = subprocess.run(
        args, cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# Bounds below separate "waited on the network" from "did not", not fast from slow: the
# children's exporter timeout is 60 s (OTEL_EXPORTER_OTLP_TIMEOUT) and the deadlines they
# must not wait for are 60 s, so anything that blocked would take about a minute, while
# not blocking takes well under a second even on a loaded machine: 30 s sits between.
EXPORT_TIMEOUT_S = 60
NOT_BLOCKED_S = 30.0
#: Shutdown deadline given to the child where the test checks that it did not wait for it.
LONG_DEADLINE_S = 60.0


def _interruptible_backoff() -> bool:
    from opentelemetry.exporter.otlp.proto.grpc import exporter as grpc_exporter

    return "_shutdown_in_progress" in inspect.getsource(grpc_exporter)


@pytest.fixture
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


def test_spans_reach_a_real_otlp_grpc_backend(sink: RecordingSink) -> None:
    out = _child("sink", sink.endpoint)
    assert out["init"] is True and out["init_again"] is True
    assert out["statuses"] == [200] and out["crashed_status"] == 500
    # the default spec: its preset, plus the derived groups in metrics mode (verify, and
    # model_call since issue 41)
    assert out["groups"] == sorted(
        {"job", "server", "http_client", "rollout", "verify", "model_call"}
    )
    assert out["shutdown"] is True  # flushed within the deadline
    assert out["shutdown_again"] is True
    recorded = sink.spans()
    assert len(recorded) == 41 == out["stats"]["exported"]  # 20 x (verify + rollout) + 1
    for rec in recorded:  # the second init_telemetry (server_name="other") changed nothing
        assert rec.resource["service.name"] == "weather"
        assert rec.resource["nemo.gym.server.name"] == "weather"
        assert rec.resource["nemo.gym.server.type"] == "resources"
        assert rec.resource["deployment.environment"] == "test"
    verify = [r for r in recorded if r.span.name == "gym.verify"]
    rollout = [r for r in recorded if r.span.name == "gym.rollout"]
    assert {r.scope for r in verify} == {"gym_telemetry.verify"}
    assert {r.scope for r in rollout} == {"gym_telemetry.rollout"}
    assert sorted(r.attributes["succeeded"] for r in verify).count(False) == 1
    assert {r.attributes["nemo.gym.rollout.id"] for r in rollout} == {f"r-{i}" for i in range(20)}
    # FastAPI's own telemetry was switched off on the app: only the wrappers' spans.
    assert {r.span.name for r in recorded} == {"gym.verify", "gym.rollout"}


def test_environment_configures_endpoint_service_and_groups(sink: RecordingSink) -> None:
    out = _child(
        "env",
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{sink.endpoint}",
            "OTEL_SERVICE_NAME": "svc-from-env",
            "OTEL_RESOURCE_ATTRIBUTES": "team=rl",
            "GYM_TELEMETRY_SPAN_GROUPS": "verify,-rollout",
            "GYM_TELEMETRY_SERVER_NAME": "math",
            "GYM_TELEMETRY_SERVER_TYPE": "resources",
        },
    )
    # verify selected; the groups that feed derived metrics and that the spec leaves
    # unselected are in metrics mode (model_call, http_client: issue 41)
    assert out["groups"] == ["http_client", "model_call", "verify"]
    assert out["shutdown"] is True
    recorded = sink.spans()
    assert {r.span.name for r in recorded} == {"gym.verify"}  # rollout group is off
    res = recorded[0].resource
    assert res["service.name"] == "svc-from-env"
    assert res["team"] == "rl"
    assert res["nemo.gym.server.name"] == "math"


def test_sdk_disabled_is_a_no_op() -> None:
    out = _child("sink", "127.0.0.1:1", env={"OTEL_SDK_DISABLED": "true"})
    assert out["init"] is False
    assert out["statuses"] == [200]


def test_no_sidecar_listening_handlers_answer_and_nothing_blocks() -> None:
    port = free_port()  # nothing listens here
    out = _child(
        "sink",
        f"127.0.0.1:{port}",
        env={"CHILD_REQUESTS": "50", "CHILD_DEADLINE_S": str(LONG_DEADLINE_S)},
    )
    assert out["init"] is True
    assert out["init_s"] < NOT_BLOCKED_S
    assert out["statuses"] == [200] and out["crashed_status"] == 500
    assert out["max_latency_s"] < NOT_BLOCKED_S  # no request waited on the exporter
    assert out["shutdown"] is False  # nothing could be delivered ...
    # ... and shutdown did not wait for the deadline (10 s), where the exporter's retry
    # back-off can be interrupted (SDK 1.27's cannot: there it ends at the deadline).
    assert out["shutdown_s"] < (
        NOT_BLOCKED_S if _interruptible_backoff() else LONG_DEADLINE_S + 0.5
    )
    assert out["stats"]["exported"] == 0


def test_sidecar_started_later_receives_the_spans() -> None:
    port = free_port()
    out = _child(
        "late_sidecar",
        f"127.0.0.1:{port}",
        env={"CHILD_REQUESTS": "5", "OTEL_BSP_SCHEDULE_DELAY": "100", "CHILD_DEADLINE_S": "10"},
    )
    assert out["statuses"] == [200]
    assert out["max_latency_s"] < NOT_BLOCKED_S
    # 5 x (verify + rollout) + 1 crashed verify before the sink, 5 verify after it. The
    # batch that failed while nothing listened is retried until the sink is there.
    assert out["sink_spans"] == 16
    assert out["shutdown"] is True


def test_hanging_sidecar_cannot_hold_shutdown_past_its_deadline() -> None:
    # A socket that listens but never accepts: TCP connects, gRPC never gets an answer.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(1)
        port = hung.getsockname()[1]
        out = _child(
            "sink", f"127.0.0.1:{port}", env={"CHILD_REQUESTS": "5", "CHILD_DEADLINE_S": "1"}
        )
    assert out["statuses"] == [200]
    assert out["max_latency_s"] < NOT_BLOCKED_S
    assert out["shutdown"] is False
    # Deadline 1 s; without it the export in flight would hold shutdown for 60 s.
    assert out["shutdown_s"] < NOT_BLOCKED_S


def test_queue_is_bounded_and_drops_are_counted() -> None:
    out = _child(
        "sink",
        f"127.0.0.1:{free_port()}",
        env={
            "OTEL_BSP_MAX_QUEUE_SIZE": "100",
            "CHILD_REQUESTS": "2",
            "CHILD_BURST": "2000",
            "CHILD_DEADLINE_S": str(LONG_DEADLINE_S),
        },
    )
    assert out["statuses"] == [200]
    dropped = out["stats_before_shutdown"]["dropped"]
    assert dropped >= 2000 - 100 - 512  # at most one batch can be with the exporter
    assert out["shutdown_s"] < (
        NOT_BLOCKED_S if _interruptible_backoff() else LONG_DEADLINE_S + 0.5
    )


def test_existing_provider_is_reused_and_gets_the_exporter(
    spans: Spans, sink: RecordingSink, monkeypatch: pytest.MonkeyPatch, serve: Any
) -> None:
    """In this process the test fixtures installed an SDK provider first."""
    monkeypatch.setenv("GYM_TELEMETRY_POLL_INTERVAL_S", "0")
    assert gym_telemetry.init_telemetry(
        server_name="reuse", endpoint=sink.endpoint, span_groups="verify,-rollout"
    )
    try:
        assert provider.is_active()
        assert span_groups.enabled_groups() == {"verify", "model_call", "http_client"}

        async def handler() -> dict[str, int]:
            return {"ok": 1}

        app = FastAPI(**gym_telemetry.fastapi_telemetry_off())
        app.get("/v")(endpoints.traced_verify_endpoint(handler))
        served = serve(app)
        for _ in range(3):
            assert httpx.get(served.url + "/v").json() == {"ok": 1}
        assert len(spans.named("gym.verify")) == 3  # the existing processor still sees them
    finally:
        t0 = time.monotonic()
        assert gym_telemetry.shutdown_telemetry(5.0) is True
        # Within its deadline (plus scheduling slack on a loaded machine).
        assert time.monotonic() - t0 < 6.0
    assert [r.span.name for r in sink.spans()] == ["gym.verify"] * 3
    assert not provider.is_active()
    # After shutdown the processor stays installed with nothing behind it.
    assert gym_telemetry.shutdown_telemetry() is True


def test_fastapi_telemetry_off_kwargs() -> None:
    kwargs = gym_telemetry.fastapi_telemetry_off()
    FastAPI(**kwargs)  # accepted by the installed FastAPI
    if kwargs:
        assert kwargs["telemetry"]["tracing"] is False
