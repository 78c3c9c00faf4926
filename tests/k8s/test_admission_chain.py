"""The injector called by a real kube-apiserver's admission chain (v1.37.2, built here).

Every check reads what the API server answered or stored (``kubectl ... -o json``), its
audit log or its own /metrics: the injector is only ever reached the way a cluster
reaches it, through the project's MutatingWebhookConfiguration.
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from gym_sidecar.webhook.mutate import (
    AGENT_ADMIN_URL_ENV,
    CONFIG_VOLUME_NAME,
    DATA_VOLUME_NAME,
)

from testkit.wait import wait_for
from tests.k8s.conftest import (
    INJECT,
    INJECTED,
    MWC_NAME,
    Injector,
    is_injected,
    new_name,
    pod,
    register,
    wait_until_injecting,
    webhook_configuration,
)
from tests.support.control_plane import CertificateAuthority, ControlPlane, metric_value
from tests.support.ports import free_port

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(3600)]

SIDECAR = "gym-telemetry-sidecar"
POD_OPT_IN = "pod-opt-in.inject.telemetry.nemo-gym.io"
NAMESPACE_OPT_IN = "namespace-opt-in.inject.telemetry.nemo-gym.io"


def create(plane: ControlPlane, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    stored: dict[str, Any] = plane.apply_json("create", "-n", namespace, obj=body)
    return stored


def containers(stored: dict[str, Any], key: str = "containers") -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in stored["spec"].get(key) or []}


def audit_annotations(
    plane: ControlPlane, namespace: str, name: str, creates: int = 1
) -> dict[str, str]:
    """The audit annotations of the ``creates``-th create of pod ``namespace/name``
    (waiting for its event to be written)."""
    found: dict[str, str] = {}

    def seen() -> bool:
        count = 0
        for event in plane.audit_events():
            ref = event.get("objectRef") or {}
            if (
                event.get("verb") == "create"
                and ref.get("resource") == "pods"
                and ref.get("namespace") == namespace
                and ref.get("name") == name
                and event.get("stage") == "ResponseComplete"
            ):
                count += 1
                if count == creates:
                    found.update(event.get("annotations") or {})
                    return True
        return False

    assert wait_for(seen, timeout_s=60, interval_s=0.2), f"no audit event for {namespace}/{name}"
    return found


def webhook_calls(annotations: dict[str, str]) -> list[dict[str, Any]]:
    """``mutation.webhook.admission.k8s.io/round_N_index_M`` values, in call order."""
    calls = []
    for key in sorted(annotations):
        if key.startswith("mutation.webhook.admission.k8s.io/round_"):
            round_index = key.rsplit("/", 1)[1]
            calls.append({"at": round_index, **json.loads(annotations[key])})
    return calls


# --- what is stored ------------------------------------------------------------------


def test_annotated_pod_is_stored_with_the_native_sidecar_first(
    control_plane: ControlPlane, namespace: str
) -> None:
    name = new_name("annotated")
    body = pod(name, {INJECT: "true"})
    body["spec"]["initContainers"] = [
        {
            "name": "setup",
            "image": "busybox:1.36",
            "securityContext": body["spec"]["containers"][0]["securityContext"],
        }
    ]
    stored = create(control_plane, namespace, body)

    init = stored["spec"]["initContainers"]
    assert [c["name"] for c in init] == [SIDECAR, "setup"]  # the sidecar first
    sidecar = init[0]
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    assert sidecar["image"] == "gym-telemetry-sidecar:0.1.0"
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["K8S_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["GYM_SIDECAR_SPAN_GROUPS__TOKEN"]["valueFrom"]["secretKeyRef"]["optional"]
    assert sidecar["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    volumes = {v["name"]: v for v in stored["spec"]["volumes"]}
    assert volumes[CONFIG_VOLUME_NAME]["configMap"]["name"] == "gym-telemetry-sidecar"
    assert "emptyDir" in volumes[DATA_VOLUME_NAME]
    # The ServiceAccount admission plugin ran before the webhook; its token volume stays.
    assert any(v.startswith("kube-api-access-") for v in volumes)
    mounts = {m["name"] for m in sidecar["volumeMounts"]}
    assert {CONFIG_VOLUME_NAME, DATA_VOLUME_NAME} <= mounts
    for app in containers(stored).values():
        app_env = {e["name"]: e.get("value") for e in app.get("env") or []}
        assert app_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4317"
        assert app_env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"  # the pair, consistent
        assert app_env[AGENT_ADMIN_URL_ENV] == "http://localhost:13133"
    assert containers(stored)["app"]["env"][0] == {"name": "APP_MODE", "value": "serve"}
    assert stored["metadata"]["annotations"][INJECTED] == "native-sidecar"
    # Stored, as read back (not only the create's answer).
    assert control_plane.get_json("pod", "-n", namespace, name)["spec"] == stored["spec"]
    # The API server's audit log names the call and says it mutated the pod.
    # Called once to inject; the in-tree plugins then run again on the changed pod (the
    # ServiceAccount plugin mounts its token into the new container), so the API server
    # calls ours again (reinvocationPolicy: IfNeeded), which has nothing left to change.
    calls = webhook_calls(audit_annotations(control_plane, namespace, name))
    assert [(c["configuration"], c["webhook"], c["mutated"]) for c in calls][:1] == [
        (MWC_NAME, POD_OPT_IN, True)
    ]
    assert all(c["webhook"] == POD_OPT_IN and not c["mutated"] for c in calls[1:])


def test_each_app_container_is_pointed_at_the_port_of_its_protocol(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Stored as the API server keeps it: a container that chose OTLP/HTTP is sent to the
    HTTP port, one that chose nothing gets the gRPC pair, one with its own endpoint keeps
    it, and per-signal variables the app set stay the app's."""
    name = new_name("protocols")
    body = pod(name, {INJECT: "true"})
    helper = body["spec"]["containers"][1]
    helper["env"] = [{"name": "OTEL_EXPORTER_OTLP_PROTOCOL", "value": "http/protobuf"}]
    third = {**helper, "name": "collector-user"}
    third["env"] = [
        {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://collector.obs:4318"},
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
    ]
    body["spec"]["containers"].append(third)
    stored = create(control_plane, namespace, body)
    envs = {
        c: {e["name"]: e.get("value") for e in spec.get("env") or []}
        for c, spec in containers(stored).items()
    }
    otlp = {c: {k: v for k, v in env.items() if k.startswith("OTEL_")} for c, env in envs.items()}
    assert otlp == {
        "app": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        },
        "helper": {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318",
        },
        "collector-user": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.obs:4318",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        },
    }
    assert stored["spec"]["initContainers"][0]["name"] == SIDECAR


