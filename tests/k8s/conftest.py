"""Fixtures of the real-control-plane tests: one etcd + kube-apiserver per session, the
real injector (``gym-sidecar webhook``) behind it, registered by the project's own
MutatingWebhookConfiguration.

A control plane that cannot be built or started fails the test on CI (``CI=true``) with
the component's log tail, and skips it elsewhere with that reason (``-ra`` prints it).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.control_plane import (
    CertificateAuthority,
    ControlPlane,
    ControlPlaneError,
    log_tail,
    on_ci,
)
from tests.support.ports import free_port, wait_listening

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
INJECT = "telemetry.nemo-gym.io/inject"
INJECTED = "telemetry.nemo-gym.io/injected"
MWC_NAME = "gym-telemetry-injector"
CONVERGE_TIMEOUT_S = 90.0
"""How long the API server may take to see a new or changed webhook configuration (its
informer) on a loaded machine."""


def _unavailable(reason: str) -> None:
    if on_ci():
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("control-plane")
    try:
        plane = ControlPlane(workdir)
        plane.start()
    except ControlPlaneError as exc:
        _unavailable(f"no Kubernetes control plane: {exc}")
        raise  # unreachable: pytest.fail/skip raise
    try:
        yield plane
    finally:
        plane.stop()


def render(plane: ControlPlane, kustomization: Path | str) -> list[dict[str, Any]]:
    """``kubectl kustomize`` (the kustomize embedded in the kubectl built here) of a
    directory (relative: under deploy/k8s)."""
    out = plane.kubectl("kustomize", str(K8S / kustomization)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pod(
    name: str,
    annotations: dict[str, str] | None = None,
    *,
    containers: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A two-container pod (``app`` and ``helper``) with the restricted profile met by
    each container, unless ``containers`` says otherwise."""
    restricted = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if containers is None:
        containers = [
            {
                "name": "app",
                "image": "gym-server:0.1.0",
                "env": [{"name": "APP_MODE", "value": "serve"}],
                "securityContext": dict(restricted),
            },
            {"name": "helper", "image": "busybox:1.36", "securityContext": dict(restricted)},
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"containers": containers, **spec},
    }


def is_injected(stored: dict[str, Any]) -> bool:
    return INJECTED in (stored["metadata"].get("annotations") or {})


class Injector:
    """``gym-sidecar webhook`` on a free loopback port, TLS from a throwaway CA, with the
    injector config the base kustomization ships (its ConfigMap's ``injector.yaml``)."""

    def __init__(self, workdir: Path, config_text: str) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority("gym-telemetry injector test CA")
        self.cert, self.key = self.ca.issue(workdir, "tls", "injector", ips=["127.0.0.1"])
        self.config = workdir / "injector.yaml"
        self.config.write_text(config_text)
        self.port = free_port()
        self.log = workdir / "injector.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        from tests.support.control_plane import kubernetes_version

        env = {k: v for k, v in os.environ.items() if not k.startswith("GYM_INJECTOR_")}
        # Rotation is watched every 60 s in the shipped config; a test waits less.
        env["GYM_INJECTOR_CERT_RELOAD_INTERVAL_S"] = "0.5"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gym_sidecar.cli",
                    "webhook",
                    f"--config={self.config}",
                    f"--listen=127.0.0.1:{self.port}",
                    f"--cert={self.cert}",
                    f"--key={self.key}",
                    f"--kubernetes-version={kubernetes_version()}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        try:
            wait_listening(self.port, timeout_s=60)
        except TimeoutError:
            self.stop()
            raise AssertionError(f"the injector did not listen: {log_tail(self.log)}") from None

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, never answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None


def webhook_configuration(
    plane: ControlPlane, injector: Injector, ca_pem: bytes | None = None
) -> dict[str, Any]:
    """The project's MutatingWebhookConfiguration, rendered from
    ``deploy/k8s/overlays/self-signed-tls`` (the base without cert-manager), with the one
    substitution a loopback test needs: each entry's ``clientConfig.service`` (the
    injector's Service, which needs a cluster network) becomes ``clientConfig.url`` of
    the injector on 127.0.0.1 at the same path; and its CA bundle patched in, as
    ``deploy/k8s/tls/self-signed.sh`` does."""
    [mwc] = [
        o
        for o in render(plane, "overlays/self-signed-tls")
        if o["kind"] == "MutatingWebhookConfiguration"
    ]
    bundle = base64.b64encode(ca_pem or injector.ca.pem()).decode()
    for hook in mwc["webhooks"]:
        service = hook["clientConfig"].pop("service")
        hook["clientConfig"] = {"url": injector.url(service["path"]), "caBundle": bundle}
    return mwc


def dry_run_pod(plane: ControlPlane, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    stored: dict[str, Any] = plane.apply_json(
        "create", "--dry-run=server", "-n", namespace, obj=body
    )
    return stored


def wait_until_injecting(plane: ControlPlane, namespace: str, want: bool = True) -> None:
    """Poll with server-side dry-run pods until the API server's view of the webhook
    configuration (an informer, updated asynchronously) injects (or not)."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    probe = pod(new_name("probe"), {INJECT: "true"})
    while True:
        if is_injected(dry_run_pod(plane, namespace, probe)) == want:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the API server did not {'start' if want else 'stop'} calling the injector "
                f"within {CONVERGE_TIMEOUT_S:.0f} s"
            )
        time.sleep(0.5)


def register(plane: ControlPlane, mwc: dict[str, Any]) -> None:
    plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(mwc))


@pytest.fixture(scope="session")
def injector_config_text(control_plane: ControlPlane) -> str:
    objs = render(control_plane, "base")
    [cm] = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("gym-telemetry-injector")
    ]
    text: str = cm["data"]["injector.yaml"]
    return text


@pytest.fixture
def injector(
    control_plane: ControlPlane, injector_config_text: str, tmp_path: Path
) -> Iterator[Injector]:
    """The real injector, registered; unregistered and stopped afterwards."""
    proc = Injector(tmp_path / "injector", injector_config_text)
    proc.start()
    try:
        register(control_plane, webhook_configuration(control_plane, proc))
        yield proc
    finally:
        control_plane.kubectl("delete", "mutatingwebhookconfiguration", MWC_NAME, check=False)
        proc.stop()


@pytest.fixture
def namespace(control_plane: ControlPlane, injector: Injector) -> str:
    """A plain namespace (pods opt in by annotation) where injection already works."""
    name = control_plane.namespace(new_name("plain"))
    wait_until_injecting(control_plane, name)
    return name


@pytest.fixture
def restricted_namespace(control_plane: ControlPlane, injector: Injector) -> str:
    """A namespace enforcing the ``restricted`` Pod Security Standard."""
    name = control_plane.namespace(
        new_name("restricted"), {"pod-security.kubernetes.io/enforce": "restricted"}
    )
    wait_until_injecting(control_plane, name)
    return name
