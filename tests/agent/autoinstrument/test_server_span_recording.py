"""The SERVER span layer records through the lean path (``LeanRecorder`` with kind
SERVER and the caller's remote parent) and exports the same span as through the SDK's
``Tracer.start_span`` (``GYM_TELEMETRY_RECORDER=sdk``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import span_groups
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.autoinstrument import server_span
from gym_telemetry.autoinstrument.identity import RUNTIME
from gym_telemetry.autoinstrument.server_span import ServerSpanMiddleware
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from tests.agent.conftest import Spans

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
HEADERS = [
    (b"traceparent", f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01".encode()),
    (b"baggage", b"nemo.gym.rollout.id=12-3"),
]


class _Route:
    path = "/verify"


def _app(status: int, seen: list[Any], fail: bool = False) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = _Route
        current = trace.get_current_span()
        seen.append(current)
        with trace.get_tracer("child.test").start_as_current_span("child"):
            pass
        if fail:
            raise RuntimeError("handler failed")
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def _drive(app: Any) -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        return None

    scope = {"type": "http", "method": "POST", "path": "/verify", "headers": HEADERS}
    asyncio.run(ServerSpanMiddleware(app)(scope, receive, send))


@pytest.fixture
def active(spans: Spans) -> Iterator[Spans]:
    was = RUNTIME.active
    RUNTIME.active = True
    span_groups.set_enabled({semconv.GROUP_SERVER})
    server_span._RECORDER.tracer = None  # resolve the recorder against this provider
    yield spans
    RUNTIME.active = was
    server_span._RECORDER.tracer = None


def _server_span(spans: Spans) -> ReadableSpan:
    (span,) = [s for s in spans.all() if s.kind is SpanKind.SERVER]
    return span


def _fields(span: ReadableSpan) -> dict[str, Any]:
    assert span.parent is not None
    return {
        "name": span.name,
        "kind": span.kind,
        "trace_id": span.context.trace_id,  # type: ignore[union-attr]
        "parent": (span.parent.span_id, span.parent.is_remote),
        "attributes": dict(span.attributes or {}),
        "status": (span.status.status_code, span.status.description),
        "scope": span.instrumentation_scope.name if span.instrumentation_scope else None,
    }


@pytest.mark.parametrize(
    ("status", "fail", "code"),
    [(200, False, StatusCode.UNSET), (503, False, StatusCode.ERROR), (0, True, StatusCode.ERROR)],
    ids=["ok", "5xx", "exception"],
)
def test_server_span_is_lean_and_matches_the_sdk_path(
    active: Spans, monkeypatch: pytest.MonkeyPatch, status: int, fail: bool, code: StatusCode
) -> None:
    results = {}
    for path in ("lean", "sdk"):
        active.clear()
        server_span._RECORDER.tracer = None
        if path == "sdk":
            monkeypatch.setenv(env_vars.GYM_TELEMETRY_RECORDER, "sdk")
        seen: list[Any] = []
        if fail:
            with pytest.raises(RuntimeError):
                _drive(_app(status, seen, fail=True))
        else:
            _drive(_app(status, seen))
        span = _server_span(active)
        assert (type(seen[0]) is LeanSpan) is (path == "lean")
        (child,) = [s for s in active.exporter.get_finished_spans() if s.name == "child"]
        assert child.parent is not None
        assert child.parent.span_id == span.context.span_id  # type: ignore[union-attr]
        results[path] = _fields(span)
    lean = results["lean"]
    assert lean == results["sdk"]
    assert lean["name"] == "POST /verify"
    assert lean["kind"] is SpanKind.SERVER
    assert lean["trace_id"] == TRACE_ID
    assert lean["parent"] == (PARENT_ID, True)
    assert lean["attributes"][semconv.ROLLOUT_ID] == "12-3"
    assert lean["attributes"][server_span.HTTP_ROUTE] == "/verify"
    assert lean["status"][0] is code
    if status:
        assert lean["attributes"][server_span.HTTP_STATUS] == status