def test_unannotated_and_opted_out_pods_are_stored_untouched(
    control_plane: ControlPlane, namespace: str, injector: Injector
) -> None:
    opted_in_ns = control_plane.namespace(new_name("optin"), {INJECT: "true"})
    wait_until_injecting(control_plane, opted_in_ns)
    cases = [
        (namespace, pod(new_name("plain")), False),
        (namespace, pod(new_name("optout"), {INJECT: "false"}), False),
        (opted_in_ns, pod(new_name("optout"), {INJECT: "false"}), False),
        (opted_in_ns, pod(new_name("bynamespace")), True),
    ]
    for ns, body, want in cases:
        stored = create(control_plane, ns, body)
        assert is_injected(stored) is want, (ns, body["metadata"])
        if want:
            assert stored["spec"]["initContainers"][0]["name"] == SIDECAR
            calls = webhook_calls(audit_annotations(control_plane, ns, body["metadata"]["name"]))
            assert {c["webhook"] for c in calls} == {NAMESPACE_OPT_IN}
            continue
        assert "initContainers" not in stored["spec"]
        for original, kept in zip(
            body["spec"]["containers"], stored["spec"]["containers"], strict=True
        ):
            assert kept.get("env") == original.get("env")
            assert kept["securityContext"] == original["securityContext"]
        assert [v["name"][: len("kube-api-access-")] for v in stored["spec"]["volumes"]] == [
            "kube-api-access-"
        ]
        annotations = stored["metadata"].get("annotations") or {}
        assert INJECTED not in annotations


