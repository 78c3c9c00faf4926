"""deploy/gateway: the Kubernetes manifests against the Kubernetes schemas and the Pod
Security ``restricted`` profile, their cross-references to the configs, and the compose
override's wiring. No binary needed (the configs are started in test_gateway_configs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.pod_security import restricted_violations
from tests.deploy.support import REPO, validate_k8s
from tests.support.kustomize import KustomizeUnavailable, kustomize_build

pytestmark = pytest.mark.timeout(1800)  # the first kustomize build takes minutes

GATEWAY = REPO / "deploy" / "gateway"
PLAIN = sorted((GATEWAY / "k8s").glob("*.yaml"))


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    try:
        out = kustomize_build(GATEWAY)
    except KustomizeUnavailable as exc:
        pytest.skip(f"kustomize unavailable: {exc}")
    return [d for d in yaml.safe_load_all(out) if d]


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [obj] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


@pytest.mark.parametrize("path", PLAIN, ids=[p.name for p in PLAIN])
def test_plain_manifests_are_valid(path: Path) -> None:
    for obj in _docs(path):
        try:
            validate_k8s(obj)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {exc.message} at {list(exc.path)}")


def test_rendered_objects_are_valid_and_restricted(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in rendered)
    assert [k for k, _ in kinds].count("Deployment") == 2
    assert [k for k, _ in kinds].count("ConfigMap") == 2
    for obj in rendered:
        validate_k8s(obj)
        if obj["kind"] == "Deployment":
            pod = {"apiVersion": "v1", "kind": "Pod", **obj["spec"]["template"]}
            assert restricted_violations(pod) == [], obj["metadata"]["name"]
            for container in obj["spec"]["template"]["spec"]["containers"]:
                assert container["resources"]["requests"], obj["metadata"]["name"]


def test_configmaps_carry_the_repository_configs(rendered: list[dict[str, Any]]) -> None:
    for tier, source in (("tier1", "tier1-dns.yaml"), ("tier2", "tier2.yaml")):
        [cm] = [
            o
            for o in rendered
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith(f"gym-gateway-{tier}")
        ]
        assert cm["data"]["config.yaml"] == (GATEWAY / source).read_text()
        deployment = _one(rendered, "Deployment", f"gym-gateway-{tier}")
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert volumes[0]["configMap"]["name"] == cm["metadata"]["name"]  # hash suffix followed


def test_tier1_resolves_the_headless_tier2_service(rendered: list[dict[str, Any]]) -> None:
    service = _one(rendered, "Service", "gym-gateway-tier2")
    assert service["spec"]["clusterIP"] == "None"
    tier2 = _one(rendered, "Deployment", "gym-gateway-tier2")
    assert service["spec"]["selector"] == tier2["spec"]["selector"]["matchLabels"]
    tier1 = _one(rendered, "Deployment", "gym-gateway-tier1")
    env = {e["name"]: e["value"] for e in tier1["spec"]["template"]["spec"]["containers"][0]["env"]}
    namespace = service["metadata"]["namespace"]
    assert env["GATEWAY_TIER2_SERVICE"] == f"gym-gateway-tier2.{namespace}.svc.cluster.local"
    [port] = service["spec"]["ports"]
    assert env["GATEWAY_TIER2_PORT"] == str(port["port"])
    config = yaml.safe_load((GATEWAY / "tier1-dns.yaml").read_text())
    resolver = config["exporters"]["load_balancing"]["resolver"]
    assert set(resolver) == {"dns"}
    assert resolver["dns"]["hostname"] == "${env:GATEWAY_TIER2_SERVICE}"


def test_compose_override_adds_both_tiers() -> None:
    compose = yaml.safe_load((REPO / "deploy" / "compose" / "gateway.yaml").read_text())
    services = compose["services"]
    assert {"gateway-tier1", "gateway-tier2a", "gateway-tier2b"} <= set(services)
    tier1_env = services["gateway-tier1"]["environment"]
    hostnames = yaml.safe_load(tier1_env["GATEWAY_TIER2_ENDPOINTS"])
    assert hostnames == ["gateway-tier2a:4317", "gateway-tier2b:4317"]
    # every sidecar's backend is tier 1, nothing else changed
    base = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    sidecars = {name for name in base if name.endswith("-sidecar")}
    assert sidecars and sidecars <= set(services)
    for name in sidecars:
        assert services[name]["environment"] == {"GYM_SIDECAR_BACKEND": "http://gateway-tier1:4317"}
