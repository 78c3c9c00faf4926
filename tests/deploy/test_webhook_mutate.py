"""The pure injection: opt-in rule, what is added, convergence, version rule."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
from gym_sidecar.enrich.downward_api import (
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
    INJECT_ANNOTATION,
    INJECTED_ANNOTATION,
    decide,
    mutate,
)

from tests.deploy.support import validate_k8s


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
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://localhost:4317"} in server[
        "env"
    ]
    assert helper["env"] == [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://elsewhere:4317"}
    ]


@pytest.mark.parametrize("config", [NATIVE, PLAIN], ids=["native", "plain"])
def test_mutation_is_pure_and_convergent(config: InjectorConfig) -> None:
    p = pod({INJECT_ANNOTATION: "true"})
    before = copy.deepcopy(p)
    once = mutate(p, config)
    assert p == before  # input untouched
    assert mutate(once, config) == once  # a second injection changes nothing


def test_pod_without_containers_is_refused() -> None:
    with pytest.raises(ValueError, match="containers"):
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


def test_fail_open_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    from gym_sidecar.webhook import review

    review._last_warning[0] = float("-inf")
    with caplog.at_level(logging.DEBUG, logger=review.__name__):
        for _ in range(5):
            outcome = review.handle_review(b"not json", NATIVE, namespace_opted_in=False)
            assert outcome.kind == "failed_open" and outcome.review.response is not None
            assert outcome.review.response.allowed
    levels = [r.levelno for r in caplog.records if "without the sidecar" in r.getMessage()]
    assert levels == [logging.WARNING] + [logging.DEBUG] * 4
