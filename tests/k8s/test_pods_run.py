"""Injected pods that start: a real kubelet runs what the real injector made of a pod.

The node (:mod:`tests.support.node`): a kubelet v1.37.2 built with the control plane,
Debian's containerd and runc, CNI plugins v1.10.0, joined to the session's API server as
``127.0.0.1``; the project's images (built by the image tests' builder) imported into
containerd. A Gym pod (:mod:`tests.k8s.gym_pod`: three Gym servers, an OTLP/HTTP and an
OTLP/gRPC SDK app) opted in by annotation is created in a namespace that enforces
``restricted``; the API server admits it through the project's injector, the kubelet runs
it, and the injected sidecar exports to a Jaeger v2 on this machine, reached at the pod
bridge's address (no cluster DNS). The tests run in order on that one pod:

1. it runs: the native sidecar first, started and ready (its startup probe on
   ``/readyz``), every container up, under ``restricted``, with the native scanner;
2. rollouts sent to the pod's agent arrive in Jaeger as one trace each across the three
   Gym services, and as derived metrics on the sidecar's ``/metrics``;
3. the HTTP and the gRPC app each deliver every span (counted exactly in Jaeger and on
   the sidecar's receive counters);
4. the sidecar container killed (SIGKILL) with acknowledged spans still on its disk
   queue (the backend down): the kubelet restarts it and it delivers them;
5. deleting the pod: both apps' last spans, sent on SIGTERM, reach Jaeger before the
   sidecar (stopped after them) exits;
6. the host is as it was before the node started (sysctls, cgroups, mounts, links,
   network namespaces, CNI and log directories, firewall tables).

Needs root (containerd, the kubelet, a bridge), a Docker engine (the images) and Go (the
builds); where one is missing the module skips with that reason (fails on CI).
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testkit import native_wheel
from testkit.wait import wait_for
from tests.k8s import gym_pod
from tests.k8s.conftest import (
    INJECT,
    MWC_NAME,
    Injector,
    new_name,
    register,
    render,
    wait_until_injecting,
    webhook_configuration,
)
from tests.support.control_plane import REPO, ControlPlane, log_tail, metric_value, on_ci
from tests.support.docker_daemon import Engine, EngineUnavailable, ensure_engine
from tests.support.docker_images import build_project_images
from tests.support.jaeger import JaegerServer, jaeger_binary
from tests.support.node.kubelet import NODE_NAME
from tests.support.node.node import RUN_DIR, Node
from tests.support.node.node import cache_dir as node_cache_dir

pytestmark = [pytest.mark.k8s, pytest.mark.node, pytest.mark.timeout(5400)]

WAIT_S = 600.0
"""Generous: a loaded 2-core machine starts five Python containers; conditions that hold
return at once."""
SIDECAR = "gym-telemetry-sidecar"
ROLLOUTS = 5
DURABLE_SPANS = 50


def _unavailable(reason: str) -> None:
    if on_ci():
        pytest.fail(reason)
    pytest.skip(reason)


# --- the module's world: images, node, Jaeger, injector, the pod ------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    if os.geteuid() != 0:
        _unavailable("running pods needs root (containerd, the kubelet, a network bridge)")
    try:
        found = ensure_engine()
    except EngineUnavailable as exc:
        _unavailable(f"no Docker engine to build the images: {exc}")
        raise
    try:
        build_project_images(found, "gym-server", "sidecar")
        yield found
    finally:
        found.release()


@pytest.fixture(scope="module")
def node(
    control_plane: ControlPlane, engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    started = Node(control_plane, engine, tmp_path_factory.mktemp("node"))
    started.start([gym_pod.GYM_IMAGE, gym_pod.SIDECAR_IMAGE])
    print(f"node timings: {json.dumps(started.timings)}")
    try:
        yield started
    finally:
        started.teardown()


@pytest.fixture(scope="module")
def jaeger(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JaegerServer]:
    """Jaeger v2 with its OTLP receivers on the pod bridge's address only."""
    assert node.network is not None
    server = JaegerServer(
        tmp_path_factory.mktemp("jaeger"), jaeger_binary(), otlp_host=node.network.gateway
    )
    server.start(timeout_s=120)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pod_injector(
    control_plane: ControlPlane,
    injector_config_text: str,
    jaeger: JaegerServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Injector]:
    """The real injector with the shipped config; its one addition is the sidecar's
    backend (Jaeger's address on the bridge) and a retry that outlasts the test's
    backend outage, given to the sidecar as environment."""
    sidecar_env = {
        "GYM_SIDECAR_BACKEND__URL": jaeger.otlp_grpc_endpoint,
        "GYM_SIDECAR_QUEUE__RETRY_MAX_INTERVAL_S": "2",
        "GYM_SIDECAR_QUEUE__RETRY_MAX_ELAPSED_S": "null",
    }
    text = injector_config_text + "\n" + yaml.safe_dump({"sidecar_env": sidecar_env})
    proc = Injector(tmp_path_factory.mktemp("pod-injector"), text)
    proc.start()
    try:
        register(control_plane, webhook_configuration(control_plane, proc))
        yield proc
    finally:
        control_plane.kubectl("delete", "mutatingwebhookconfiguration", MWC_NAME, check=False)
        proc.stop()