def test_recreating_an_injected_pod_converges(control_plane: ControlPlane, namespace: str) -> None:
    """A stored injected pod, deleted and created again as read (what a backup restore
    or `kubectl get -o json | kubectl replace --force` does), gets no second sidecar and
    no duplicate variable or volume: the stored spec is the same."""
    name = new_name("recreate")
    first = create(control_plane, namespace, pod(name, {INJECT: "true"}))
    control_plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=true")
    again = copy.deepcopy(first)
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        again["metadata"].pop(key, None)
    again.pop("status", None)
    second = create(control_plane, namespace, again)
    assert second["spec"] == first["spec"]
    assert [c["name"] for c in second["spec"]["initContainers"]].count(SIDECAR) == 1
    calls = webhook_calls(audit_annotations(control_plane, namespace, name, creates=2))
    assert calls and all(c["webhook"] == POD_OPT_IN for c in calls)
    assert not any(c["mutated"] for c in calls)  # called, and nothing left to change


# --- odd pods through the real chain -------------------------------------------------


def test_odd_pods_are_admitted(control_plane: ControlPlane, namespace: str) -> None:
    restricted = pod("x")["spec"]["containers"][0]["securityContext"]
    bare = {"name": "bare", "image": "busybox:1.36", "securityContext": restricted}
    huge = "x" * (200 * 1024)  # the API server allows 256 KiB of annotations in all
    odd = {
        "no-env-anywhere": pod(new_name("noenv"), {INJECT: "true"}, containers=[bare]),
        "huge-annotation": pod(new_name("huge"), {INJECT: "true", "example.com/blob": huge}),
        "unicode-values": pod(
            new_name("unicode"),
            {INJECT: "true", "example.com/title": "Überprüfung ✓ 検証 🚀"},
            containers=[
                {
                    **bare,
                    "env": [{"name": "GREETING", "value": "grüß dich — 你好 👋"}],
                    "command": ["echo", "ünïcödé ✓"],
                }
            ],
        ),
        "volume-named-like-ours": pod(
            new_name("collide"),
            {INJECT: "true"},
            volumes=[{"name": DATA_VOLUME_NAME, "emptyDir": {"medium": "Memory"}}],
        ),
        "generate-name-only": {
            **pod("unused", {INJECT: "true"}),
            "metadata": {"generateName": "gen-", "annotations": {INJECT: "true"}},
        },
    }
    for what, body in odd.items():
        stored = create(control_plane, namespace, body)
        assert is_injected(stored), what
        assert stored["spec"]["initContainers"][0]["name"] == SIDECAR, what
        if what == "volume-named-like-ours":
            [data] = [v for v in stored["spec"]["volumes"] if v["name"] == DATA_VOLUME_NAME]
            assert data == {"name": DATA_VOLUME_NAME, "emptyDir": {"medium": "Memory"}}
        if what == "huge-annotation":
            assert stored["metadata"]["annotations"]["example.com/blob"] == huge
        if what == "unicode-values":
            assert stored["spec"]["containers"][0]["command"] == ["echo", "ünïcödé ✓"]


def test_a_pod_the_api_server_refuses_is_refused_by_its_own_validation(
    control_plane: ControlPlane, namespace: str
) -> None:
    """Object names are validated after mutating admission: a pod named in Unicode
    reaches the injector, which answers (no fail-open), and the API server's own
    validation then refuses it with its message."""
    before = metric_value(
        control_plane.metrics(), "apiserver_admission_webhook_fail_open_count", name=POD_OPT_IN
    )
    name = "pödchen-✓"
    out = control_plane.kubectl(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(pod(name, {INJECT: "true"})),
        check=False,
    )
    assert out.returncode != 0
    assert "a lowercase RFC 1123 subdomain" in out.stderr, out.stderr
    calls = webhook_calls(audit_annotations(control_plane, namespace, name))
    assert [(c["webhook"], c["mutated"]) for c in calls][:1] == [(POD_OPT_IN, True)]
    after = metric_value(
        control_plane.metrics(), "apiserver_admission_webhook_fail_open_count", name=POD_OPT_IN
    )
    assert after == before


