"""The pure injection: opt-in rule, what is added, convergence, version rule."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from gym_sidecar.core.downward_api import (
    ENV_TO_ATTRIBUTE,
    PODINFO_DEFAULT_DIR,
    PODINFO_DIR_ENV,
    PODINFO_VOLUME_NAME,
)
from gym_sidecar.webhook.config import (
    InjectorConfig,
    InjectorConfigError,
    load_injector_config,
    parse_version,
)
from gym_sidecar.webhook.mutate import (
    AGENT_ADMIN_URL_ENV,
    INJECT_ANNOTATION,
    INJECTED_ANNOTATION,
    decide,
    mutate,
)
from gym_telemetry import environment_variables as env_vars
from gym_telemetry import remote_config

from tests.deploy.pod_security import restricted_violations
from tests.deploy.support import validate_k8s
from tests.support.ratelimit import hand_clock
from tests.support.sidecar_proc import SidecarProcess


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "gym-", "annotations": annotations or {}},
        "spec": {
            "containers": [{"name": "server", "image": "gym:1"}, {"name": "helper", "image": "h"}],
            **spec,
        },
    }


NATIVE = InjectorConfig(sidecar_mode="native")
PLAIN = InjectorConfig(sidecar_mode="container")


@pytest.mark.parametrize(
    ("annotation", "namespace", "expected"),
    [
        ("true", False, True),
        ("true", True, True),
        ("false", True, False),
        (None, True, True),
        (None, False, False),
        ("yes", True, False),
        ("TRUE", False, True),
    ],
)
def test_pod_annotation_overrides_namespace(
    annotation: str | None, namespace: bool, expected: bool
) -> None:
    p = pod({INJECT_ANNOTATION: annotation} if annotation is not None else None)
    assert decide(p, namespace).inject is expected


def test_native_sidecar_first_init_container_with_probe() -> None:
    p = pod({INJECT_ANNOTATION: "true"}, initContainers=[{"name": "init", "image": "i"}])
    out = mutate(p, NATIVE)
    sidecar = out["spec"]["initContainers"][0]
    assert sidecar["name"] == NATIVE.container_name
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert out["spec"]["initContainers"][1]["name"] == "init"
    assert [c["name"] for c in out["spec"]["containers"]] == ["server", "helper"]
    assert out["metadata"]["annotations"][INJECTED_ANNOTATION] == "native-sidecar"
    assert sidecar["resources"]["limits"] and sidecar["resources"]["requests"]
    validate_k8s(out)


def test_plain_container_on_old_clusters() -> None:
    out = mutate(pod(), PLAIN)
    names = [c["name"] for c in out["spec"]["containers"]]
    assert names == ["server", "helper", PLAIN.container_name]
    assert "restartPolicy" not in out["spec"]["containers"][-1]
    assert "initContainers" not in out["spec"]
    validate_k8s(out)


def test_downward_api_variables_and_volume_match_enrichment() -> None:
    out = mutate(pod({"kubectl.kubernetes.io/default-container": "helper"}), NATIVE)
    sidecar = out["spec"]["initContainers"][0]
    env = {e["name"]: e for e in sidecar["env"]}
    assert set(ENV_TO_ATTRIBUTE) <= set(env)
    assert env["K8S_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["K8S_CONTAINER_NAME"]["value"] == "helper"
    assert env[PODINFO_DIR_ENV]["value"] == PODINFO_DEFAULT_DIR
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == PODINFO_VOLUME_NAME)
    assert mount["mountPath"] == PODINFO_DEFAULT_DIR
    data = next(m for m in sidecar["volumeMounts"] if m["name"] == "gym-telemetry-data")
    assert data["mountPath"] == env["XDG_DATA_HOME"]["value"] + "/gym-sidecar"
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    volume = next(v for v in out["spec"]["volumes"] if v["name"] == PODINFO_VOLUME_NAME)
    paths = {i["fieldRef"]["fieldPath"] for i in volume["downwardAPI"]["items"]}
    assert paths == {"metadata.labels", "metadata.annotations"}


def test_app_endpoint_set_unless_already_set() -> None:
    p = pod()
    p["spec"]["containers"][1]["env"] = [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://elsewhere:4317"}
    ]
    out = mutate(p, NATIVE)
    server, helper = out["spec"]["containers"]
    server_env = {e["name"]: e["value"] for e in server["env"]}
    assert server_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4317"
    assert server_env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"  # the pair, always
    helper_env = {e["name"]: e["value"] for e in helper["env"]}
    assert helper_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://elsewhere:4317"
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" not in helper_env  # not ours to guess


def test_each_app_container_gets_the_endpoint_of_the_protocol_it_speaks() -> None:
    """An OTLP/HTTP sender and a gRPC sender in one pod: each is pointed at the sidecar
    port serving its protocol; a container with ``envFrom`` keeps the SDK defaults."""
    p = pod()
    p["spec"]["containers"] = [
        {"name": "grpc-app", "image": "a"},
        {
            "name": "http-app",
            "image": "b",
            "env": [{"name": "OTEL_EXPORTER_OTLP_PROTOCOL", "value": "http/protobuf"}],
        },
        {"name": "configured", "image": "c", "envFrom": [{"configMapRef": {"name": "otel"}}]},
    ]
    out = mutate(p, NATIVE)
    envs = {c["name"]: {e["name"]: e["value"] for e in c["env"]} for c in out["spec"]["containers"]}
    assert envs["grpc-app"] == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        AGENT_ADMIN_URL_ENV: "http://localhost:13133",
    }
    assert envs["http-app"] == {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318",
        AGENT_ADMIN_URL_ENV: "http://localhost:13133",
    }
    assert envs["configured"] == {AGENT_ADMIN_URL_ENV: "http://localhost:13133"}
    assert mutate(out, NATIVE) == out
    validate_k8s(out)
    # The configured default protocol and ports move the pair with them.
    http = InjectorConfig(sidecar_mode="native", otlp_protocol="http/protobuf", http_port=14318)
    grpc_app = mutate(p, http)["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in grpc_app["env"]} == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:14318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        AGENT_ADMIN_URL_ENV: "http://localhost:13133",
    }


@pytest.mark.parametrize("config", [NATIVE, PLAIN], ids=["native", "plain"])
def test_mutation_is_pure_and_convergent(config: InjectorConfig) -> None:
    p = pod({INJECT_ANNOTATION: "true"})
    before = copy.deepcopy(p)
    once = mutate(p, config)
    assert p == before  # input untouched
    assert mutate(once, config) == once  # a second injection changes nothing


def test_pod_without_containers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^pod has no spec\.containers list$"):
        mutate({"metadata": {}, "spec": {}}, NATIVE)


@pytest.mark.parametrize(
    ("version", "native"),
    [("v1.28.9", False), ("1.29", True), ("v1.31.2-eks-1", True), ("1.30+", True)],
)
def test_version_rule(version: str, native: bool) -> None:
    assert InjectorConfig(kubernetes_version=version).native_sidecar() is native


def test_unknown_version_defaults_to_plain_container() -> None:
    assert InjectorConfig().native_sidecar() is False
    assert InjectorConfig(unknown_version_mode="native").native_sidecar() is True


def test_config_precedence_and_errors(tmp_path: Any) -> None:
    f = tmp_path / "injector.yaml"
    f.write_text("image: from-file\nsidecar_mode: native\nresources: {limits: {cpu: '2'}}\n")
    cfg = load_injector_config(
        f, environ={"GYM_INJECTOR_IMAGE": "from-env"}, overrides={"sidecar_mode": "container"}
    )
    assert cfg.image == "from-env" and cfg.sidecar_mode == "container"
    f.write_text("sidecar_mode: sometimes\nkubernetes_version: banana\nmax_request_bytes: 0\n")
    with pytest.raises(InjectorConfigError) as err:
        load_injector_config(f, environ={})
    assert len(err.value.errors) == 3
    with pytest.raises(ValueError):
        parse_version("latest")


def test_fail_open_warnings_are_rate_limited(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gym_sidecar.webhook import review

    clock = hand_clock(review._fail_open_log.name, monkeypatch)

    def admit_bad_reviews(n: int) -> None:
        for _ in range(n):
            outcome = review.handle_review(b"not json", NATIVE, namespace_opted_in=False)
            assert outcome.kind == "failed_open" and outcome.review.response is not None
            assert outcome.review.response.allowed

    with caplog.at_level(logging.DEBUG, logger=review.__name__):
        admit_bad_reviews(5)
        clock.now += review.FAIL_OPEN_LOG_INTERVAL_S - 0.1
        admit_bad_reviews(1)
        clock.now += 0.2
        admit_bad_reviews(1)
    lines = [r for r in caplog.records if "without the sidecar" in r.getMessage()]
    # Every pod at DEBUG; one WARNING per interval, the next one saying how many it hid.
    assert [r.levelno for r in lines].count(logging.DEBUG) == 7
    warnings = [r.getMessage() for r in lines if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[1].endswith("[5 similar messages suppressed]")


# --- restricted namespaces (Pod Security Standards) ---------------------------------------

RESTRICTED_APP_CONTEXT = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def restricted_pod(pod_level_seccomp: bool) -> dict[str, Any]:
    """A pod the ``restricted`` profile admits: its rules met per container, or with
    seccomp and runAsNonRoot at pod level (then the sidecar may rely on the pod's)."""
    p = pod({INJECT_ANNOTATION: "true"})
    if pod_level_seccomp:
        p["spec"]["securityContext"] = {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        context = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    else:
        context = RESTRICTED_APP_CONTEXT
    for container in p["spec"]["containers"]:
        container["securityContext"] = copy.deepcopy(context)
    return p


def test_the_restricted_checker_catches_each_rule() -> None:
    """The checker is only as good as what it refuses: one breach per rule."""
    assert restricted_violations(restricted_pod(False)) == []
    breaches = {
        "Privilege Escalation": ("allowPrivilegeEscalation", True),
        "Running as Non-root:": ("runAsNonRoot", False),
        "Running as Non-root user": ("runAsUser", 0),
        "Seccomp": ("seccompProfile", {"type": "Unconfined"}),
        "Capabilities": ("capabilities", {"drop": ["NET_RAW"]}),
        "Privileged Containers": ("privileged", True),
    }
    for rule, (key, value) in breaches.items():
        p = restricted_pod(False)
        p["spec"]["containers"][0]["securityContext"][key] = value
        assert any(v.startswith(rule) for v in restricted_violations(p)), rule
    p = restricted_pod(False)
    del p["spec"]["containers"][1]["securityContext"]["seccompProfile"]
    assert restricted_violations(p)  # neither the container nor the pod sets it
    p = restricted_pod(False)
    p["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": "/"}}]
    assert any(v.startswith("Volume Types") for v in restricted_violations(p))


