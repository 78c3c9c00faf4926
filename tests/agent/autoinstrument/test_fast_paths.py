"""The Gym integration's straight lines against their general forms: the CLIENT span of a
hop on the lean path against the SDK path, W3C headers written from a lean span against
the propagator's, the baggage read in one match against member by member, attributes set
through the scalar shortcut and the key memo, the URL-template memo, and the SERVER
layer's send wrapper."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import gym_telemetry_semconv as semconv
import pytest
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import rollout_correlation
from gym_telemetry._lean.span import LeanSpan
from gym_telemetry.autoinstrument import gym_primitives, propagation
from gym_telemetry.autoinstrument.gym_primitives import (
    REDACTED,
    client_span,
    safe_set_span_attributes,
    url_template,
)
from gym_telemetry.autoinstrument.server_span import _StatusSend
from gym_telemetry.rollout_correlation import ENCLOSING_ROLLOUT, ROLLOUT_ID_VAR
from opentelemetry import baggage, trace
from opentelemetry import context as context_api
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from tests.agent.conftest import Spans

BASE = "http://127.0.0.1:8000"


@pytest.fixture(autouse=True)
def _context_restored() -> Iterator[None]:
    """Every test leaves the current context as it found it (a span left current would
    leak into the tests after it)."""
    before = context_api.get_current()
    yield
    assert context_api.get_current() is before


@pytest.fixture
def both_paths(spans: Spans, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Run a block once on the lean path and once on the SDK's (``GYM_TELEMETRY_RECORDER=sdk``)
    and return the spans each recorded."""

    def run(block: Any) -> dict[str, list[ReadableSpan]]:
        out = {}
        for path in ("lean", "sdk"):
            spans.clear()
            gym_primitives._CLIENT_RECORDER.recorder = None  # resolve again
            if path == "sdk":
                monkeypatch.setenv(env_vars.GYM_TELEMETRY_RECORDER, "sdk")
            else:
                monkeypatch.delenv(env_vars.GYM_TELEMETRY_RECORDER, raising=False)
            block(path)
            out[path] = spans.all()
        return out

    yield run
    gym_primitives._CLIENT_RECORDER.recorder = None


def _view(span: ReadableSpan) -> tuple[Any, ...]:
    return (
        span.name,
        span.kind,
        dict(span.attributes or {}),
        span.status.status_code,
        span.status.description,
        [
            (e.name, {k: v for k, v in (e.attributes or {}).items() if k != "exception.stacktrace"})
            for e in span.events
        ],
        span.parent.span_id if span.parent else None,
    )


@pytest.mark.parametrize(
    ("url", "status", "method", "exc"),
    [
        (f"{BASE}/verify", 200, "POST", None),
        (f"{BASE}/ng-rollout/7-1/v1/responses", 200, "POST", None),
        (f"{BASE}/items/12345", 404, "GET", None),
        (f"{BASE}/verify", 503, "FROB", None),
        (f"{BASE}/verify", None, "POST", ConnectionResetError("peer went away")),
        (None, 200, "POST", None),  # no url: the span keeps its name
    ],
)
def test_client_spans_on_the_lean_path_are_the_sdk_paths(
    both_paths: Any, url: str | None, status: int | None, method: str, exc: Exception | None
) -> None:
    parent = SpanContext(0xAB, 0xCD, True, TraceFlags(1))
    types: dict[str, type] = {}

    def hop(path: str) -> None:
        token = context_api.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent)))
        rollout = ROLLOUT_ID_VAR.set("9-2")
        try:
            with client_span(f"HTTP {method}") as span:
                types[path] = type(span)
                attributes: dict[str, Any] = {semconv.HTTP_REQUEST_METHOD: method, "token": "x"}
                if url is not None:
                    attributes[semconv.URL_FULL] = url
                safe_set_span_attributes(span, attributes)
                if exc is not None:
                    raise exc
                safe_set_span_attributes(span, {semconv.HTTP_RESPONSE_STATUS_CODE: status})
        except ConnectionResetError:
            pass
        finally:
            ROLLOUT_ID_VAR.reset(rollout)
            context_api.detach(token)

    recorded = both_paths(hop)
    assert types == {"lean": LeanSpan, "sdk": types["sdk"]} and types["sdk"] is not LeanSpan
    (lean,), (sdk,) = recorded["lean"], recorded["sdk"]
    assert _view(lean) == _view(sdk)
    assert lean.attributes[semconv.ROLLOUT_ID] == "9-2"  # type: ignore[index]
    assert lean.attributes["token"] == REDACTED  # type: ignore[index]
    assert lean.kind is SpanKind.CLIENT and lean.parent.span_id == 0xCD  # type: ignore[union-attr]


def test_a_client_span_that_could_not_start_lets_the_hop_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: Any) -> Any:
        raise RuntimeError("no recorder")

    monkeypatch.setattr(gym_primitives._ClientRecorder, "get", broken)
    with client_span("HTTP POST") as span:
        safe_set_span_attributes(span, {semconv.HTTP_REQUEST_METHOD: "POST"})
    assert span is trace.INVALID_SPAN


