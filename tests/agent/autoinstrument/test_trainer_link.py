"""An outermost ``/run`` under a trainer's ``traceparent``: a new trace with a span link
(``link``, the default) or the trainer's trace continued (``continue``); other routes and
relayed ``/run`` hops (outer-rollout baggage) always continue the caller's trace."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import span_groups
from gym_telemetry.autoinstrument import server_span
from gym_telemetry.autoinstrument.identity import RUNTIME
from gym_telemetry.autoinstrument.server_span import ServerSpanMiddleware
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from tests.agent.conftest import Spans

TRAINER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
TRAINER_SPAN = 0x00F067AA0BA902B7
TRACEPARENT = (b"traceparent", f"00-{TRAINER_TRACE:032x}-{TRAINER_SPAN:016x}-01".encode())
OUTER = (b"baggage", b"nemo.gym.rollout.outer=1")


async def _app(scope: Any, receive: Any, send: Any) -> None:
    with trace.get_tracer("child.test").start_as_current_span("child"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def _drive(path: str, headers: list[tuple[bytes, bytes]]) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    asyncio.run(ServerSpanMiddleware(_app)(scope, receive, send))


@pytest.fixture(params=["lean", "sdk"])
def active(spans: Spans, monkeypatch: pytest.MonkeyPatch, request: Any) -> Iterator[Spans]:
    if request.param == "sdk":
        monkeypatch.setenv(env_vars.GYM_TELEMETRY_RECORDER, "sdk")
    was = RUNTIME.active
    RUNTIME.active = True
    span_groups.set_enabled({semconv.GROUP_SERVER})
    server_span._RECORDER.tracer = None
    server_span.TRAINER_CONTEXT.link = None
    yield spans
    RUNTIME.active = was
    server_span._RECORDER.tracer = None
    server_span.TRAINER_CONTEXT.link = None


def _server(spans: Spans) -> ReadableSpan:
    (span,) = [s for s in spans.all() if s.kind is SpanKind.SERVER]
    return span


def _child(spans: Spans) -> ReadableSpan:
    (span,) = [s for s in spans.exporter.get_finished_spans() if s.name == "child"]
    return span


@pytest.mark.parametrize("path", ["/run", "/ng-rollout/7-0/run"])
def test_link_mode_starts_a_new_trace_linked_to_the_trainer(active: Spans, path: str) -> None:
    _drive(path, [TRACEPARENT])
    span = _server(active)
    assert span.parent is None
    assert span.context is not None and span.context.trace_id != TRAINER_TRACE
    [link] = span.links
    assert (link.context.trace_id, link.context.span_id) == (TRAINER_TRACE, TRAINER_SPAN)
    # what the handler records hangs off the new root
    child = _child(active)
    assert child.parent is not None and child.parent.span_id == span.context.span_id
    assert child.context is not None and child.context.trace_id == span.context.trace_id


def test_continue_mode_keeps_the_trainer_trace(
    active: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_vars.GYM_TELEMETRY_TRAINER_CONTEXT, "continue")
    _drive("/run", [TRACEPARENT])
    span = _server(active)
    assert span.parent is not None and span.parent.span_id == TRAINER_SPAN
    assert span.context is not None and span.context.trace_id == TRAINER_TRACE
    assert not span.links


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/verify", [TRACEPARENT]), ("/run", [TRACEPARENT, OUTER]), ("/v1/run/x", [TRACEPARENT])],
    ids=["other-route", "relayed-run", "not-run"],
)
def test_other_requests_continue_the_caller(
    active: Spans, path: str, headers: list[tuple[bytes, bytes]]
) -> None:
    _drive(path, headers)
    span = _server(active)
    assert span.parent is not None and span.parent.span_id == TRAINER_SPAN
    assert not span.links


def test_without_traceparent_nothing_changes(active: Spans) -> None:
    _drive("/run", [])
    span = _server(active)
    assert span.parent is None and not span.links


def test_unknown_mode_warns_and_links(
    active: Spans, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(env_vars.GYM_TELEMETRY_TRAINER_CONTEXT, "nest")
    _drive("/run", [TRACEPARENT])
    assert len(_server(active).links) == 1
    assert "GYM_TELEMETRY_TRAINER_CONTEXT" in caplog.text
