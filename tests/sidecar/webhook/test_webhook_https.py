"""The injector as users run it: ``gym-sidecar webhook`` over real HTTPS.

Each case sends a real AdmissionReview v1, applies the returned JSON patch with
jsonpatch and validates the resulting pod against the Kubernetes 1.29 OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from gym_sidecar.webhook.config import InjectorConfig
from gym_sidecar.webhook.mutate import INJECT_ANNOTATION, INJECTED_ANNOTATION, mutate
from gym_sidecar.webhook.server import (
    NAMESPACE_OPT_IN_PATH,
    POD_OPT_IN_PATH,
    CertificateReloader,
    InjectorServer,
)

from testkit.wait import wait_for_async
from tests.deploy.support import validate_k8s, write_self_signed
from tests.support.ports import free_port, wait_listening

SIDECAR = "gym-telemetry-sidecar"


class Webhook:
    def __init__(self, port: int, cert: Path) -> None:
        self.base = f"https://127.0.0.1:{port}"
        self.tls = ssl.create_default_context(cafile=str(cert))

    def post(self, path: str, body: bytes) -> dict[str, Any]:
        req = urllib.request.Request(
            self.base + path, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, context=self.tls, timeout=10) as resp:
            assert resp.status == 200
            answer: dict[str, Any] = json.loads(resp.read())
        return answer

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.base + path, context=self.tls, timeout=10) as resp:
            text: str = resp.read().decode()
        return text


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    cert, key = write_self_signed(tmp_path_factory.mktemp("tls"))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gym_sidecar.cli", "webhook",
            "--listen", f"127.0.0.1:{port}", "--cert", str(cert), "--key", str(key),
            "--kubernetes-version", "v1.29.4", "--image", "sidecar:test",
        ],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_listening(port, timeout_s=60)
        yield Webhook(port, cert)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err.decode()


def review(pod: dict[str, Any], namespace: str = "gym", kind: str = "Pod") -> tuple[str, bytes]:
    uid = str(uuid.uuid4())
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    return uid, json.dumps(body).encode()


def deployment_pod(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "simple-agent-7c9f-",
            "namespace": "gym",
            "labels": {"app": "simple-agent", "pod-template-hash": "7c9f"},
            "annotations": annotations if annotations is not None else {INJECT_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "simple-agent-7c9f",
                    "uid": "0c5a5d3e-1111-4a4a-9d9d-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "gym-server",
                    "image": "gym-server:0.1",
                    "args": ["simple_agent"],
                    "ports": [{"containerPort": 8000}],
                    "env": [{"name": "GYM_TELEMETRY", "value": "1"}],
                }
            ],
            "serviceAccountName": "default",
        },
    }


def job_pod() -> dict[str, Any]:
    pod = deployment_pod()
    pod["metadata"]["generateName"] = "rollouts-"
    pod["metadata"]["labels"] = {"job-name": "rollouts", "batch.kubernetes.io/job-name": "rollouts"}
    pod["metadata"]["ownerReferences"][0].update(kind="Job", apiVersion="batch/v1", name="rollouts")
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["containers"][0]["name"] = "driver"
    return pod


def applied(pod: dict[str, Any], answer: dict[str, Any], uid: str) -> dict[str, Any]:
    """Check the envelope, apply the patch (if any), validate the result; return it."""
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == uid
    assert response["allowed"] is True
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    validate_k8s(result)
    return result


def sidecars(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return [c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == SIDECAR]


def test_deployment_pod_gets_native_sidecar(webhook: Webhook) -> None:
    pod = deployment_pod()
    uid, body = review(pod)
    out = applied(pod, webhook.post(POD_OPT_IN_PATH, body), uid)
    [sidecar] = sidecars(out)
    assert out["spec"]["initContainers"][0] is sidecar
    assert sidecar["restartPolicy"] == "Always" and sidecar["image"] == "sidecar:test"
    env = {e["name"]: e.get("value") for e in out["spec"]["containers"][0]["env"]}
    assert env == {
        "GYM_TELEMETRY": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "GYM_TELEMETRY_SIDECAR_ADMIN_URL": "http://localhost:13133",
    }
    assert out["metadata"]["annotations"][INJECTED_ANNOTATION] == "native-sidecar"


def test_job_pod_gets_native_sidecar_so_it_can_complete(webhook: Webhook) -> None:
    pod = job_pod()
    uid, body = review(pod)
    out = applied(pod, webhook.post(POD_OPT_IN_PATH, body), uid)
    # A native sidecar is an init container: the Job completes when "driver" exits.
    assert [c["name"] for c in out["spec"]["containers"]] == ["driver"]
    assert sidecars(out)[0]["restartPolicy"] == "Always"
    assert out["spec"]["restartPolicy"] == "Never"


def test_already_injected_pod_is_left_alone(webhook: Webhook) -> None:
    pod = mutate(deployment_pod(), InjectorConfig(sidecar_mode="native", image="sidecar:test"))
    uid, body = review(pod)
    answer = webhook.post(POD_OPT_IN_PATH, body)
    assert "patch" not in answer["response"]
    assert len(sidecars(applied(pod, answer, uid))) == 1


def test_pod_without_annotation_is_not_injected(webhook: Webhook) -> None:
    pod = deployment_pod(annotations={})
    uid, body = review(pod)
    answer = webhook.post(POD_OPT_IN_PATH, body)
    assert "patch" not in answer["response"]
    assert sidecars(applied(pod, answer, uid)) == []


def test_pod_in_opted_in_namespace_is_injected_unless_it_opts_out(webhook: Webhook) -> None:
    pod = deployment_pod(annotations={})
    del pod["metadata"]["annotations"]  # the patch must create the map
    uid, body = review(pod)
    out = applied(pod, webhook.post(NAMESPACE_OPT_IN_PATH, body), uid)
    assert len(sidecars(out)) == 1
    assert out["metadata"]["annotations"] == {INJECTED_ANNOTATION: "native-sidecar"}

    opted_out = deployment_pod(annotations={INJECT_ANNOTATION: "false"})
    uid, body = review(opted_out)
    answer = webhook.post(NAMESPACE_OPT_IN_PATH, body)
    assert "patch" not in answer["response"]


@pytest.mark.parametrize(
    "body",
    [
        b"this is not json",
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"uid": "u-1", "kind": {"kind": "Pod"}, "operation": "CREATE", '
        b'"object": {"metadata": {"annotations": {"telemetry.nemo-gym.io/inject": "true"}}}}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"uid": "u-2", "kind": {"kind": "Pod"}, "operation": "CREATE", '
        b'"object": ["not", "a", "pod"]}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"uid": "u-3", "kind": {"kind": "Pod"}, "operation": "CREATE", '
        b'"object": {"metadata": "not a mapping", "spec": {"containers": []}}}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
        b'"request": {"uid": "u-4", "kind": {"kind": "Pod"}, "operation": "CREATE", '
        b'"object": {"metadata": {"annotations": {"telemetry.nemo-gym.io/inject": "true"}}, '
        b'"spec": {"containers": ["not a container"]}}}}',
    ],
    ids=[
        "not-json",
        "no-request",
        "pod-without-spec",
        "object-not-a-mapping",
        "metadata-not-a-mapping",
        "container-not-a-mapping",
    ],
)
def test_malformed_review_fails_open(webhook: Webhook, body: bytes) -> None:
    response = webhook.post(POD_OPT_IN_PATH, body)["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    assert response["warnings"] and "not injected" in response["warnings"][0]
    if b'"u-' in body:
        assert response["uid"].startswith("u-")  # the answer still matches its request


def test_counters_and_health(webhook: Webhook) -> None:
    pod = deployment_pod()
    _uid, body = review(pod)
    webhook.post(POD_OPT_IN_PATH, body)
    webhook.post(POD_OPT_IN_PATH, b"{")
    assert webhook.get("/healthz") == "ok\n"
    metrics = webhook.get("/metrics")
    assert 'gym_injector_reviews_total{outcome="injected",route="pod-opt-in"}' in metrics
    assert 'gym_injector_reviews_total{outcome="failed_open",route="pod-opt-in"}' in metrics


def test_oversized_review_fails_open(tmp_path: Path) -> None:
    cert, key = write_self_signed(tmp_path)
    config = InjectorConfig(
        listen="127.0.0.1:0", cert_file=str(cert), key_file=str(key), max_request_bytes=1024
    )

    async def scenario() -> dict[str, Any]:
        server = InjectorServer(config)
        await server.start()
        try:
            _, body = review(deployment_pod())
            hook = Webhook(int(server.port or 0), cert)
            return await asyncio.to_thread(hook.post, POD_OPT_IN_PATH, body)
        finally:
            await server.stop()
            await server.stop()  # idempotent

    response = asyncio.run(scenario())["response"]
    assert response["allowed"] is True and "patch" not in response
    assert "max_request_bytes" in response["warnings"][0]


def served_cert(port: int) -> bytes:
    """The DER certificate the server on ``port`` presents now (a fresh handshake)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_rotated_certificate_is_served_without_restart(tmp_path: Path) -> None:
    cert, key = write_self_signed(tmp_path / "a", common_name="first")
    config = InjectorConfig(
        listen="127.0.0.1:0", cert_file=str(cert), key_file=str(key), cert_reload_interval_s=0.05
    )

    async def scenario() -> tuple[bytes, bytes, str]:
        server = InjectorServer(config)
        await server.start()
        port = int(server.port or 0)
        try:
            first = await asyncio.to_thread(served_cert, port)
            new_cert, new_key = write_self_signed(tmp_path / "b", common_name="second")
            key.write_bytes(new_key.read_bytes())
            cert.write_bytes(new_cert.read_bytes())
            # Polled with a generous timeout (the reload interval is short; a loaded
            # machine may still take seconds to get there).
            await wait_for_async(lambda: server.metrics.cert_reloads._value.get() >= 1, 60)
            second = await asyncio.to_thread(served_cert, port)
            return first, second, new_cert.read_text()
        finally:
            await server.stop()

    first, second, new_pem = asyncio.run(scenario())
    assert first != second
    assert ssl.DER_cert_to_PEM_cert(second).strip() == new_pem.strip()