class Pod:
    """The running Gym pod and how the tests read it."""

    def __init__(self, plane: ControlPlane, node: Node, namespace: str, name: str) -> None:
        self.plane, self.node, self.namespace, self.name = plane, node, namespace, name

    def get(self) -> dict[str, Any]:
        found: dict[str, Any] = self.plane.get_json("pod", "-n", self.namespace, self.name)
        return found

    @property
    def ip(self) -> str:
        return str(self.get()["status"]["podIP"])

    def sidecar_status(self) -> dict[str, Any]:
        statuses = self.get()["status"].get("initContainerStatuses") or []
        [status] = [s for s in statuses if s["name"] == SIDECAR]
        return dict(status)

    def logs(self, container: str) -> str:
        return self.plane.kubectl(
            "logs", "-n", self.namespace, self.name, "-c", container, timeout=120
        ).stdout

    def reports(self, container: str) -> dict[str, dict[str, Any]]:
        """The sender's JSON lines, by phase."""
        out = {}
        for line in self.logs(container).splitlines():
            if line.startswith("{"):
                report = json.loads(line)
                out[report["phase"]] = report
        return out

    def admin(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.ip}:13133{path}", timeout=10) as resp:
                return resp.status, resp.read().decode()
        except OSError as exc:
            return 0, str(exc)


@pytest.fixture(scope="module")
def pod(control_plane: ControlPlane, node: Node, pod_injector: Injector) -> Iterator[Pod]:
    namespace = control_plane.namespace(
        new_name("pods"), {"pod-security.kubernetes.io/enforce": "restricted"}
    )
    for cm in gym_pod.config_maps(namespace, control_plane.ca.pem()):
        control_plane.apply_json("create", obj=cm)
    [sidecar_cm] = [o for o in render(control_plane, "sidecar") if o["kind"] == "ConfigMap"]
    sidecar_cm["metadata"]["namespace"] = namespace
    control_plane.apply_json("create", obj=sidecar_cm)
    wait_until_injecting(control_plane, namespace)
    name = new_name("gym")
    control_plane.apply_json(
        "create", "-n", namespace, obj=gym_pod.gym_pod(name, NODE_NAME, INJECT)
    )
    running = Pod(control_plane, node, namespace, name)

    def ready() -> bool:
        status = running.get()["status"]
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []
        )

    assert wait_for(ready, WAIT_S, 1.0), (
        json.dumps(running.get()["status"], indent=1)[-6000:],
        log_tail(node.kubelet.log, 60) if node.kubelet else "",
    )
    yield running
    control_plane.kubectl("delete", "pod", "-n", namespace, name, "--wait=false", check=False)


# --- 1. it runs ------------------------------------------------------------------------


def test_the_injected_pod_runs_with_its_native_sidecar_ready(pod: Pod) -> None:
    stored = pod.get()
    init = stored["spec"]["initContainers"]
    assert init[0]["name"] == SIDECAR and init[0]["restartPolicy"] == "Always"
    assert init[0]["startupProbe"]["httpGet"]["path"] == "/readyz"
    status = pod.sidecar_status()
    assert status["started"] is True and status["ready"] is True, status
    assert status["restartCount"] == 0, status
    assert "running" in status["state"], status
    mains = {c["name"]: c for c in stored["status"]["containerStatuses"]}
    assert set(mains) == set(gym_pod.SERVERS) | set(gym_pod.SENDERS)
    assert all(c["ready"] and "running" in c["state"] for c in mains.values()), mains
    namespace = pod.plane.get_json("namespace", pod.namespace)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert pod.node.network is not None
    assert ipaddress.ip_address(pod.ip) in pod.node.network.subnet
    # The probes' endpoints, from outside the pod (the kubelet probes them the same way).
    assert pod.admin("/readyz")[0] == 200 and pod.admin("/healthz")[0] == 200
    assert "gym-sidecar ready" in pod.logs(SIDECAR)