# --- PodSecurity restricted ---------------------------------------------------------------


def test_restricted_namespace_admits_the_injected_pod(
    control_plane: ControlPlane, restricted_namespace: str
) -> None:
    stored = create(control_plane, restricted_namespace, pod(new_name("ok"), {INJECT: "true"}))
    assert is_injected(stored)
    assert stored["spec"]["initContainers"][0]["restartPolicy"] == "Always"


def test_restricted_namespace_refuses_a_non_compliant_pod_with_its_own_message(
    control_plane: ControlPlane, restricted_namespace: str
) -> None:
    body = pod(new_name("bad"), {INJECT: "true"})
    del body["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"]
    body["spec"]["containers"][1]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    out = control_plane.kubectl(
        "create", "-n", restricted_namespace, "-f", "-", input=json.dumps(body), check=False
    )
    assert out.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in out.stderr, out.stderr
    assert 'container "app" must set securityContext.allowPrivilegeEscalation=false' in out.stderr
    assert 'container "helper" must not include "NET_ADMIN"' in out.stderr, out.stderr
    # The refusal names the app's containers only: the injected sidecar is compliant.
    assert SIDECAR not in out.stderr


# --- fail open ------------------------------------------------------------------------------


def _fail_open_count(plane: ControlPlane) -> float:
    return metric_value(
        plane.metrics(), "apiserver_admission_webhook_fail_open_count", name=POD_OPT_IN
    )


def test_fail_open_when_the_injector_is_down(
    control_plane: ControlPlane, namespace: str, injector: Injector
) -> None:
    before = _fail_open_count(control_plane)
    injector.stop()
    name = new_name("down")
    stored = create(control_plane, namespace, pod(name, {INJECT: "true"}))
    assert not is_injected(stored)
    assert "initContainers" not in stored["spec"]
    assert _fail_open_count(control_plane) == before + 1
    annotations = audit_annotations(control_plane, namespace, name)
    failed = {k: v for k, v in annotations.items() if k.startswith("failed-open.mutation.")}
    assert list(failed.values()) == [POD_OPT_IN], annotations


def test_fail_open_when_the_injector_is_slower_than_its_timeout(
    control_plane: ControlPlane, namespace: str, injector: Injector
) -> None:
    """SIGSTOP: the kernel still accepts the connection; no answer comes before the
    configuration's ``timeoutSeconds``, so the API server gives up and admits."""
    before = _fail_open_count(control_plane)
    injector.pause()
    try:
        name = new_name("slow")
        started = time.monotonic()
        stored = create(control_plane, namespace, pod(name, {INJECT: "true"}))
        waited = time.monotonic() - started
    finally:
        injector.resume()
    assert not is_injected(stored)
    assert waited >= 5 * 0.9  # the MutatingWebhookConfiguration's timeoutSeconds
    assert _fail_open_count(control_plane) == before + 1
    annotations = audit_annotations(control_plane, namespace, name)
    failed = {k: v for k, v in annotations.items() if k.startswith("failed-open.mutation.")}
    assert list(failed.values()) == [POD_OPT_IN], annotations
    # Answering again: the next pod is injected.
    wait_until_injecting(control_plane, namespace)


# --- reinvocation ---------------------------------------------------------------------------


