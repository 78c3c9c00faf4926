"""Each enrichment source through the real sidecar: OTLP in over gRPC, a real sidecar
process, a recording OTLP backend out. Docker is served by the Engine API contract
server (no Docker engine runs here); Kubernetes by the environment variables and
downward-API files the injection webhook would provide."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gym_sidecar.core import downward_api

from testkit.otlp_samples import grpc_export, kv, logs_request, metrics_request, trace_request
from testkit.sink import RecordingSink, attrs
from tests.support.docker_engine import EngineContractServer, FakeContainer
from tests.support.sidecar_proc import SidecarProcess

CID = "5e1dca4" + "0" * 57
K8S_ENV = {
    "K8S_POD_NAME": "gym-math-0",
    "K8S_POD_UID": "9b8f1c1e-0000-4000-8000-000000000001",
    "K8S_NAMESPACE_NAME": "gym",
    "K8S_NODE_NAME": "node-7",
    "K8S_CONTAINER_NAME": "math-server",
}


@pytest.fixture(scope="module")
def sink() -> Iterator[RecordingSink]:
    with RecordingSink() as s:
        yield s


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineContractServer]:
    with EngineContractServer(tmp_path_factory.mktemp("engine") / "docker.sock") as server:
        server.add(
            FakeContainer(
                CID,
                "gym-math-1",
                "registry.local:5000/gym/math:0.4",
                {"com.docker.compose.project": "gym", "com.docker.compose.service": "math"},
                {"gym_default": "172.18.0.9"},
            )
        )
        yield server


@pytest.fixture(scope="module")
def sidecar(
    sink: RecordingSink, engine: EngineContractServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    podinfo = tmp_path_factory.mktemp("podinfo")
    (podinfo / downward_api.PODINFO_LABELS_FILE).write_text(
        f'app="gym"\n{downward_api.SERVER_NAME_LABEL}="math"\npod-template-hash="x1"\n'
    )
    (podinfo / downward_api.PODINFO_ANNOTATIONS_FILE).write_text('owner="rl-team"\n')
    config: dict[str, Any] = {
        "enrich": {
            "attributes": {
                "deployment.environment.name": "ci",
                "team": "cfg-team",
                "service.namespace": "cfg-ns",
            },
            "server_name": "cfg-server",
            "server_type": "resources",
            "overwrite": {"keys": ["service.namespace"]},
            "kubernetes": {"annotations": ["owner"]},
            "docker": {"base_url": engine.base_url, "api_version": "1.45"},
        }
    }
    env = {
        "OTEL_RESOURCE_ATTRIBUTES": "cloud.region=eu%2Dwest%201,team=env-team",
        downward_api.PODINFO_DIR_ENV: str(podinfo),
        **K8S_ENV,
    }
    with SidecarProcess(backend=sink.endpoint, config=config, env=env) as sc:
        yield sc
    assert sc.returncode == 0


def resource_of_span(sink: RecordingSink, name: str, timeout_s: float = 30.0) -> dict[str, Any]:
    assert sink.wait_for(lambda: any(s.span.name == name for s in sink.spans()), timeout_s)
    return next(s.resource for s in sink.spans() if s.span.name == name)


def send(sidecar: SidecarProcess, tag: str, **resource: str) -> None:
    req = trace_request(tag, spans=1, service=resource.pop("service_name", "svc"))
    req.resource_spans[0].resource.attributes.extend(kv(k, v) for k, v in resource.items())
    grpc_export(sidecar.grpc_endpoint, "traces", req)


def test_static_environment_host_gym_and_kubernetes(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    send(sidecar, "sources")
    res = resource_of_span(sink, "sources-0")
    assert res["service.name"] == "svc"
    assert res["deployment.environment.name"] == "ci"  # static config
    assert res["cloud.region"] == "eu-west 1"  # OTEL_RESOURCE_ATTRIBUTES, decoded
    assert res["team"] == "cfg-team"  # static config beats the environment
    assert res["host.name"] == socket.gethostname()
    assert res["host.arch"] and res["os.type"] == "linux"
    assert res["nemo.gym.server.name"] == "cfg-server"
    assert res["nemo.gym.server.type"] == "resources"
    for var, key in downward_api.ENV_TO_ATTRIBUTE.items():
        assert res[key] == K8S_ENV[var]
    assert res["k8s.pod.label.app"] == "gym"
    assert res[f"k8s.pod.label.{downward_api.SERVER_NAME_LABEL}"] == "math"
    assert "k8s.pod.label.pod-template-hash" not in res  # only selected labels
    assert res["k8s.pod.annotation.owner"] == "rl-team"


def test_agent_keys_kept_unless_a_rule_overrides(
    sidecar: SidecarProcess, sink: RecordingSink
) -> None:
    send(
        sidecar,
        "agentkeys",
        team="agent-team",
        **{"service.namespace": "agent-ns", "nemo.gym.server.name": "agent-server"},
    )
    res = resource_of_span(sink, "agentkeys-0")
    assert res["team"] == "agent-team"
    assert res["nemo.gym.server.name"] == "agent-server"
    assert res["service.namespace"] == "cfg-ns"  # overwrite.keys


def test_docker_metadata_by_container_id(
    sidecar: SidecarProcess, sink: RecordingSink, engine: EngineContractServer
) -> None:
    # The first requests may pass before the background lookup lands; it never blocks.
    deadline = time.monotonic() + 60
    res: dict[str, Any] = {}
    attempt = 0
    while time.monotonic() < deadline and "container.name" not in res:
        send(sidecar, f"docker{attempt}", **{"container.id": CID})
        res = resource_of_span(sink, f"docker{attempt}-0")
        attempt += 1
        time.sleep(0.05)
    assert res["container.id"] == CID  # the agent's value is kept
    assert res["container.name"] == "gym-math-1"
    assert res["container.image.name"] == "registry.local:5000/gym/math"
    assert res["container.image.tags"] == ["0.4"]
    assert res["container.image.tag"] == "0.4"  # the older key, also named by issue 6
    assert res["container.label.com.docker.compose.project"] == "gym"
    assert res["container.label.com.docker.compose.service"] == "math"
    assert engine.count(f"/containers/{CID}/json") == 1  # cached after one lookup


def test_metrics_and_logs_resources_enriched(sidecar: SidecarProcess, sink: RecordingSink) -> None:
    grpc_export(sidecar.grpc_endpoint, "metrics", metrics_request("enrich.metric"))
    grpc_export(sidecar.grpc_endpoint, "logs", logs_request("enrich-log"))

    def resources() -> list[dict[str, Any]]:
        out = [
            attrs(rm.resource.attributes)
            for req in sink.metric_requests()
            for rm in req.resource_metrics
            if any(m.name == "enrich.metric" for sm in rm.scope_metrics for m in sm.metrics)
        ]
        out += [
            attrs(rl.resource.attributes)
            for req in sink.log_requests()
            for rl in req.resource_logs
            if any(
                r.body.string_value.startswith("enrich-log")
                for sl in rl.scope_logs
                for r in sl.log_records
            )
        ]
        return out

    assert sink.wait_for(lambda: len(resources()) >= 2)
    for res in resources():
        assert res["deployment.environment.name"] == "ci"
        assert res["k8s.pod.name"] == K8S_ENV["K8S_POD_NAME"]


def test_docker_socket_absent_is_skipped_with_one_log_line(
    sink: RecordingSink, tmp_path: Path
) -> None:
    missing = tmp_path / "no-docker.sock"
    config = {
        "enrich": {
            "attributes": {"marker": "nodocker"},
            "docker": {"base_url": f"unix://{missing}"},
        }
    }
    with SidecarProcess(backend=sink.endpoint, config=config) as sc:
        for i in range(3):
            send(sc, f"nodocker{i}", **{"container.id": CID})
        for i in range(3):
            res = resource_of_span(sink, f"nodocker{i}-0")
            assert res["marker"] == "nodocker"
            assert "container.name" not in res
        log = sc.log_text()
    assert sc.returncode == 0
    lines = [line for line in log.splitlines() if "Docker" in line or "docker" in line]
    assert len(lines) == 1, lines
    assert "skipped" in lines[0] and str(missing) in lines[0]
    assert "ERROR" not in log and "Traceback" not in log
