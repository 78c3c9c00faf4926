"""One trace across two apps: a rollout handler in app A calls app B over HTTP with W3C
propagation, and app B's spans are children of A's ``gym.rollout`` span."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from fastapi import FastAPI
from gym_telemetry import fastapi_telemetry_off, rollout_correlation, span_groups
from gym_telemetry.asgi import TraceContextMiddleware
from gym_telemetry.endpoints import (
    ROLLOUT_ID_ATTRIBUTE,
    traced_endpoint,
    traced_rollout_endpoint,
    traced_verify_endpoint,
)
from opentelemetry import propagate
from pydantic import BaseModel

from testkit.sink import RecordingSink
from tests.agent.conftest import Spans

ROOT = Path(__file__).resolve().parents[2]


class Answer(BaseModel):
    text: str


def _app_b() -> FastAPI:
    async def verify(body: Answer) -> dict[str, float]:
        return {"reward": 0.0}

    async def tool(body: Answer) -> dict[str, str]:
        return {"echo": body.text}

    app = FastAPI(**fastapi_telemetry_off())
    app.post("/verify")(traced_verify_endpoint(verify, {"nemo.gym.server.name": "b"}))
    app.post("/tool")(traced_endpoint("sandbox", "gym.tool", tool))
    app.add_middleware(TraceContextMiddleware)
    return app


def _app_a(b_url: str, client_kind: str) -> FastAPI:
    async def call_b(path: str, body: dict[str, Any]) -> Any:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        if client_kind == "httpx":
            async with httpx.AsyncClient() as client:
                r = await client.post(b_url + path, json=body, headers=headers)
                return r.json()
        async with (  # Gym's hops use aiohttp
            aiohttp.ClientSession() as session,
            session.post(b_url + path, json=body, headers=headers) as resp,
        ):
            return await resp.json()

    async def run(body: Answer) -> dict[str, Any]:
        with rollout_correlation.rollout_context("r-42"):
            tool = await call_b("/tool", {"text": body.text})
            verdict = await call_b("/verify", {"text": body.text})
        return {"tool": tool, "verdict": verdict}

    app = FastAPI(**fastapi_telemetry_off())
    app.post("/run")(traced_rollout_endpoint(run, {"nemo.gym.server.name": "a"}))
    return app


def _check_one_trace(spans: Spans) -> None:
    rollout = spans.one("gym.rollout")
    verify = spans.one("gym.verify")
    tool = spans.one("gym.tool")
    assert rollout.parent is None
    for child in (verify, tool):
        assert child.context.trace_id == rollout.context.trace_id  # type: ignore[union-attr]
        assert child.parent is not None and child.parent.is_remote
        assert child.parent.span_id == rollout.context.span_id  # type: ignore[union-attr]
    assert verify.attributes["nemo.gym.server.name"] == "b"  # type: ignore[index]
    assert rollout.attributes["nemo.gym.server.name"] == "a"  # type: ignore[index]


def test_app_b_spans_are_children_of_a_rollout_span_httpx(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"rollout", "verify", "sandbox"})
    b = serve(_app_b())
    a = serve(_app_a(b.url, "httpx"))
    r = httpx.post(a.url + "/run", json={"text": "hi"})
    assert r.json() == {"tool": {"echo": "hi"}, "verdict": {"reward": 0.0}}
    _check_one_trace(spans)


def test_app_b_spans_are_children_of_a_rollout_span_aiohttp(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"rollout", "verify", "sandbox"})
    b = serve(_app_b())
    a = serve(_app_a(b.url, "aiohttp"))
    assert httpx.post(a.url + "/run", json={"text": "hi"}).is_success
    _check_one_trace(spans)


def test_without_rollout_span_b_spans_start_their_own_trace(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"verify", "sandbox"})  # "rollout" off: A records nothing
    b = serve(_app_b())
    a = serve(_app_a(b.url, "httpx"))
    assert httpx.post(a.url + "/run", json={"text": "hi"}).is_success
    assert spans.named("gym.rollout") == []
    verify = spans.one("gym.verify")
    assert verify.parent is None
    # The rollout id travels separately (Gym puts it in the URL); here B never saw it.
    assert ROLLOUT_ID_ATTRIBUTE not in (verify.attributes or {})


def _start_child(role: str, sink_endpoint: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GYM_TELEMETRY_"))}
    env.update({"GYM_TELEMETRY_POLL_INTERVAL_S": "0", "PYTHONPATH": str(ROOT)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.agent.serve_child", role, sink_endpoint, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), line
    return proc, f"http://127.0.0.1:{line.split()[1]}"


def test_one_trace_across_two_server_processes_through_otlp() -> None:
    """Two processes, each with its own init_telemetry, exporting to a real OTLP backend."""
    with RecordingSink() as sink:
        b, b_url = _start_child("b", sink.endpoint)
        try:
            a, a_url = _start_child("a", sink.endpoint, b_url)
            try:
                for i in range(3):
                    r = httpx.post(a_url + "/run", json={"task": f"t-{i}"}, timeout=20)
                    assert r.json() == {"verdict": {"reward": 0.0}}
            finally:
                a.send_signal(signal.SIGTERM)
                a.wait(20)
        finally:
            b.send_signal(signal.SIGTERM)
            b.wait(20)
        assert sink.wait_spans(6)
        recorded = sink.spans()
    rollouts = {r.span.trace_id: r for r in recorded if r.span.name == "gym.rollout"}
    verifies = [r for r in recorded if r.span.name == "gym.verify"]
    assert len(rollouts) == 3 and len(verifies) == 3
    for v in verifies:
        parent = rollouts[v.span.trace_id]  # same trace as one of A's rollouts
        assert v.span.parent_span_id == parent.span.span_id
        assert v.resource["service.name"] == "server-b"
        assert v.resource["nemo.gym.server.type"] == "resources"
        assert parent.resource["service.name"] == "server-a"
        assert v.scope == "gym_telemetry.verify" and parent.scope == "gym_telemetry.rollout"
        assert v.attributes["succeeded"] is True
    assert {r.attributes["nemo.gym.rollout.id"] for r in rollouts.values()} == {
        "t-0",
        "t-1",
        "t-2",
    }