# --- W3C headers and baggage -----------------------------------------------------------------


@pytest.mark.parametrize("state", [None, TraceState([("vendor", "a")])])
@pytest.mark.parametrize("enclosing", [False, True])
def test_inject_from_a_lean_span_writes_the_propagators_headers(
    both_paths: Any, state: TraceState | None, enclosing: bool
) -> None:
    written: dict[str, dict[str, str]] = {}

    def hop(path: str) -> None:
        parent = SpanContext(0x1F, 0x2E, True, TraceFlags(3), state)
        token = context_api.attach(trace.set_span_in_context(trace.NonRecordingSpan(parent)))
        rollout = ROLLOUT_ID_VAR.set("4-5")
        outer = ENCLOSING_ROLLOUT.set(enclosing)
        try:
            with client_span("HTTP POST"):
                headers = {"baggage": "other=1"}
                propagation.inject(headers)
                expected = {"baggage": "other=1"}
                TraceContextTextMapPropagator().inject(expected)
                written[path] = headers
                assert {k: v for k, v in headers.items() if k != "baggage"} == {
                    k: v for k, v in expected.items() if k != "baggage"
                }
        finally:
            ENCLOSING_ROLLOUT.reset(outer)
            ROLLOUT_ID_VAR.reset(rollout)
            context_api.detach(token)

    both_paths(hop)
    lean, sdk = written["lean"], written["sdk"]
    assert lean.keys() == sdk.keys() and lean["baggage"] == sdk["baggage"]
    assert lean["traceparent"].startswith("00-" + "0" * 30 + "1f-")
    assert lean["traceparent"].endswith("-03")
    assert ("tracestate" in lean) is (state is not None)
    members = W3CBaggagePropagator().extract({"baggage": lean["baggage"]})
    assert baggage.get_baggage(semconv.ROLLOUT_ID, members) == "4-5"
    assert baggage.get_baggage("other", members) == "1"
    outer = baggage.get_baggage(semconv.ROLLOUT_OUTER_BAGGAGE, members)
    assert outer == ("1" if enclosing else None)


def _baggage_the_long_way(rollout_id: Any, outer: bool) -> str | None:
    """The ``baggage`` header inject writes into headers without one, member by member."""
    headers: dict[str, str] = {}
    if rollout_id and rollout_correlation.valid_rollout_id(rollout_id):
        propagation._add_member(
            headers, propagation.BAGGAGE_KEY, f"nemo.gym.rollout.id={rollout_id}"
        )
    if outer:
        propagation._add_member(
            headers, propagation.OUTER_BAGGAGE_KEY, propagation.OUTER_BAGGAGE_MEMBER
        )
    return headers.get("baggage")


@pytest.mark.parametrize("outer", [False, True])
@pytest.mark.parametrize("rollout_id", ["12-3", "x.y_z", "-bad", "a" * 257, "", None])
def test_the_remembered_baggage_is_the_one_written_member_by_member(
    rollout_id: str | None, outer: bool
) -> None:
    propagation._BAGGAGE.clear()
    token = ROLLOUT_ID_VAR.set(rollout_id)
    enclosing = ENCLOSING_ROLLOUT.set(outer)
    try:
        for _ in range(2):  # cold, then remembered
            headers: dict[str, str] = {}
            propagation.inject(headers)
            assert headers.get("baggage") == _baggage_the_long_way(rollout_id, outer)
            assert "traceparent" not in headers  # no current span
    finally:
        ENCLOSING_ROLLOUT.reset(enclosing)
        ROLLOUT_ID_VAR.reset(token)


def test_the_baggage_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    propagation._BAGGAGE.clear()
    monkeypatch.setattr(propagation, "MAX_CACHED_BAGGAGE", 2)
    for i in range(5):
        token = ROLLOUT_ID_VAR.set(f"{i}-0")
        try:
            headers: dict[str, str] = {}
            propagation.inject(headers)
        finally:
            ROLLOUT_ID_VAR.reset(token)
        assert headers["baggage"] == f"nemo.gym.rollout.id={i}-0"
        assert len(propagation._BAGGAGE) <= 2


@pytest.mark.parametrize(
    "header",
    [
        b"nemo.gym.rollout.id=12-3",
        b"nemo.gym.rollout.id=12-3,nemo.gym.rollout.outer=1",
        b"nemo.gym.rollout.id=12-3,nemo.gym.rollout.outer=0",
        b"nemo.gym.rollout.outer=1,nemo.gym.rollout.id=12-3",
        b"nemo.gym.rollout.id=12-3;prop=1",
        b"nemo.gym.rollout.id=12%2D3",
        b"nemo.gym.rollout.id=-12",
        b"nemo.gym.rollout.id=",
        b"nemo.gym.rollout.id=" + b"a" * 256,
        b"nemo.gym.rollout.id=" + b"a" * 257,
        b"nemo.gym.rollout.id=" + b"a" * 256 + b",nemo.gym.rollout.outer=1",
        b"other=1,nemo.gym.rollout.id=x.y_z",
        b" nemo.gym.rollout.id = 5 ",
        b"nemo.gym.rollout.idx=5",
        b"nemo.gym.rollout.id=5,nemo.gym.rollout.outer=1,x=2",
        b"nemo.gym.rollout.id=\xff",
        b"",
    ],
)
def test_baggage_read_in_one_match_is_read_member_by_member(header: bytes) -> None:
    assert propagation.read_rollout_baggage(header) == (
        propagation.rollout_id_from_baggage(header),
        propagation.outer_rollout_in_baggage(header),
    )


