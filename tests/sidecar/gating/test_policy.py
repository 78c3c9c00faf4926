"""Span-group config validation and the effective per-service policy."""

from __future__ import annotations

import gym_telemetry_semconv as semconv
import pytest
from gym_sidecar.config import ConfigError, load_config
from gym_sidecar.configmodel import ValidationError
from gym_sidecar.gating.config import Mode, SpanGroupsConfig
from gym_sidecar.gating.policy import Policy, joining_warnings


def test_unknown_names_are_reported_with_their_paths() -> None:
    with pytest.raises(ValidationError) as info:
        SpanGroupsConfig.model_validate(
            {
                "spec": "default,verfy",
                "modes": {"x": "on", "verify": "loud"},
                "services": {"svc-a": {"spec": "nope"}},
                "scope_groups": {"my.scope": "q"},
            }
        )
    errors = {".".join(str(p) for p in e["loc"]): e["msg"] for e in info.value.errors()}
    assert "verfy" in errors["spec"]
    assert "'x'" in errors["modes.x.[key]"]
    assert "modes.verify" in errors
    assert "nope" in errors["services.svc-a.spec"]
    assert "'q'" in errors["scope_groups.my.scope"]


def test_whole_config_reports_span_group_paths_and_token_from_env() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"GYM_SIDECAR_SPAN_GROUPS__SPEC": "default,bogus"})
    assert any(e.startswith("span_groups.spec:") and "bogus" in e for e in info.value.errors)
    cfg = load_config(environ={"GYM_SIDECAR_SPAN_GROUPS__TOKEN": "12345"})
    assert cfg.span_groups.token is not None
    assert cfg.span_groups.token.get_secret_value() == "12345"
    assert "12345" not in repr(cfg)


def test_spec_selects_on_and_modes_override() -> None:
    cfg = SpanGroupsConfig.model_validate(
        {
            "spec": "default,verify",
            "modes": {"verify": "metrics", "job": "off"},
            "services": {
                "model": {"spec": "per_rollout", "modes": {"model_call": "off"}},
                "res": {"modes": {"verify": "on"}},
            },
        }
    )
    policy = Policy(cfg.policy(), generation=1)
    glob = policy.for_service("anything")
    assert glob.modes[semconv.GROUP_VERIFY] is Mode.METRICS
    assert glob.modes[semconv.GROUP_JOB] is Mode.OFF
    assert glob.modes[semconv.GROUP_SERVER] is Mode.ON
    assert glob.modes[semconv.GROUP_SANDBOX] is Mode.OFF
    assert semconv.GROUP_VERIFY in glob.enabled and semconv.GROUP_VERIFY in glob.drop
    assert semconv.GROUP_JOB not in glob.enabled
    model = policy.for_service("model")
    assert model.modes[semconv.GROUP_MODEL_CALL] is Mode.OFF
    assert model.modes[semconv.GROUP_AGENT] is Mode.ON  # from per_rollout
    assert model.modes[semconv.GROUP_VERIFY] is Mode.METRICS  # global modes still apply
    assert policy.for_service("res").modes[semconv.GROUP_VERIFY] is Mode.ON
    assert glob.etag != model.etag
    assert glob.etag == Policy(cfg.policy(), generation=7).for_service("anything").etag


def test_disabling_joining_groups_warns() -> None:
    policy = Policy(
        SpanGroupsConfig(spec="default", modes={"http_client": Mode.METRICS}).policy(),
        generation=1,
    )
    assert len(policy.for_service(None).warnings) == 1
    assert "http_client" in policy.for_service(None).warnings[0]
    policy = Policy(SpanGroupsConfig(spec="verify").policy(), generation=1)
    warnings = policy.for_service(None).warnings
    assert len(warnings) == 2
    assert Policy(SpanGroupsConfig().policy(), generation=1).for_service(None).warnings == ()


def test_service_cache_is_bounded() -> None:
    policy = Policy(SpanGroupsConfig().policy(), generation=1, max_services=2)
    for name in ("a", "b", "c"):
        policy.for_service(name)
    assert policy.is_cached("a") and policy.is_cached("b")
    assert not policy.is_cached("c")
    assert policy.for_service("c").modes == policy.for_service("a").modes


def test_answers_name_their_service_and_spec_and_are_computed_once() -> None:
    cfg = SpanGroupsConfig.model_validate(
        {"spec": "default", "services": {"model": {"spec": "per_rollout"}}}
    )
    policy = Policy(cfg.policy(), generation=1)
    model = policy.for_service("model")
    assert (model.service, model.spec) == ("model", "per_rollout")
    assert (policy.for_service(None).service, policy.for_service(None).spec) == (None, "default")
    assert policy.for_service("model") is model  # the cached answer, not a recomputation
    assert policy.for_service(None) is policy.for_service(None)


def test_etag_is_the_hash_of_the_served_document() -> None:
    """Same modes, different service: the documents differ (``service``), so must the
    etags, or a conditional GET for one service would be answered with another's."""
    policy = Policy(SpanGroupsConfig(spec="default").policy(), generation=1)
    a, b = policy.for_service("a"), policy.for_service("b")
    assert a.modes == b.modes
    assert a.etag != b.etag
    other_spec = Policy(
        SpanGroupsConfig(spec="job,server,http_client,rollout").policy(), generation=1
    )
    assert other_spec.for_service("a").modes == a.modes
    assert other_spec.for_service("a").etag != a.etag  # the spec is in the document too


def test_joining_warnings_treat_a_missing_group_as_off() -> None:
    assert joining_warnings({}) == joining_warnings(
        {semconv.GROUP_SERVER: Mode.OFF, semconv.GROUP_HTTP_CLIENT: Mode.OFF}
    )
    assert len(joining_warnings({})) == 2
    assert "'server' is off: traces no longer join" in joining_warnings({})[0]
    (metrics,) = joining_warnings(
        {semconv.GROUP_SERVER: Mode.METRICS, semconv.GROUP_HTTP_CLIENT: Mode.ON}
    )
    assert "'server' is in metrics mode" in metrics
