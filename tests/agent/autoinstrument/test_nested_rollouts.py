"""Only a recorded outer ``gym.rollout`` span makes an inner one nested (issue 19.4).

Two real uvicorn servers behind the SERVER layer (``ServerSpanMiddleware``): a relay
whose ``/run`` calls an inner server's ``/run`` with the hop headers Gym's
``server_utils.request`` gets from ``inject_trace_context``. The inner span is marked
``nemo.gym.rollout.nested=true`` only when the relay recorded a rollout span of its
own; a rollout id that merely arrived (rollout off on the relay, a client sending the
baggage) leaves it the outermost rollout, so it keeps its duration point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import httpx
import pytest
from fastapi import FastAPI
from gym_telemetry import endpoints, fastapi_telemetry_off, rollout_correlation, span_groups
from gym_telemetry.autoinstrument import routes, server_span
from gym_telemetry.autoinstrument.gym_primitives import inject_trace_context
from gym_telemetry.autoinstrument.identity import RUNTIME
from gym_telemetry.autoinstrument.propagation import (
    OUTER_BAGGAGE_MEMBER,
    inject,
    outer_rollout_in_baggage,
)
from gym_telemetry.autoinstrument.server_span import ServerSpanMiddleware
from opentelemetry.sdk.trace import ReadableSpan
from pydantic import BaseModel

from tests.agent.conftest import Spans

ROLLOUT_BAGGAGE = {"baggage": "nemo.gym.rollout.id=task-7"}


class RunBody(BaseModel):
    task: str


@pytest.fixture
def active(spans: Spans) -> Iterator[Spans]:
    """The SERVER layer active (as in a started Gym server), rollout + server groups on."""
    was = RUNTIME.active
    RUNTIME.active = True
    span_groups.set_enabled({semconv.GROUP_ROLLOUT, semconv.GROUP_SERVER})
    server_span._RECORDER.tracer = None  # resolve the recorder against this provider
    yield spans
    RUNTIME.active = was
    server_span._RECORDER.tracer = None


def _inner_app(sync: bool) -> Any:
    """An agent-like server whose ``/run`` (sync or async) returns its rollout id."""
    attributes = {semconv.SERVER_NAME: "inner"}

    def run_sync(body: RunBody) -> dict[str, Any]:
        return {"task": body.task, "rollout": rollout_correlation.current_rollout_id()}

    async def run_async(body: RunBody) -> dict[str, Any]:
        return run_sync(body)

    app = FastAPI(**fastapi_telemetry_off())
    handler: Callable[..., Any] = run_sync if sync else run_async
    app.post("/run")(routes.traced_rollout_endpoint(handler, attributes))
    return ServerSpanMiddleware(app)


def _relay_app(inner_url: str, rollout_span: bool) -> Any:
    """An environment-like relay: its ``/run`` forwards to the inner ``/run`` with Gym's hop
    headers. ``rollout_span=False``: its ``/run`` records no rollout (group off for it)."""

    async def run(body: RunBody) -> Any:
        headers: dict[str, str] = {}
        inject_trace_context(headers)
        async with httpx.AsyncClient() as client:
            response = await client.post(
                inner_url + "/run", json=body.model_dump(), headers=headers
            )
            return response.json()

    app = FastAPI(**fastapi_telemetry_off())
    attributes = {semconv.SERVER_NAME: "relay"}
    app.post("/run")(routes.traced_rollout_endpoint(run, attributes) if rollout_span else run)
    return ServerSpanMiddleware(app)


def _rollouts(spans: Spans) -> dict[str, ReadableSpan]:
    found = spans.named(semconv.SPAN_ROLLOUT)
    by_server = {str((s.attributes or {})[semconv.SERVER_NAME]): s for s in found}
    assert len(by_server) == len(found), found
    return by_server


def _nested(span: ReadableSpan) -> bool:
    return (span.attributes or {}).get(semconv.ROLLOUT_NESTED) is True


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_relayed_run_inside_a_recorded_rollout_is_nested(
    active: Spans, serve: Any, sync: bool
) -> None:
    inner = serve(_inner_app(sync))
    relay = serve(_relay_app(inner.url, rollout_span=True))
    response = httpx.post(relay.url + "/run", json={"task": "t"}, headers=ROLLOUT_BAGGAGE)
    assert response.json() == {"task": "t", "rollout": "task-7"}
    rollouts = _rollouts(active)
    assert set(rollouts) == {"relay", "inner"}
    assert not _nested(rollouts["relay"])
    assert _nested(rollouts["inner"])  # one duration point: the relay's
    assert rollouts["inner"].context.trace_id == rollouts["relay"].context.trace_id  # type: ignore[union-attr]
    for span in rollouts.values():
        assert (span.attributes or {})[semconv.ROLLOUT_ID] == "task-7"


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_relay_without_a_rollout_span_leaves_the_inner_run_outermost(
    active: Spans, serve: Any, sync: bool
) -> None:
    """(a) rollout off on the relay: the rollout id still travels, the marker does not."""
    inner = serve(_inner_app(sync))
    relay = serve(_relay_app(inner.url, rollout_span=False))
    response = httpx.post(relay.url + "/run", json={"task": "t"}, headers=ROLLOUT_BAGGAGE)
    assert response.json() == {"task": "t", "rollout": "task-7"}
    rollouts = _rollouts(active)
    assert set(rollouts) == {"inner"}
    assert not _nested(rollouts["inner"])
    assert (rollouts["inner"].attributes or {})[semconv.ROLLOUT_ID] == "task-7"


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize(
    "headers",
    [ROLLOUT_BAGGAGE, {"baggage": "nemo.gym.rollout.outer=0,nemo.gym.rollout.id=task-7"}],
    ids=["rollout-id", "outer-not-1"],
)
def test_client_rollout_baggage_does_not_make_a_top_level_run_nested(
    active: Spans, serve: Any, sync: bool, headers: dict[str, str]
) -> None:
    """(b) a client sending rollout baggage to a top-level ``/run`` keeps its point."""
    inner = serve(_inner_app(sync))
    response = httpx.post(inner.url + "/run", json={"task": "t"}, headers=headers)
    assert response.json() == {"task": "t", "rollout": "task-7"}
    (span,) = _rollouts(active).values()
    assert not _nested(span)


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_outer_marker_reaches_sync_and_async_runs(active: Spans, serve: Any, sync: bool) -> None:
    """(c) the cross-process mark is the SERVER layer's, so sync handlers get it too."""
    inner = serve(_inner_app(sync))
    headers = {"baggage": f"nemo.gym.rollout.id=task-7,{OUTER_BAGGAGE_MEMBER}"}
    httpx.post(inner.url + "/run", json={"task": "t"}, headers=headers).raise_for_status()
    (span,) = _rollouts(active).values()
    assert _nested(span)