# --- attributes and names ------------------------------------------------------------------


def _reference_attributes(attributes: dict[str, Any], redact: Any = None) -> dict[str, Any]:
    """What ``safe_set_span_attributes`` sets, per its contract, written the long way."""
    extra = {str(k).lower() for k in redact} if redact else set()
    out = {}
    for key, raw in attributes.items():
        value = gym_primitives._clean(raw)
        if value is None:
            continue
        lowered = key.lower()
        parts = gym_primitives.SENSITIVE_KEY_PARTS
        sensitive = lowered in extra or any(p in lowered for p in parts)
        out[key] = REDACTED if sensitive else value
    return out


class _Str(str):
    pass


@pytest.mark.parametrize("redact", [None, ["X-Custom"], ("plain",)])
def test_attributes_through_the_shortcuts_are_the_long_ways(redact: Any) -> None:
    attributes: dict[str, Any] = {
        "plain": "v",
        "n": 3,
        "f": 2.5,
        "b": False,
        "API_KEY": "sk",
        "x-custom": "secret value",
        "my_password_hint": 1,
        "list": [1, 2],
        "mixed": [1, "a"],
        "none": None,
        "obj": object(),
        "sub": _Str("s"),
        "Authorization": "Bearer t",
    }
    for _ in range(2):  # the key memo cold, then warm
        span = TracerProvider().get_tracer("t").start_span("s")
        safe_set_span_attributes(span, attributes, redact_keys=redact)
        assert dict(span.attributes or {}) == _reference_attributes(attributes, redact)


def test_the_key_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gym_primitives, "MAX_CACHED_KEYS", 3)
    for i in range(10):
        assert gym_primitives._sensitive(f"k{i}_token") is True
        assert gym_primitives._sensitive(f"k{i}") is False
    assert len(gym_primitives._key_sensitive) <= 3


@pytest.mark.parametrize(
    "url",
    [
        f"{BASE}/verify",
        f"{BASE}/ng-rollout/1-2/verify",
        f"{BASE}/items/12345",
        f"{BASE}/verify?x=1",
        "/verify",
        "verify",
    ],
)
def test_the_url_template_memo_answers_as_url_template(url: str) -> None:
    for _ in range(2):
        assert gym_primitives._url_template(url) == url_template(url)


def test_the_url_and_name_memos_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gym_primitives, "MAX_CACHED_URLS", 4)
    for i in range(20):
        url = f"{BASE}/ng-rollout/{i}-0/verify"
        assert gym_primitives._url_template(url) == url_template(url)
        assert gym_primitives._client_name("POST", f"/t{i}") == f"POST /t{i}"
    assert len(gym_primitives._url_templates) <= 4 and len(gym_primitives._client_names) <= 4


# --- the SERVER layer's send wrapper -----------------------------------------------------------


def test_the_send_wrapper_returns_the_inner_sends_awaitable_and_keeps_the_status() -> None:
    returned = object()
    seen: list[Any] = []

    def inner(message: Any) -> Any:
        seen.append(message)
        return returned

    send = _StatusSend(inner)
    start = {"type": "http.response.start", "status": 207, "headers": []}
    body = {"type": "http.response.body", "body": b"x"}
    assert send(start) is returned and send.status == 207
    assert send(body) is returned and send.status == 207
    assert seen == [start, body]


def test_the_send_wrapper_over_a_coroutine_send_is_awaited_once() -> None:
    seen: list[Any] = []

    async def inner(message: Any) -> None:
        seen.append(message)

    async def respond() -> int:
        send = _StatusSend(inner)
        await send({"type": "http.response.start", "status": 500, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return send.status

    assert asyncio.run(respond()) == 500
    assert [m["type"] for m in seen] == ["http.response.start", "http.response.body"]


def test_a_send_that_raises_reaches_the_app_unchanged() -> None:
    def inner(message: Any) -> Any:
        raise OSError("client went away")

    send = _StatusSend(inner)
    with pytest.raises(OSError, match="client went away"):
        send({"type": "http.response.start", "status": 200, "headers": []})
    assert send.status == 200


def test_the_rollout_source_read_directly_is_current_rollout_id() -> None:
    token = ROLLOUT_ID_VAR.set("8-8")
    try:
        assert rollout_correlation.SOURCE.get() == rollout_correlation.current_rollout_id()
    finally:
        ROLLOUT_ID_VAR.reset(token)