def test_the_pod_sidecar_runs_the_native_scanner(pod: Pod) -> None:
    if native_wheel.session_extension() is None:
        reason = "gym_sidecar_native is not installed here, so the image was built without it"
        if os.environ.get("GYM_TEST_NATIVE") == "required":
            pytest.fail(f"GYM_TEST_NATIVE=required: {reason}")
        pytest.skip(reason)
    metrics = pod.admin("/metrics")[1]
    assert metric_value(metrics, "gym_sidecar_trace_scanner_info", scanner="native") == 1.0
    assert "trace scanner: native (gym_sidecar_native)" in pod.logs(SIDECAR)


# --- 2. rollouts: traces in Jaeger, derived metrics --------------------------------------


def test_rollouts_reach_jaeger_and_the_derived_metrics(pod: Pod, jaeger: JaegerServer) -> None:
    env = {**os.environ, "AGENT_URL": f"http://{pod.ip}:{gym_pod.AGENT_PORT}"}
    env.update(ROLLOUTS=str(ROLLOUTS), TASK_INDEX="0", WAIT_S="300", REQUEST_TIMEOUT_S="300")
    driver = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "docker" / "rollout_driver.py")],
        env={k: v for k, v in env.items() if "proxy" not in k.lower()},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert driver.returncode == 0, driver.stdout + driver.stderr
    assert driver.stdout.count("reward=1.0") == ROLLOUTS, driver.stdout
    services = {gym_pod.service_name(c) for c in gym_pod.SERVERS}
    agent = gym_pod.service_name("simple-agent")

    def whole(rollout_id: str) -> bool:
        found = jaeger.find_traces(agent, {"nemo.gym.rollout.id": rollout_id})
        if len(found) != 1:
            return False
        trace = jaeger.trace(found[0].trace_id)
        return trace is not None and trace.services() == services

    for index in range(ROLLOUTS):
        assert wait_for(lambda i=index: whole(f"0-{i}"), WAIT_S, 1.0), f"rollout 0-{index}"

    def rollouts_counted() -> float:
        return metric_value(pod.admin("/metrics")[1], "gym_rollout_duration_ms_count")

    assert wait_for(lambda: rollouts_counted() == ROLLOUTS, WAIT_S, 1.0), rollouts_counted()
    verify = metric_value(pod.admin("/metrics")[1], "gym_verify_count_total", succeeded="true")
    assert verify == ROLLOUTS


# --- 3. every span of both protocols ----------------------------------------------------


def _spans_in_jaeger(jaeger: JaegerServer, trace_id: str) -> tuple[int, int]:
    """(spans, distinct span ids) of one trace (0, 0 while Jaeger has none)."""
    trace = jaeger.trace(trace_id)
    if trace is None:
        return 0, 0
    return len(trace.spans), len({s.span_id for s in trace.spans})