def test_same_process_run_inside_a_recorded_rollout_is_nested(active: Spans) -> None:
    def inner() -> str:
        return "inner"

    traced_inner = endpoints.traced_rollout_endpoint(inner, {semconv.SERVER_NAME: "inner"})

    def outer() -> str:
        return str(traced_inner())

    traced_outer = endpoints.traced_rollout_endpoint(outer, {semconv.SERVER_NAME: "relay"})
    assert traced_outer() == "inner"
    rollouts = _rollouts(active)
    assert not _nested(rollouts["relay"]) and _nested(rollouts["inner"])
    assert not rollout_correlation.ENCLOSING_ROLLOUT.get()  # reset after the outer span ended


def test_inject_writes_the_outer_marker_only_inside_a_recorded_rollout(active: Spans) -> None:
    seen: list[dict[str, str]] = []

    def hop() -> None:
        headers = {"baggage": "k=v"}
        inject(headers)
        seen.append(headers)

    hop()  # no rollout around it
    endpoints.traced_rollout_endpoint(hop)()  # recorded rollout
    span_groups.set_enabled({semconv.GROUP_SERVER})
    endpoints.traced_rollout_endpoint(hop)()  # rollout group off: no span, no marker
    assert [h["baggage"] for h in seen] == ["k=v", f"k=v,{OUTER_BAGGAGE_MEMBER}", "k=v"]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (b"nemo.gym.rollout.outer=1", True),
        (b"a=b, nemo.gym.rollout.outer = 1;p=q ,nemo.gym.rollout.id=x", True),
        (b"nemo.gym.rollout.outer=0", False),
        (b"nemo.gym.rollout.outer", False),
        (b"nemo.gym.rollout.id=1", False),
        (b"\xff=1,nemo.gym.rollout.outer=1", True),
        (b"\xff nemo.gym.rollout.outer=1", False),
        (b"", False),
    ],
)
def test_outer_rollout_in_baggage(header: bytes, expected: bool) -> None:
    assert outer_rollout_in_baggage(header) is expected
