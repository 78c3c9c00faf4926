"""deploy/k8s: rendered kustomizations and plain manifests against the Kubernetes schemas,
plus the cross-references a schema cannot see (names, paths, ports, configs)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from gym_sidecar.config import load_config
from gym_sidecar.webhook.config import InjectorConfig, load_injector_config
from gym_sidecar.webhook.mutate import INJECT_ANNOTATION, decide, mutate
from gym_sidecar.webhook.server import NAMESPACE_OPT_IN_PATH, POD_OPT_IN_PATH, InjectorServer

from tests.deploy.pod_security import restricted_violations
from tests.deploy.support import K8S, REPO, render, validate_k8s

# The first render builds kubectl (with kube-apiserver and etcd): minutes on a cold machine.
pytestmark = pytest.mark.timeout(3600)

KUSTOMIZATIONS = ["base", "overlays/gym-namespace", "overlays/self-signed-tls"]
CERT_MANAGER = "cert-manager.io/v1"


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {len(matches)}"
    return matches[0]


def check_cert_manager(obj: dict[str, Any]) -> None:
    """cert-manager CRDs are not in the Kubernetes schemas: check the fields we rely on."""
    spec = obj["spec"]
    if obj["kind"] == "Issuer":
        assert set(spec) == {"selfSigned"}
    else:
        assert obj["kind"] == "Certificate"
        assert spec["secretName"] and spec["dnsNames"]
        assert spec["issuerRef"]["kind"] == "Issuer" and spec["issuerRef"]["name"]


def validate_all(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        if obj["apiVersion"] == CERT_MANAGER:
            check_cert_manager(obj)
        else:
            validate_k8s(obj)


def plain_manifests() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                out.append((path, doc))
    return out


def test_every_plain_manifest_is_valid() -> None:
    """Works without kustomize: each resource file on its own."""
    manifests = plain_manifests()
    assert len(manifests) >= 11
    for path, obj in manifests:
        try:
            validate_all([obj])
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.relative_to(REPO)}: {exc.message} at {list(exc.path)}")


def test_webhook_entries_set_every_field_explicitly() -> None:
    """Without kustomize too: each webhook entry names failurePolicy (fail open),
    timeoutSeconds, namespaceSelector and objectSelector itself, never by default, and
    calls one of the injector's two paths."""
    [mwc] = [
        obj
        for path, obj in plain_manifests()
        if obj["kind"] == "MutatingWebhookConfiguration" and path.parent.name == "base"
    ]
    paths = set()
    for hook in mwc["webhooks"]:
        missing = {
            "failurePolicy",
            "timeoutSeconds",
            "namespaceSelector",
            "objectSelector",
            "sideEffects",
            "admissionReviewVersions",
            "reinvocationPolicy",
        } - set(hook)
        assert not missing, f"{hook['name']}: {sorted(missing)} left to the API server"
        assert hook["failurePolicy"] == "Ignore"
        assert 1 <= hook["timeoutSeconds"] <= 10
        assert hook["namespaceSelector"] and hook["objectSelector"]
        assert hook["admissionReviewVersions"] == ["v1"]
        assert [r["operations"] for r in hook["rules"]] == [["CREATE"]]
        paths.add(hook["clientConfig"]["service"]["path"])
    assert paths == {POD_OPT_IN_PATH, NAMESPACE_OPT_IN_PATH}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_rendered_kustomization_is_valid(kustomization: str) -> None:
    objs = render(kustomization)
    assert objs
    validate_all(objs)


