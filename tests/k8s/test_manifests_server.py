"""Every manifest the project ships, accepted by a real kube-apiserver (v1.37.2).

Discovered, not listed: every directory under ``deploy/`` holding a
``kustomization.yaml`` is rendered with ``kubectl kustomize`` and applied with
server-side apply in ``--dry-run=server`` mode (the API server's decoding, strict field
validation, defaulting and admission run; nothing is persisted, so no webhook
configuration pointing at a Service the test cannot serve goes live); every other YAML
file under ``deploy/`` holding Kubernetes objects is applied on its own the same way.
New manifests and overlays are covered as soon as they exist.

The namespaces the objects name are created for real first (a dry-run namespace does
not exist for the objects in it). cert-manager's ``Certificate`` and ``Issuer`` need
its CRDs: the test installs minimal ones of its own that accept any spec, so only
cert-manager's group/version/kind and metadata are checked there, not its schema.

The API server is the judge; where ``kubernetes-validate`` (offline schemas, Kubernetes
1.29) disagrees, the difference is printed and documented in docs/deployment.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.support import validate_k8s
from tests.k8s.conftest import render
from tests.support.control_plane import ControlPlane

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def kustomizations() -> list[str]:
    return sorted(str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.y*ml"))


def manifest_files() -> list[str]:
    """YAML files under deploy/ with at least one Kubernetes object (not kustomizations)."""
    found = []
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        if path.name.startswith("kustomization."):
            continue
        try:
            docs = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError:
            continue
        if any(isinstance(d, dict) and {"apiVersion", "kind", "metadata"} <= set(d) for d in docs):
            found.append(str(path.relative_to(DEPLOY)))
    return found


def test_discovery_finds_the_shipped_manifests() -> None:
    """The discovery is not vacuous: today's base, sidecar and both overlays are in it."""
    assert {
        "k8s/base",
        "k8s/sidecar",
        "k8s/overlays/gym-namespace",
        "k8s/overlays/self-signed-tls",
    } <= set(kustomizations())
    assert "k8s/base/mutatingwebhookconfiguration.yaml" in manifest_files()
    assert not [f for f in manifest_files() if f.startswith("compose/")]


def _crd(kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def server(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with stand-in cert-manager CRDs (any spec) established."""
    crds = [_crd("Certificate", "certificates"), _crd("Issuer", "issuers")]
    control_plane.apply_json("apply", "--server-side", obj=crds)
    for crd in crds:
        control_plane.kubectl(
            "wait", "--for=condition=Established", "--timeout=120s", "crd", crd["metadata"]["name"]
        )
    return control_plane


def _cluster_scoped_kinds(plane: ControlPlane) -> set[str]:
    out = plane.kubectl("api-resources", "--namespaced=false", "--no-headers").stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def _is_subset(sent: Any, got: Any, where: str = "") -> list[str]:
    """Where the API server's answer lost or changed something that was sent."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [f"{where}: became {got!r}"]
        return [m for k, v in sent.items() for m in _is_subset(v, got.get(k), f"{where}.{k}")]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) != len(sent):
            return [f"{where}: list became {got!r}"]
        return [m for i, v in enumerate(sent) for m in _is_subset(v, got[i], f"{where}[{i}]")]
    return [] if str(sent) == str(got) else [f"{where}: {sent!r} became {got!r}"]


def _server_apply(plane: ControlPlane, objs: list[dict[str, Any]]) -> tuple[list[Any], str]:
    """Create the namespaces, dry-run server-side-apply the rest; (answers, warnings)."""
    cluster_scoped = _cluster_scoped_kinds(plane)
    namespaces = {o["metadata"]["namespace"] for o in objs if o["metadata"].get("namespace")}
    namespaces |= {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    for name in sorted(namespaces):
        plane.kubectl("create", "namespace", name, check=False)  # may exist: fine
    for o in objs:
        if o["kind"] not in cluster_scoped and not o["metadata"].get("namespace"):
            o["metadata"]["namespace"] = "default"
    out = plane.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=gym-telemetry-test",
        "-f",
        "-",
        "-o",
        "json",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    items = answer["items"] if answer.get("kind") == "List" else [answer]
    return items, out.stderr


def _kubernetes_validate_notes(objs: list[dict[str, Any]]) -> list[str]:
    notes = []
    for o in objs:
        if o["apiVersion"].startswith("cert-manager.io/"):
            continue
        try:
            validate_k8s(o)
        except kubernetes_validate.ValidationError as exc:
            notes.append(f"{o['kind']}/{o['metadata']['name']}: {exc.message}")
    return notes


def _check_accepted(plane: ControlPlane, objs: list[dict[str, Any]], what: str) -> None:
    sent = json.loads(json.dumps(objs))
    got, warnings = _server_apply(plane, objs)
    assert len(got) == len(sent), what
    for before, after in zip(sent, got, strict=True):
        assert (after["kind"], after["metadata"]["name"]) == (
            before["kind"],
            before["metadata"]["name"],
        )
        lost = _is_subset(before, after)
        assert not lost, f"{what}: the API server dropped or changed {lost}"
    # The real PodSecurity plugin also evaluates workload templates in enforcing
    # namespaces (as warnings): none may be raised.
    assert "PodSecurity" not in warnings, f"{what}: {warnings}"
    assert "unknown field" not in warnings, f"{what}: {warnings}"
    for note in _kubernetes_validate_notes(sent):
        print(f"{what}: accepted by the API server, refused by kubernetes-validate: {note}")


@pytest.mark.parametrize("kustomization", kustomizations())
def test_every_kustomization_is_accepted(server: ControlPlane, kustomization: str) -> None:
    objs = render(server, DEPLOY / kustomization)
    assert objs
    _check_accepted(server, objs, kustomization)


@pytest.mark.parametrize("manifest", manifest_files())
def test_every_manifest_file_is_accepted_on_its_own(server: ControlPlane, manifest: str) -> None:
    docs = [
        d
        for d in yaml.safe_load_all((DEPLOY / manifest).read_text())
        if isinstance(d, dict) and "kind" in d
    ]
    _check_accepted(server, docs, manifest)