class _AddContainer(BaseHTTPRequestHandler):
    """A tiny second mutating webhook: adds a container ``late`` when it is missing."""

    calls = 0

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        spec = request["object"]["spec"]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        type(self).calls += 1
        if all(c["name"] != "late" for c in spec["containers"]):
            late = {
                "name": "late",
                "image": "busybox:1.36",
                "securityContext": spec["containers"][0].get("securityContext", {}),
            }
            patch = [{"op": "add", "path": "/spec/containers/-", "value": late}]
            import base64

            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def second_webhook(control_plane: ControlPlane, tmp_path: Path) -> Iterator[str]:
    ca = CertificateAuthority("second webhook CA")
    cert, key = ca.issue(tmp_path, "second", "second", ips=["127.0.0.1"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _AddContainer)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    import base64

    name = "zz-gym-telemetry-test-adds-a-container"  # called after ours (name order)
    mwc = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "adds-a-container.test.invalid",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {
                    "url": f"https://127.0.0.1:{server.server_address[1]}/",
                    "caBundle": base64.b64encode(ca.pem()).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "objectSelector": {"matchLabels": {"test.invalid/add-container": "yes"}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": 10,
                "reinvocationPolicy": "Never",
            }
        ],
    }
    register(control_plane, mwc)
    try:
        yield name
    finally:
        control_plane.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
        server.shutdown()
        server.server_close()


def test_reinvocation_after_a_later_webhook_adds_a_container(
    control_plane: ControlPlane, namespace: str, second_webhook: str
) -> None:
    labels = {"test.invalid/add-container": "yes"}

    def body(name: str) -> dict[str, Any]:
        b = pod(name, {INJECT: "true"})
        b["metadata"]["labels"] = labels
        return b

    def both_ran(stored: dict[str, Any]) -> bool:
        return is_injected(stored) and "late" in containers(stored)

    deadline = time.monotonic() + 90
    while not both_ran(
        control_plane.apply_json(
            "create", "--dry-run=server", "-n", namespace, obj=body(new_name("probe"))
        )
    ):
        assert time.monotonic() < deadline, "the second webhook was never called"
        time.sleep(0.5)

    name = new_name("reinvoked")
    stored = create(control_plane, namespace, body(name))
    assert [c["name"] for c in stored["spec"]["initContainers"]] == [SIDECAR]
    assert list(containers(stored)) == ["app", "helper", "late"]
    late_env = {e["name"] for e in containers(stored)["late"].get("env") or []}
    assert {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", AGENT_ADMIN_URL_ENV} <= (
        late_env
    )
    calls = webhook_calls(audit_annotations(control_plane, namespace, name))
    assert [(c["at"], c["configuration"], c["mutated"]) for c in calls] == [
        ("round_0_index_1", MWC_NAME, True),
        ("round_0_index_2", second_webhook, True),
        ("round_1_index_1", MWC_NAME, True),  # called again: gave the new container env
    ]


# --- serving-certificate rotation -------------------------------------------------------


def test_serving_certificate_rotation_on_disk(
    control_plane: ControlPlane, namespace: str, injector: Injector
) -> None:
    """The certificate and key files are replaced by ones from a new CA. Until the
    webhook configuration trusts that CA, calls fail (open); once it does, admissions
    are injected, served with the new certificate, with no restart of the injector."""
    new_ca = CertificateAuthority("rotated injector CA")
    register(control_plane, webhook_configuration(control_plane, injector, new_ca.pem()))
    wait_until_injecting(control_plane, namespace, want=False)  # old cert, new trust: fails
    pid = injector.proc.pid if injector.proc else None

    new_ca.issue(injector.workdir, "tls", "injector", ips=["127.0.0.1"])  # on disk, in place

    def served_by_new_ca() -> bool:
        try:
            ctx = ssl.create_default_context(cadata=new_ca.pem().decode())
            import socket

            with (
                socket.create_connection(("127.0.0.1", injector.port), timeout=5) as raw,
                ctx.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return True
        except (ssl.SSLError, OSError):
            return False

    assert wait_for(served_by_new_ca, timeout_s=60, interval_s=0.2)
    wait_until_injecting(control_plane, namespace)
    name = new_name("rotated")
    assert is_injected(create(control_plane, namespace, pod(name, {INJECT: "true"})))
    assert injector.proc is not None and injector.proc.pid == pid