def test_webhook_configuration_points_at_the_injector() -> None:
    objs = render("base")
    mwc = find(objs, "MutatingWebhookConfiguration")
    service = find(objs, "Service", "gym-telemetry-injector")
    cert = find(objs, "Certificate")
    ns = service["metadata"]["namespace"]
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{ns}/{cert['metadata']['name']}"
    )
    assert f"{service['metadata']['name']}.{ns}.svc" in cert["spec"]["dnsNames"]
    paths = set()
    for hook in mwc["webhooks"]:
        assert hook["failurePolicy"] == "Ignore"  # fail open
        assert 1 <= hook["timeoutSeconds"] <= 10
        assert hook["sideEffects"] == "None"
        assert hook["namespaceSelector"] and hook["objectSelector"]
        svc = hook["clientConfig"]["service"]
        assert (svc["name"], svc["namespace"]) == (service["metadata"]["name"], ns)
        assert svc["port"] == service["spec"]["ports"][0]["port"]
        paths.add(svc["path"])
    assert paths == {POD_OPT_IN_PATH, NAMESPACE_OPT_IN_PATH}

    deployment = find(objs, "Deployment", "gym-telemetry-injector")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[INJECT_ANNOTATION] == "false"  # excluded by every objectSelector
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"]
    assert not deployment["spec"]["template"]["spec"]["automountServiceAccountToken"]
    assert not [o for o in objs if o["kind"] in {"Role", "ClusterRole"}]  # needs no API


def injector_config(objs: list[dict[str, Any]], tmp_path: Path) -> InjectorConfig:
    cm = next(o for o in objs if o["metadata"]["name"].startswith("gym-telemetry-injector-"))
    f = tmp_path / "injector.yaml"
    f.write_text(cm["data"]["injector.yaml"])
    return load_injector_config(f, environ={})


@pytest.mark.parametrize("kustomization", ["base", "overlays/gym-namespace"])
def test_sidecar_config_maps_load(kustomization: str, tmp_path: Path) -> None:
    """The ConfigMap's sidecar.yaml passes the sidecar's own config validation."""
    cm = find(render(kustomization), "ConfigMap", "gym-telemetry-sidecar")
    [(key, text)] = cm["data"].items()
    assert key == InjectorConfig().config_key
    f = tmp_path / key
    f.write_text(text)
    config = load_config(f, environ={})
    assert config.backend.url and config.span_groups.spec