def run_cli(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "webhook", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_cli_reports_every_config_error() -> None:
    result = run_cli("--listen", "nowhere", "--kubernetes-version", "soon")
    assert result.returncode == 2
    assert "listen: " in result.stderr and "kubernetes_version: " in result.stderr
    # Checks across fields run once each field is valid.
    result = run_cli("--cert", "c.pem")
    assert result.returncode == 2
    assert "cert_file and key_file go together" in result.stderr


def test_cli_exits_1_when_the_certificate_is_unreadable(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    result = run_cli("--listen", f"127.0.0.1:{free_port()}", "--cert", missing, "--key", missing)
    assert result.returncode == 1
    assert "cannot start" in result.stderr


def mount_like_a_secret(root: Path, cert: Path, key: Path, version: str) -> None:
    """Lay out (or atomically update) ``root`` the way the kubelet mounts a Secret:
    ``..<version>/`` holds the files, ``..data -> ..<version>``, ``tls.crt ->
    ..data/tls.crt``; an update writes a new version directory and swaps ``..data`` with
    one rename of a new symlink, so the visible files change all at once."""
    versioned = root / f"..{version}"
    versioned.mkdir(parents=True)
    (versioned / "tls.crt").write_bytes(cert.read_bytes())
    (versioned / "tls.key").write_bytes(key.read_bytes())
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(versioned.name)
    os.replace(tmp_link, root / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def test_certificate_follows_a_secret_symlink_swap(tmp_path: Path) -> None:
    """A Secret update changes no mtime of ``tls.crt`` (a symlink that stays the same):
    the reload must notice the new content."""
    secret = tmp_path / "secret"
    cert_a, key_a = write_self_signed(tmp_path / "a", common_name="first")
    cert_b, key_b = write_self_signed(tmp_path / "b", common_name="second")
    mount_like_a_secret(secret, cert_a, key_a, "2026_01_01_00_00_00.1")
    cert_link, key_link = secret / "tls.crt", secret / "tls.key"
    stamps = (os.lstat(cert_link).st_mtime_ns, os.lstat(key_link).st_mtime_ns)
    config = InjectorConfig(
        listen="127.0.0.1:0",
        cert_file=str(cert_link),
        key_file=str(key_link),
        cert_reload_interval_s=0.05,
    )

    async def scenario() -> tuple[bytes, bytes]:
        server = InjectorServer(config)
        await server.start()
        port = int(server.port or 0)
        try:
            first = await asyncio.to_thread(served_cert, port)
            # Same-size files with the same mtime as the first ones: only content differs.
            mount_like_a_secret(secret, cert_b, key_b, "2026_02_01_00_00_00.2")
            for name in ("tls.crt", "tls.key"):
                target = secret / "..2026_02_01_00_00_00.2" / name
                old = secret / "..2026_01_01_00_00_00.1" / name
                st = os.stat(old)
                os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
            for _ in range(200):
                await asyncio.sleep(0.05)
                if server.metrics.cert_reloads._value.get() >= 1:
                    break
            second = await asyncio.to_thread(served_cert, port)
            return first, second
        finally:
            await server.stop()

    first, second = asyncio.run(scenario())
    assert (os.lstat(cert_link).st_mtime_ns, os.lstat(key_link).st_mtime_ns) == stamps
    assert ssl.DER_cert_to_PEM_cert(first).strip() == cert_a.read_text().strip()
    assert ssl.DER_cert_to_PEM_cert(second).strip() == cert_b.read_text().strip()


def test_unchanged_certificate_is_not_reloaded(tmp_path: Path) -> None:
    cert, key = write_self_signed(tmp_path)
    reloader = CertificateReloader(str(cert), str(key))
    cert.touch()  # a new mtime, same content
    assert reloader.reload_if_changed() is False


@pytest.mark.parametrize("broken", ["cert", "key", "pair"])
def test_tls_error_names_the_file(tmp_path: Path, broken: str) -> None:
    cert, key = write_self_signed(tmp_path / "a")
    other_cert, _other_key = write_self_signed(tmp_path / "b")
    if broken == "cert":
        cert.write_text("not a certificate\n")
    elif broken == "key":
        key.write_text("not a key\n")
    else:
        cert = other_cert  # a valid certificate that does not match the key
    result = run_cli(
        "--listen", f"127.0.0.1:{free_port()}", "--cert", str(cert), "--key", str(key)
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot start" in result.stderr
    named = {"cert": [str(cert)], "key": [str(key)], "pair": [str(cert), str(key)]}[broken]
    for path in named:
        assert path in result.stderr


def test_webhook_without_its_extra_says_how_to_install_it(tmp_path: Path) -> None:
    """The sidecar image has no aiohttp: the webhook command must say what is missing."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['aiohttp'] = None\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "gym_sidecar.cli", "webhook", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "gym-telemetry-sidecar[webhook]" in result.stderr and "aiohttp" in result.stderr


def test_port_zero_logs_the_bound_port(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> int:
        server = InjectorServer(InjectorConfig(listen="127.0.0.1:0"))
        await server.start()
        try:
            return int(server.port or 0)
        finally:
            await server.stop()

    with caplog.at_level("INFO", logger="gym_sidecar.webhook"):
        port = asyncio.run(scenario())
    assert port and f"injector listening on 127.0.0.1:{port} (http)" in caplog.text