def test_an_http_and_a_grpc_sender_each_deliver_every_span(pod: Pod, jaeger: JaegerServer) -> None:
    stored = {c["name"]: c for c in pod.get()["spec"]["containers"]}
    env = {n: {e["name"]: e.get("value") for e in stored[n]["env"]} for n in gym_pod.SENDERS}
    assert env["http-sender"]["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert env["http-sender"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4318"
    assert env["grpc-sender"]["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert env["grpc-sender"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://localhost:4317"
    counts = {}
    for sender, protocol in gym_pod.SENDERS.items():
        assert wait_for(lambda s=sender: "start" in pod.reports(s), WAIT_S, 1.0), pod.logs(sender)
        report = pod.reports(sender)["start"]
        assert report["acked"] is True and report["protocol"] == protocol, report
        assert report["spans"] == gym_pod.START_SPANS
        want = (gym_pod.START_SPANS, gym_pod.START_SPANS)
        assert wait_for(
            lambda r=report, w=want: _spans_in_jaeger(jaeger, r["trace_id"]) == w, WAIT_S, 1.0
        ), (sender, _spans_in_jaeger(jaeger, report["trace_id"]))
        trace = jaeger.trace(report["trace_id"])
        assert trace is not None and trace.services() == {gym_pod.service_name(sender)}
        counts[sender] = _spans_in_jaeger(jaeger, report["trace_id"])[0]
    metrics = pod.admin("/metrics")[1]
    # Only the HTTP sender speaks OTLP/HTTP in the pod: the sidecar received exactly its.
    http_in = metric_value(
        metrics, "gym_sidecar_received_items_total", signal="traces", transport="http"
    )
    assert http_in == gym_pod.START_SPANS
    print(f"spans in Jaeger per sender: {counts}; sidecar received over HTTP: {http_in:.0f}")


# --- 4. a killed sidecar comes back and delivers what it had acked ----------------------


def test_a_killed_sidecar_restarts_and_delivers_its_acked_spans(
    pod: Pod, jaeger: JaegerServer
) -> None:
    """Jaeger stopped, so nothing leaves the sidecar; the gRPC app sends 50 spans (the
    sidecar acknowledges them once they are on its disk queue); the sidecar container is
    killed (SIGKILL through containerd, as the OOM killer would); the kubelet restarts it
    (a native sidecar: ``restartPolicy: Always``); Jaeger comes back; the spans arrive,
    replayed from the queue on the pod's data volume."""
    assert pod.node.containerd is not None
    jaeger.stop()
    before = pod.sidecar_status()["restartCount"]
    sent = pod.plane.kubectl(
        "exec", "-n", pod.namespace, pod.name, "-c", "grpc-sender", "--",
        "python", "/opt/sender/pod_otlp_sender.py", "once", "durable",
        f"--spans={DURABLE_SPANS}", timeout=300, check=False,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stdout + sent.stderr
    [report] = [json.loads(line) for line in sent.stdout.splitlines() if line.startswith("{")]
    assert report["acked"] is True and report["spans"] == DURABLE_SPANS, report
    metrics = pod.admin("/metrics")[1]
    assert metric_value(metrics, "gym_sidecar_queue_bytes") > 0  # held: Jaeger is down
    container_id = pod.sidecar_status()["containerID"].removeprefix("containerd://")
    pod.node.containerd.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)

    def restarted() -> bool:
        status = pod.sidecar_status()
        return bool(status["restartCount"] > before and status["started"] and status["ready"])

    assert wait_for(restarted, WAIT_S, 1.0), pod.sidecar_status()
    jaeger.start(timeout_s=120)
    want = (DURABLE_SPANS, DURABLE_SPANS)
    assert wait_for(lambda: _spans_in_jaeger(jaeger, report["trace_id"]) == want, WAIT_S, 1.0), (
        _spans_in_jaeger(jaeger, report["trace_id"]),
        pod.logs(SIDECAR)[-4000:],
    )
    replayed = metric_value(
        pod.admin("/metrics")[1], "gym_sidecar_queue_replayed_items_total", signal="traces"
    )
    assert replayed >= 1, "the restarted sidecar did not replay its disk queue"
    assert "replaying" in pod.logs(SIDECAR)


# --- 5. deletion: the apps' last spans first, then the sidecar ---------------------------


def test_deleting_the_pod_delivers_the_apps_last_spans(pod: Pod, jaeger: JaegerServer) -> None:
    pod.plane.kubectl(
        "delete", "pod", "-n", pod.namespace, pod.name, "--wait=true", "--timeout=600s",
        timeout=900,
    )  # fmt: skip
    for sender in gym_pod.SENDERS:
        service = gym_pod.service_name(sender)

        def last_trace(s: str = service) -> tuple[int, int]:
            found = jaeger.find_traces(s, {"phase": "last"})
            if len(found) != 1:
                return 0, 0
            return _spans_in_jaeger(jaeger, found[0].trace_id)

        want = (gym_pod.LAST_SPANS, gym_pod.LAST_SPANS)
        assert wait_for(lambda f=last_trace, w=want: f() == w, 120, 1.0), (sender, last_trace())


# --- 6. the host as it was ----------------------------------------------------------------


def test_the_host_is_left_as_it_was(node: Node, jaeger: JaegerServer) -> None:
    jaeger.stop()
    differences = node.teardown()
    print(f"node timings: {json.dumps(node.timings)}; teardown notes: {node.teardown_notes}")
    assert differences == [], differences
    assert not RUN_DIR.exists() and not (node_cache_dir() / "kubelet").exists()