def overlay_pods(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``kind/name`` -> the pod every Deployment and Job of ``objs`` would create."""
    return {
        f"{o['kind']}/{o['metadata']['name']}": {
            "apiVersion": "v1",
            "kind": "Pod",
            **o["spec"]["template"],
        }
        for o in objs
        if o["kind"] in {"Deployment", "Job"}
    }


def test_overlay_pods_injected_with_the_base_config_are_valid(tmp_path: Path) -> None:
    """Every pod of the example goes through the project's own webhook mutation (with
    the base's injector config) and stays valid and admissible in its namespace, which
    enforces the restricted Pod Security Standard."""
    config = injector_config(render("base"), tmp_path)
    assert config.config_map == "gym-telemetry-sidecar"
    assert config.native_sidecar()
    overlay = render("overlays/gym-namespace")
    namespace = find(overlay, "Namespace")
    assert namespace["metadata"]["labels"][INJECT_ANNOTATION] == "true"
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = overlay_pods(overlay)
    assert set(pods) == {
        "Deployment/stub-model",
        "Deployment/tool-server",
        "Deployment/simple-agent",
        "Job/rollouts",
    }
    for where, pod in pods.items():
        assert restricted_violations(pod) == [], where
        assert decide(pod, namespace_opted_in=True).inject
        injected = mutate(pod, config)
        validate_k8s(injected)
        assert restricted_violations(injected) == [], where
        sidecar = injected["spec"]["initContainers"][0]
        assert sidecar["restartPolicy"] == "Always"
        secret_env = [e for e in sidecar["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        assert secret_env[0]["name"] == "GYM_SIDECAR_SPAN_GROUPS__TOKEN"
        assert secret_env[0]["valueFrom"]["secretKeyRef"]["optional"] is True


def test_gym_servers_find_their_config_and_each_other() -> None:
    """What a schema cannot see: each server's ConfigMap is rendered (not optional), its
    args name a file of it and a server of that config, and every server's host:port
    in the config is its Service; the Job's driver calls the agent's Service."""
    overlay = render("overlays/gym-namespace")
    config_maps = {o["metadata"]["name"]: o for o in overlay if o["kind"] == "ConfigMap"}
    services = {
        o["metadata"]["name"]: o["spec"]["ports"][0]["port"]
        for o in overlay
        if o["kind"] == "Service"
    }
    gym_config: dict[str, Any] | None = None
    served: dict[str, str] = {}
    for where, pod in overlay_pods(overlay).items():
        if where.startswith("Job/"):
            continue
        [container] = pod["spec"]["containers"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        config_file, server = container["args"]
        [mount] = [m for m in container["volumeMounts"] if config_file.startswith(m["mountPath"])]
        source = volumes[mount["name"]]["configMap"]
        assert not source.get("optional"), f"{where}: a missing config must not start"
        data = config_maps[source["name"]]["data"]
        key = config_file[len(mount["mountPath"]) :].lstrip("/")
        assert key in data, f"{where}: {config_file} is not in ConfigMap {source['name']}"
        gym_config = yaml.safe_load(data[key])
        assert isinstance(gym_config, dict) and server in gym_config, where
        served[server] = where.split("/", 1)[1]
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        assert env.get("GYM_SERVER_BIND_HOST") == "0.0.0.0", where
    assert gym_config is not None
    for server, deployment in served.items():
        [(_kind, impls)] = gym_config[server].items()
        [(_impl, settings)] = impls.items()
        assert (settings["host"], settings["port"]) == (deployment, services[deployment])
    driver = overlay_pods(overlay)["Job/rollouts"]["spec"]["containers"][0]
    agent_url = {e["name"]: e["value"] for e in driver["env"]}["AGENT_URL"]
    assert agent_url == f"http://simple-agent:{services['simple-agent']}"


def test_injected_sidecar_environment_loads_in_the_sidecar(tmp_path: Path) -> None:
    """The variables the injector sets plus the namespace's ConfigMap make a config the
    sidecar accepts (``gym-sidecar check-config``), with the admin port reachable."""
    config = injector_config(render("base"), tmp_path)
    cm = find(render("overlays/gym-namespace"), "ConfigMap", "gym-telemetry-sidecar")
    config_file = tmp_path / config.config_key
    config_file.write_text(cm["data"][config.config_key])
    template = find(render("overlays/gym-namespace"), "Deployment", "simple-agent")
    pod = mutate({"apiVersion": "v1", "kind": "Pod", **template["spec"]["template"]}, config)
    sidecar = pod["spec"]["initContainers"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_SIDECAR_")}
    for var in sidecar["env"]:
        # What the kubelet would fill in from the downward API and the Secret.
        env[var["name"]] = var.get("value", f"from-{var['name'].lower()}")
    assert env.pop("GYM_SIDECAR_CONFIG").startswith("/etc/gym-sidecar/")
    result = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "check-config", str(config_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert effective["admin_listen"] == f"0.0.0.0:{config.admin_port}"
    assert effective["span_groups"]["spec"] == "per_rollout"


def test_self_signed_alternative(tmp_path: Path) -> None:
    """self-signed.sh makes a CA and a serving cert the injector serves and a client
    trusting only that CA accepts under the Service's DNS name; its caBundle patch
    applies to the rendered webhook configuration."""
    out = tmp_path / "tls"
    subprocess.run(
        ["bash", str(K8S / "tls" / "self-signed.sh"), str(out)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    leaf = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    host = "gym-telemetry-injector.gym-telemetry.svc"
    assert host in sans.value.get_values_for_type(x509.DNSName)

    config = InjectorConfig(
        listen="127.0.0.1:0", cert_file=str(out / "tls.crt"), key_file=str(out / "tls.key")
    )

    def handshake(port: int) -> str:
        ctx = ssl.create_default_context(cafile=str(out / "ca.crt"))
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return str(tls.version())

    async def scenario() -> str:
        server = InjectorServer(config)
        await server.start()
        try:
            return await asyncio.to_thread(handshake, int(server.port or 0))
        finally:
            await server.stop()

    assert asyncio.run(scenario()).startswith("TLS")

    mwc = find(render("overlays/self-signed-tls"), "MutatingWebhookConfiguration")
    assert "cert-manager.io/inject-ca-from" not in mwc["metadata"].get("annotations", {})
    patched = jsonpatch.apply_patch(mwc, json.loads((out / "cabundle-patch.json").read_text()))
    validate_k8s(patched)
    for hook in patched["webhooks"]:
        bundle = base64.b64decode(hook["clientConfig"]["caBundle"])
        assert bundle == (out / "ca.crt").read_bytes()
