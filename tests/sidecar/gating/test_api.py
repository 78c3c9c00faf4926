"""The /v1/span-groups handlers: auth, validation, ETags, per-service overrides."""

from __future__ import annotations

import json

from gym_sidecar.gating.api import get_span_groups, put_span_groups
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.state import SpanGroupState
from gym_sidecar.selfmetrics import SelfMetrics

TOKEN = "s3cret-token"
AUTH = f"Bearer {TOKEN}"


def state(**kw: object) -> SpanGroupState:
    return SpanGroupState(SpanGroupsConfig.model_validate({"token": TOKEN, **kw}), SelfMetrics())


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_get_returns_modes_with_etag_and_304_on_match() -> None:
    st = state(spec="default", modes={"verify": "metrics"})
    first = get_span_groups(st, "res", None)
    assert first.status == 200 and first.body is not None
    assert first.body["service"] == "res"
    assert first.body["modes"]["verify"] == "metrics"
    assert first.body["modes"]["sandbox"] == "off"
    assert first.body["enabled"] == [
        "http_client",
        "job",
        "model_call",
        "rollout",
        "server",
        "verify",
    ]
    assert first.body["forwarded"] == ["http_client", "job", "rollout", "server"]
    etag = first.headers["ETag"]
    again = get_span_groups(st, "res", etag)
    assert again.status == 304 and again.body is None and again.headers["ETag"] == etag
    assert get_span_groups(st, "res", '"stale"').status == 200


def test_put_needs_the_token() -> None:
    st = state()
    new = body({"spec": "all"})
    assert put_span_groups(st, None, None, new).status == 401
    assert put_span_groups(st, None, "Bearer wrong", new).status == 401
    assert put_span_groups(st, None, TOKEN, new).status == 401  # no scheme
    assert st.policy.generation == 1
    no_token = SpanGroupState(SpanGroupsConfig(), SelfMetrics())
    assert put_span_groups(no_token, None, AUTH, new).status == 403


def test_bad_spec_is_400_with_the_offending_name_and_changes_nothing() -> None:
    st = state()
    res = put_span_groups(st, None, AUTH, body({"spec": "default,verfy"}))
    assert res.status == 400 and res.body is not None
    assert "verfy" in res.body["error"] and "spec" in res.body["error"]
    res = put_span_groups(st, None, AUTH, body({"modes": {"sandbx": "on"}}))
    assert res.status == 400 and res.body is not None and "sandbx" in res.body["error"]
    res = put_span_groups(st, "svc", AUTH, body({"spec": "nope"}))
    assert res.status == 400 and res.body is not None
    assert "services.svc.spec" in res.body["error"]
    assert put_span_groups(st, None, AUTH, b"{not json").status == 400
    assert st.policy.generation == 1


def test_put_changes_etag_and_warns_about_joining_groups() -> None:
    st = state()
    etag = get_span_groups(st, "res", None).headers["ETag"]
    res = put_span_groups(st, None, AUTH, body({"spec": "default", "modes": {"server": "off"}}))
    assert res.status == 200 and res.body is not None
    assert res.body["generation"] == 2
    assert any("server" in w for w in res.body["warnings"])
    after = get_span_groups(st, "res", etag)
    assert after.status == 200 and after.headers["ETag"] != etag
    res = put_span_groups(st, None, AUTH, body({"spec": "all"}))
    assert res.body is not None and res.body["warnings"] == []


def test_put_for_one_service_and_removing_it() -> None:
    st = state(spec="default,verify")
    res = put_span_groups(st, "res", AUTH, body({"modes": {"verify": "off", "http_client": "off"}}))
    assert res.status == 200 and res.body is not None
    assert res.body["service"] == "res" and res.body["modes"]["verify"] == "off"
    assert any("http_client" in w for w in res.body["warnings"])
    other = get_span_groups(st, "other", None).body
    assert other is not None and other["modes"]["verify"] == "on"
    put_span_groups(st, "res", AUTH, b"null")
    back = get_span_groups(st, "res", None).body
    assert back is not None and back["modes"]["verify"] == "on"
