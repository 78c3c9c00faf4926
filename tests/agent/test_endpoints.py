"""The endpoint wrappers on real FastAPI apps served by real uvicorn servers."""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, FastAPI, HTTPException
from gym_telemetry import endpoints, fastapi_telemetry_off, rollout_correlation, span_groups
from gym_telemetry.endpoints import (
    ROLLOUT_ID_ATTRIBUTE,
    traced_endpoint,
    traced_rollout_endpoint,
    traced_verify_endpoint,
)
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

from tests.agent.conftest import Spans

SEED_ROLLOUT_ID_KEY = "nemo.gym.rollout.id"
"""The seed's contract (seeds/endpoints-api.txt), spelled out here on purpose: a test
that expects ``ROLLOUT_ID_ATTRIBUTE`` itself would pass whatever it were renamed to."""


def test_rollout_id_attribute_is_the_seeds_name() -> None:
    assert ROLLOUT_ID_ATTRIBUTE == SEED_ROLLOUT_ID_KEY


class VerifyRequest(BaseModel):
    answer: str
    expected: str


class VerifyResponse(BaseModel):
    reward: float


class RunRequest(BaseModel):
    prompt: str
    temperature: float = 1.0


async def verify(body: VerifyRequest) -> VerifyResponse:
    if body.answer == "boom":
        raise RuntimeError("verifier crashed")
    return VerifyResponse(reward=1.0 if body.answer == body.expected else 0.0)


def _settings() -> dict[str, str]:
    return {"server": "weather"}


async def tool(
    item_id: int, body: RunRequest, settings: Annotated[dict[str, str], Depends(_settings)]
) -> dict[str, Any]:
    """A tool route with a path parameter, a body and a dependency."""
    return {"item_id": item_id, "prompt": body.prompt, "server": settings["server"]}


def _app(wrap: bool) -> FastAPI:
    app = FastAPI(**fastapi_telemetry_off())
    w_verify = traced_verify_endpoint(verify, {"nemo.gym.server.name": "s"}) if wrap else verify
    w_tool = traced_endpoint("sandbox", "gym.tool", tool) if wrap else tool
    app.post("/verify", response_model=VerifyResponse)(w_verify)
    app.post("/items/{item_id}")(w_tool)
    return app


def test_wrapped_route_keeps_validation_and_identical_openapi(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"verify", "sandbox"})
    wrapped, bare = serve(_app(True)), serve(_app(False))
    with httpx.Client() as client:
        for served in (wrapped, bare):
            bad = client.post(served.url + "/verify", json={"answer": 3})
            assert bad.status_code == 422
            locs = {tuple(d["loc"]) for d in bad.json()["detail"]}
            assert locs == {("body", "answer"), ("body", "expected")}
        schema_wrapped = client.get(wrapped.url + "/openapi.json").json()
        schema_bare = client.get(bare.url + "/openapi.json").json()
    assert schema_wrapped == schema_bare
    body_ref = schema_wrapped["paths"]["/verify"]["post"]["requestBody"]
    assert body_ref["content"]["application/json"]["schema"]["$ref"].endswith("VerifyRequest")
    # Validation happens before the handler: no span for the rejected bodies.
    assert spans.named("gym.verify") == []


def test_dependencies_and_path_params_still_work(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"sandbox"})
    served = serve(_app(True))
    r = httpx.post(served.url + "/items/42", json={"prompt": "hi"})
    assert r.status_code == 200
    assert r.json() == {"item_id": 42, "prompt": "hi", "server": "weather"}
    assert httpx.post(served.url + "/items/notanint", json={"prompt": "hi"}).status_code == 422
    assert spans.one("gym.tool").instrumentation_scope.name == "gym_telemetry.sandbox"  # type: ignore[union-attr]