@pytest.mark.parametrize("pod_level", [False, True], ids=["per-container", "pod-level"])
@pytest.mark.parametrize("config", [NATIVE, PLAIN], ids=["native", "plain"])
def test_restricted_pod_stays_admissible_after_injection(
    config: InjectorConfig, pod_level: bool
) -> None:
    p = restricted_pod(pod_level)
    assert restricted_violations(p) == []
    out = mutate(p, config)
    validate_k8s(out)
    assert restricted_violations(out) == []


def test_sidecar_security_context_is_restricted_by_default() -> None:
    out = mutate(pod(), NATIVE)
    sidecar = out["spec"]["initContainers"][0]
    assert sidecar["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # Alone in a pod that sets nothing itself, the sidecar breaks no restricted rule.
    assert not [v for v in restricted_violations(out) if NATIVE.container_name in v]


def test_security_context_is_configurable(tmp_path: Any) -> None:
    f = tmp_path / "injector.yaml"
    f.write_text(
        "security_context:\n"
        "  run_as_user: 20000\n"
        "  read_only_root_filesystem: null\n"
        "  seccomp_profile: {type: Localhost, localhost_profile: profiles/sidecar.json}\n"
    )
    config = load_injector_config(
        f, environ={"GYM_INJECTOR_SECURITY_CONTEXT__RUN_AS_GROUP": "20000"}
    )
    sidecar = mutate(pod(), config)["spec"][
        "initContainers" if config.native_sidecar() else "containers"
    ][-1]
    assert sidecar["securityContext"] == {
        "runAsNonRoot": True,  # defaults of the keys not set stay
        "runAsUser": 20000,
        "runAsGroup": 20000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/sidecar.json"},
    }
    validate_k8s(mutate(pod(), config))
    with pytest.raises(InjectorConfigError) as err:
        load_injector_config(
            environ={
                "GYM_INJECTOR_SECURITY_CONTEXT__SECCOMP_PROFILE__TYPE": "Localhost",
                "GYM_INJECTOR_SECURITY_CONTEXT__RUNASUSER": "0",
            }
        )
    text = str(err.value)
    assert "security_context.seccomp_profile" in text and "localhost_profile" in text
    assert "security_context.runasuser" in text  # unknown keys are named, not ignored


# --- the agents' span-group poller reaches the configured admin port ----------------------


def test_agent_admin_url_variable_is_the_agents() -> None:
    assert AGENT_ADMIN_URL_ENV == env_vars.GYM_TELEMETRY_SIDECAR_ADMIN_URL


@pytest.mark.parametrize("config", [NATIVE, PLAIN], ids=["native", "plain"])
def test_app_containers_poll_the_configured_admin_port(config: InjectorConfig) -> None:
    """A real sidecar listens on some admin port; the injector is configured with that
    port; the app container's agent, with the environment the injector gave it, gets
    its span groups from that sidecar (as it would over the pod's shared localhost)."""
    with SidecarProcess() as sidecar:
        configured = config.model_copy(update={"admin_port": sidecar.admin_port})
        out = mutate(pod(), configured)
        injected = next(
            c
            for key in ("initContainers", "containers")
            for c in out["spec"].get(key) or []
            if c["name"] == config.container_name
        )
        assert injected["livenessProbe"]["httpGet"]["port"] == sidecar.admin_port
        for app in out["spec"]["containers"]:
            if app["name"] == config.container_name:
                continue
            env = {e["name"]: e["value"] for e in app["env"]}
            url = env[env_vars.GYM_TELEMETRY_SIDECAR_ADMIN_URL]
            assert url == f"http://localhost:{sidecar.admin_port}"
            poller = remote_config.RemoteConfigPoller(
                url, "gym-server", 10.0, apply=lambda groups: None
            )
            assert poller.poll_once(), f"polling {url} failed ({poller.failures} failures)"
            assert poller.last_groups is not None and poller.failures == 0


def test_app_admin_url_set_unless_already_set() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [
        {"name": AGENT_ADMIN_URL_ENV, "value": "http://localhost:9999"}
    ]
    server, helper = mutate(p, InjectorConfig(admin_port=14000))["spec"]["containers"][:2]
    assert {e["name"]: e["value"] for e in server["env"]}[AGENT_ADMIN_URL_ENV] == (
        "http://localhost:9999"
    )
    assert {e["name"]: e["value"] for e in helper["env"]}[AGENT_ADMIN_URL_ENV] == (
        "http://localhost:14000"
    )


# --- a pod volume named like an injected one -----------------------------------------------


def test_colliding_volume_name_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    p = pod()
    p["metadata"]["name"] = "gym-0"
    own = {"name": PODINFO_VOLUME_NAME, "emptyDir": {}}
    p["spec"]["volumes"] = [own]
    with caplog.at_level(logging.WARNING, logger="gym_sidecar.webhook.mutate"):
        out = mutate(p, NATIVE)
    assert [v for v in out["spec"]["volumes"] if v["name"] == PODINFO_VOLUME_NAME] == [own]
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert record.getMessage() == (
        f"pod gym-0 already has a volume named {PODINFO_VOLUME_NAME!r} unlike the injected "
        "one; the sidecar mounts the pod's volume there (rename it, or expect the sidecar's "
        "pod labels and annotations (enrichment) to be wrong)"
    )
    # No collision, no warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gym_sidecar.webhook.mutate"):
        mutate(pod(), NATIVE)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    ("annotation", "namespace", "reason"),
    [
        ("true", False, "pod annotation"),
        ("false", True, "pod annotation opts out"),
        ("yes", True, "pod annotation has unrecognised value 'yes'"),
        (None, True, "namespace label"),
        (None, False, "not opted in"),
    ],
)
def test_each_decision_says_why(annotation: str | None, namespace: bool, reason: str) -> None:
    """The reason is what the webhook logs and counts for each pod: it must name the rule."""
    p = pod({INJECT_ANNOTATION: annotation} if annotation is not None else None)
    assert decide(p, namespace).reason == reason


@pytest.mark.parametrize(("config", "mode"), [(NATIVE, "native-sidecar"), (PLAIN, "container")])
def test_injected_annotation_names_the_mode_and_keeps_the_pods_own(
    config: InjectorConfig, mode: str
) -> None:
    out = mutate(pod({"team": "rl", INJECT_ANNOTATION: "true"}), config)
    assert out["metadata"]["annotations"] == {
        "team": "rl",
        INJECT_ANNOTATION: "true",
        INJECTED_ANNOTATION: mode,
    }
    bare = pod()
    del bare["metadata"]
    assert mutate(bare, config)["metadata"] == {"annotations": {INJECTED_ANNOTATION: mode}}
