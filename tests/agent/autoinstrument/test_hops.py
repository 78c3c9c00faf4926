"""issue 41: which hop is a turn or a relay, and the ``server_utils`` patch's shape checks.

The hops themselves (span, retries, timeouts, the rollout's step) run on real Gym servers
in ``tests/gym/test_rl_view.py``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
from gym_telemetry.autoinstrument import hops


@pytest.fixture(autouse=True)
def _config() -> Iterator[None]:
    config = {
        "policy_model": {"responses_api_models": {"stub_model": {}}},
        "weather": {"resources_servers": {"example_single_tool_call": {}}},
        "agent": {"responses_api_agents": {"simple_agent": {}}},
    }
    before = hops._CONFIG.get_config
    hops._CONFIG.get_config = lambda: config
    hops._CONFIG.model_servers.clear()
    hops._SHAPES.clear()
    yield
    hops._CONFIG.get_config = before
    hops._CONFIG.model_servers.clear()
    hops._SHAPES.clear()


@pytest.mark.parametrize(
    ("template", "server", "expected"),
    [
        ("/v1/responses", "policy_model", (True, False)),
        ("/ng-rollout/{rollout_id}/v1/chat/completions", "policy_model", (True, False)),
        ("/v1/messages", None, (True, False)),  # an unnamed target's model route
        ("/v1/responses", "agent", (False, False)),  # an agent's own /v1/responses
        ("/v1/models", "policy_model", (False, False)),
        ("/verify", "weather", (False, False)),
        ("/run", "agent", (False, True)),
        ("/ng-rollout/{rollout_id}/run", None, (False, True)),
        (None, "policy_model", (False, False)),
        ("/v1/responses", "not_in_config", (False, False)),
    ],
)
def test_hop_kind(template: str | None, server: str | None, expected: tuple[bool, bool]) -> None:
    assert hops.hop_kind(template, server) == expected


def test_without_gyms_config_nothing_is_a_model_server() -> None:
    def broken() -> Any:
        raise RuntimeError("no config here")

    hops._CONFIG.get_config = broken
    hops._CONFIG.model_servers.clear()
    assert hops.hop_kind("/v1/responses", "policy_model") == (False, False)


def _module(traced: Any) -> types.ModuleType:
    module = types.ModuleType("server_utils_like")

    async def _request_with_retries(method: str, url: str, **kwargs: Any) -> Any:
        return None

    def set_global_aiohttp_client(cfg: Any) -> Any:
        return types.SimpleNamespace(request=lambda *a, **k: None)

    module._request_with_retries = _request_with_retries  # type: ignore[attr-defined]
    module._traced_request = traced  # type: ignore[attr-defined]
    module.set_global_aiohttp_client = set_global_aiohttp_client  # type: ignore[attr-defined]
    module.get_global_config_dict = dict  # type: ignore[attr-defined]
    return module


def test_patch_replaces_a_traced_request_of_gyms_shape_once() -> None:
    async def _traced_request(
        method: str,
        url: str,
        _internal: bool = False,
        _max_connection_retries: int | None = None,
        _server_name: str | None = None,
        **kwargs: Any,
    ) -> Any:
        return None

    before = hops._CONFIG.get_config
    module = _module(_traced_request)
    hops.patch(module)
    patched = (module._traced_request, module._request_with_retries)  # type: ignore[attr-defined]
    assert module._traced_request is not _traced_request  # type: ignore[attr-defined]
    assert all(getattr(f, hops.PATCHED, False) for f in patched)
    session = module.set_global_aiohttp_client(None)  # type: ignore[attr-defined]
    assert getattr(session.request, hops.PATCHED, False)
    hops.patch(module)  # idempotent
    assert (module._traced_request, module._request_with_retries) == patched  # type: ignore[attr-defined]
    hops._CONFIG.get_config = before


def test_patch_keeps_a_traced_request_of_another_shape() -> None:
    async def _traced_request(method: str, url: str, **kwargs: Any) -> Any:
        return None

    module = _module(_traced_request)
    hops.patch(module)
    assert module._traced_request is _traced_request  # type: ignore[attr-defined]
    # the untraced path still updates a rollout's step
    assert getattr(module._request_with_retries, hops.PATCHED, False)  # type: ignore[attr-defined]


def test_attempts_are_counted_only_inside_a_hop() -> None:
    calls: list[str] = []
    session = types.SimpleNamespace(request=lambda method, url, **kw: calls.append(url))
    hops.count_attempts(session)
    hops.count_attempts(session)  # once only
    session.request("POST", "http://x/1")
    attempts = [0]
    token = hops._ATTEMPTS.set(attempts)
    try:
        session.request("POST", "http://x/2")
        session.request(method="POST", url="http://x/3")
    finally:
        hops._ATTEMPTS.reset(token)
    assert attempts == [2] and calls == ["http://x/1", "http://x/2", "http://x/3"]


def test_with_http_client_off_the_untraced_path_still_steps_the_rollout() -> None:
    import asyncio

    from gym_telemetry import inflight
    from gym_telemetry.rollout_correlation import ENCLOSING_ROLLOUT
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    seen: list[tuple[str, str]] = []

    async def retries(method: str, url: str, **kwargs: Any) -> str:
        seen.append((method, url))
        return "response"

    stepping = hops.stepping(retries)
    span = NonRecordingSpan(SpanContext(9, 9, False, TraceFlags(1)))
    record = inflight.begin(span, None, nested=False)
    token = ENCLOSING_ROLLOUT.set(record)
    try:
        url = "http://127.0.0.1:1/v1/responses?key=secret"
        answer = asyncio.run(stepping("post", url, _server_name="policy_model"))
    finally:
        ENCLOSING_ROLLOUT.reset(token)
        inflight.end(record)
    assert answer == "response" and seen == [("post", url)]  # Gym's call, unchanged
    assert (record.step, record.target, record.turns) == ("POST /v1/responses", "policy_model", 1)
    # outside a rollout: nothing but Gym's call
    assert asyncio.run(stepping("POST", "http://127.0.0.1:1/verify")) == "response"


def test_a_hops_shape_is_remembered_without_its_query_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://127.0.0.1:9/v1/responses"
    shape = hops._shape("post", url, "policy_model")
    assert hops._shape("post", url, "policy_model") is shape  # remembered
    assert (shape.name, shape.model_call, shape.relay) == ("POST /v1/responses", True, False)
    assert shape.attributes == {
        "http.request.method": "POST",
        "url.full": url,
        "url.template": "/v1/responses",
        "nemo.gym.target.server.name": "policy_model",
    }
    keyed = hops._shape("POST", url + "?key=secret", None)  # a query carries keys
    assert (
        keyed.attributes["url.full"] == url
        and "nemo.gym.target.server.name" not in keyed.attributes
    )
    assert not any("secret" in key[1] for key in hops._SHAPES)
    odd = hops._shape("POST", url, 7)  # type: ignore[arg-type]  # not a str: not kept
    assert odd.attributes["nemo.gym.target.server.name"] == "7"
    listed = hops._shape("POST", url, ["a"])  # type: ignore[arg-type]  # not even hashable
    assert listed.attributes["nemo.gym.target.server.name"] == "['a']"
    assert len(hops._SHAPES) == 1
    monkeypatch.setattr(hops, "MAX_CACHED_HOPS", 2)
    for i in range(3):
        hops._shape("GET", f"http://127.0.0.1:9/r{i}", None)
    # cleared when full: the first shape and r0 went with it
    assert [key[1][-2:] for key in hops._SHAPES] == ["r1", "r2"]