def test_group_enabled_after_wrapping_takes_effect_on_next_call(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled(set())
    served = serve(_app(True))  # wrapped while "verify" is off
    body = {"answer": "a", "expected": "a"}
    assert httpx.post(served.url + "/verify", json=body).status_code == 200
    assert spans.all() == []
    span_groups.set_enabled(span_groups.parse_spec("default,verify")[0])
    assert httpx.post(served.url + "/verify", json=body).status_code == 200
    assert len(spans.named("gym.verify")) == 1
    span_groups.set_enabled({"rollout"})
    assert httpx.post(served.url + "/verify", json=body).status_code == 200
    assert len(spans.named("gym.verify")) == 1


def test_disabled_group_emits_nothing(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled(span_groups.PRESETS["all"] - {"verify", "sandbox"})
    served = serve(_app(True))
    for _ in range(3):  # one connection per request: a 500 makes uvicorn close it
        assert httpx.post(served.url + "/verify", json={"answer": "a", "expected": "b"}).is_success
        assert httpx.post(served.url + "/items/1", json={"prompt": "x"}).is_success
        r = httpx.post(served.url + "/verify", json={"answer": "boom", "expected": "b"})
        assert r.status_code == 500
    assert spans.all() == []


def _calls_during(fn: Any) -> list[tuple[str, str]]:
    """Every Python and C function call made while ``fn()`` runs, as (event, name)."""
    seen: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen.append((event, frame.f_code.co_name))
        elif event == "c_call":
            seen.append((event, getattr(arg, "__qualname__", repr(arg))))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return [c for c in seen if c != ("c_call", "setprofile")]


def test_disabled_group_checks_first_and_touches_nothing_else() -> None:
    """A disabled group's wrapper runs the set-membership test and then the handler:
    no other function (tracer, rollout id, attributes, clock, logging) is called."""
    span_groups.set_enabled({"rollout"})

    async def handler(n: int) -> int:
        return n

    def plain(n: int) -> int:
        return n

    wrapped_async = traced_verify_endpoint(handler, {"k": "v"})
    wrapped_sync = traced_endpoint("sandbox", "sandbox.step", plain, {"k": "v"})

    def drive_async() -> None:
        coro = wrapped_async(n=1)
        try:
            coro.send(None)
        except StopIteration as done:
            assert done.value == 1

    assert _calls_during(drive_async) == [
        ("call", "drive_async"),
        ("c_call", "coroutine.send"),
        ("call", "async_wrapper"),
        ("call", "handler"),
    ]
    assert _calls_during(lambda: wrapped_sync(n=2)) == [
        ("call", "<lambda>"),
        ("call", "sync_wrapper"),
        ("call", "plain"),
    ]


def test_mutating_static_attributes_after_wrapping_changes_nothing(
    serve: Any, spans: Spans
) -> None:
    span_groups.set_enabled({"verify"})
    static: dict[str, Any] = {"nemo.gym.server.name": "before", "team": "a"}
    app = FastAPI(**fastapi_telemetry_off())
    app.post("/verify")(traced_verify_endpoint(verify, static))
    static["nemo.gym.server.name"] = "after"
    static["added"] = "later"
    del static["team"]
    served = serve(app)
    assert httpx.post(served.url + "/verify", json={"answer": "a", "expected": "a"}).is_success
    attrs = dict(spans.one("gym.verify").attributes or {})
    assert attrs["nemo.gym.server.name"] == "before"
    assert attrs["team"] == "a"
    assert "added" not in attrs


class RolloutPrefixMiddleware:
    """Like Gym's RolloutContextMiddleware: ``/ng-rollout/<id>/...`` sets the rollout id."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/ng-rollout/"):
            _, _, rollout_id, rest = path.split("/", 3)
            scope = {**scope, "path": "/" + rest, "raw_path": ("/" + rest).encode()}
            with rollout_correlation.rollout_context(rollout_id):
                await self.app(scope, receive, send)
            return
        await self.app(scope, receive, send)


def test_rollout_id_appears_on_spans(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"verify", "rollout"})

    async def run(body: RunRequest) -> dict[str, str | None]:
        await asyncio.sleep(0)
        return {"rollout_id": rollout_correlation.current_rollout_id()}

    traced_run = traced_rollout_endpoint(run)

    # Like Gym's agent: the rollout id comes from the /run body, and the traced handler
    # runs inside rollout_context.
    @functools.wraps(traced_run)
    async def run_with_rollout_context(body: RunRequest) -> dict[str, str | None]:
        with rollout_correlation.rollout_context(body.prompt):
            return await traced_run(body=body)

    app = FastAPI(**fastapi_telemetry_off())
    app.post("/verify")(traced_verify_endpoint(verify))
    app.post("/run")(run_with_rollout_context)
    app.add_middleware(RolloutPrefixMiddleware)
    served = serve(app)
    with httpx.Client() as client:
        r = client.post(
            served.url + "/ng-rollout/7-3/verify", json={"answer": "a", "expected": "b"}
        )
        assert r.status_code == 200
        assert client.post(served.url + "/verify", json={"answer": "a", "expected": "b"}).is_success
        r = client.post(served.url + "/run", json={"prompt": "task-9"})
        assert r.json() == {"rollout_id": "task-9"}
    by_id = [s.attributes.get(SEED_ROLLOUT_ID_KEY) for s in spans.named("gym.verify")]  # type: ignore[union-attr]
    assert by_id == ["7-3", None]
    assert spans.one("gym.rollout").attributes[SEED_ROLLOUT_ID_KEY] == "task-9"  # type: ignore[index]


def test_verify_semantics_wrong_answer_succeeds_and_raise_fails(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"verify"})
    served = serve(_app(True))
    with httpx.Client() as client:
        wrong = client.post(served.url + "/verify", json={"answer": "a", "expected": "b"})
        assert wrong.status_code == 200 and wrong.json() == {"reward": 0.0}
        crashed = client.post(served.url + "/verify", json={"answer": "boom", "expected": "b"})
        assert crashed.status_code == 500
    ok, failed = spans.named("gym.verify")
    assert ok.attributes["succeeded"] is True  # type: ignore[index]
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.attributes["succeeded"] is False  # type: ignore[index]
    assert failed.attributes["error.type"] == "RuntimeError"  # type: ignore[index]
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes["exception.message"] == "verifier crashed"  # type: ignore[index]
    # the reward is its own attribute (issue 41) and never changes succeeded: a wrong
    # answer's 0.0 is recorded; a verifier that raised has none
    assert ok.attributes["nemo.gym.reward"] == 0.0  # type: ignore[index]
    assert "nemo.gym.reward" not in (failed.attributes or {})
    for span in (ok, failed):
        assert not any("accuracy" in k for k in span.attributes or {})


def test_handler_exception_propagates_unchanged(spans: Spans) -> None:
    span_groups.set_enabled({"verify", "server"})
    error = HTTPException(status_code=409, detail="conflict")

    async def handler() -> None:
        raise error

    def sync_handler() -> None:
        raise error

    with pytest.raises(HTTPException) as raised:
        asyncio.run(traced_verify_endpoint(handler)())
    assert raised.value is error
    assert raised.value.__traceback__ is not None
    with pytest.raises(HTTPException) as raised_sync:
        traced_endpoint("server", "gym.sync", sync_handler)()
    assert raised_sync.value is error
    assert spans.one("gym.verify").attributes["succeeded"] is False  # type: ignore[index]
    assert spans.one("gym.sync").status.status_code is StatusCode.ERROR


def test_sync_handlers_are_wrapped_and_served(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"server"})

    def ping(name: str) -> dict[str, str]:
        return {"hello": name}

    wrapped = traced_endpoint("server", "gym.ping", ping)
    assert not asyncio.iscoroutinefunction(wrapped)
    app = FastAPI(**fastapi_telemetry_off())
    app.get("/ping")(wrapped)
    served = serve(app)
    assert httpx.get(served.url + "/ping", params={"name": "x"}).json() == {"hello": "x"}
    assert spans.one("gym.ping").instrumentation_scope.name == "gym_telemetry.server"  # type: ignore[union-attr]


def test_wrapper_keeps_identity_and_is_async_for_async_handlers() -> None:
    wrapped = traced_verify_endpoint(verify)
    assert asyncio.iscoroutinefunction(wrapped)
    assert wrapped.__wrapped__ is verify  # type: ignore[attr-defined]
    assert wrapped.__name__ == "verify"
    assert wrapped.__doc__ == verify.__doc__


def test_telemetry_failure_never_reaches_the_handler(
    serve: Any, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    span_groups.set_enabled({"verify"})

    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("tracer broke")

    monkeypatch.setitem(span_groups._tracers, "verify", BrokenTracer())  # type: ignore[arg-type]
    before = endpoints.telemetry_errors()
    served = serve(_app(True))
    r = httpx.post(served.url + "/verify", json={"answer": "a", "expected": "a"})
    assert r.status_code == 200 and r.json() == {"reward": 1.0}
    assert endpoints.telemetry_errors() == before + 1
    assert spans.all() == []


def test_unknown_group_wraps_and_never_records(
    spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    span_groups.set_enabled(span_groups.PRESETS["all"])

    async def handler() -> int:
        return 3

    wrapped = traced_endpoint("no_such_group", "gym.x", handler)
    assert "unknown span group" in caplog.text
    assert asyncio.run(wrapped()) == 3
    assert spans.all() == []


class GymLikeServer:
    """Handlers as bound methods, the way Gym's server classes register them."""

    def __init__(self) -> None:
        self.name = "bound"

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse(reward=0.0 if body.answer != body.expected else 1.0)

    def setup_webserver(self) -> FastAPI:
        app = FastAPI(**fastapi_telemetry_off())
        attributes = {"nemo.gym.server.name": self.name}
        app.post("/verify")(traced_verify_endpoint(self.verify, attributes))
        return app


def test_bound_method_handlers_keep_their_schema(serve: Any, spans: Spans) -> None:
    span_groups.set_enabled({"verify"})
    served = serve(GymLikeServer().setup_webserver())
    assert httpx.post(served.url + "/verify", json={"answer": 1}).status_code == 422
    r = httpx.post(served.url + "/verify", json={"answer": "a", "expected": "a"})
    assert r.json() == {"reward": 1.0}
    schema = httpx.get(served.url + "/openapi.json").json()
    assert "self" not in str(schema["paths"]["/verify"])
    assert spans.one("gym.verify").attributes["nemo.gym.server.name"] == "bound"  # type: ignore[index]


def test_sync_callable_wrapping_an_async_handler_is_awaited_like_fastapi_does(
    spans: Spans,
) -> None:
    span_groups.set_enabled({"server"})

    async def inner(x: int) -> int:
        return x * 2

    @functools.wraps(inner)
    def outer(x: int) -> Any:  # returns the coroutine; FastAPI awaits it (it unwraps)
        return inner(x)

    wrapped = traced_endpoint("server", "gym.outer", outer)
    assert asyncio.iscoroutinefunction(wrapped)
    assert asyncio.run(wrapped(x=4)) == 8
    assert len(spans.named("gym.outer")) == 1


def test_exception_that_cannot_be_described_still_ends_the_span(spans: Spans) -> None:
    span_groups.set_enabled({"verify"})

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    error = Unprintable()

    async def handler() -> None:
        raise error

    before = endpoints.telemetry_errors()
    with pytest.raises(Unprintable) as raised:
        asyncio.run(traced_verify_endpoint(handler)())
    assert raised.value is error
    assert endpoints.telemetry_errors() == before + 1
    (span,) = spans.named("gym.verify")
    assert span.end_time is not None
    assert span.attributes["succeeded"] is False  # type: ignore[index]


@pytest.mark.parametrize(
    ("source", "expected"),
    [(lambda: 42, "42"), (lambda: "5-1", "5-1"), (lambda: None, None)],
    ids=["int", "str", "none"],
)
def test_the_rollout_source_read_directly_gives_the_span_a_string_id(
    spans: Spans, monkeypatch: pytest.MonkeyPatch, source: Any, expected: str | None
) -> None:
    """The wrappers read the resolved source itself (``rollout_correlation.SOURCE``)."""
    span_groups.set_enabled({"verify"})
    rollout_correlation.resolve()
    monkeypatch.setattr(rollout_correlation.SOURCE, "get", source)
    asyncio.run(traced_verify_endpoint(verify)(VerifyRequest(answer="a", expected="a")))
    attributes = spans.one("gym.verify").attributes or {}
    assert attributes.get(SEED_ROLLOUT_ID_KEY) == expected


def test_a_raising_rollout_source_reads_as_no_id(
    spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    span_groups.set_enabled({"verify"})
    rollout_correlation.resolve()

    def broken() -> str | None:
        raise RuntimeError("a foreign getter broke")

    monkeypatch.setattr(rollout_correlation.SOURCE, "get", broken)
    before = endpoints.telemetry_errors()
    result = asyncio.run(traced_verify_endpoint(verify)(VerifyRequest(answer="a", expected="a")))
    assert result == VerifyResponse(reward=1.0)
    span = spans.one("gym.verify")
    assert SEED_ROLLOUT_ID_KEY not in (span.attributes or {})
    assert span.attributes["succeeded"] is True  # type: ignore[index]
    assert endpoints.telemetry_errors() == before
