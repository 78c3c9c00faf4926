"""The pod the node test runs: three real Gym servers and two OTLP senders, opted in for
injection, meeting the ``restricted`` Pod Security Standard, plus what its namespace
needs on a cluster without controllers.

The Gym servers are the demo rollout's (``examples/gym_stack``: the stub model, the
shipped ``example_single_tool_call`` resources server, ``simple_agent``), one container
each in the ``gym-server`` image, addressed to each other on the pod's localhost
(:data:`GYM_STACK`); each listens on the pod IP too (``GYM_SERVER_BIND_HOST``), for the
kubelet's readiness probes and the test's rollouts. The two senders
(``pod_otlp_sender.py``, an OpenTelemetry SDK app) differ only in the protocol the app
chose: ``http-sender`` sets ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`` itself,
``grpc-sender`` sets nothing, so the injector's pair applies. No container names the
sidecar's address: the injector gives it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SENDER = HERE / "pod_otlp_sender.py"
GYM_IMAGE = "gym-server:0.1.0"
SIDECAR_IMAGE = "gym-telemetry-sidecar:0.1.0"
AGENT_PORT, MODEL_PORT, TOOLS_PORT = 8000, 8001, 8002
START_SPANS, LAST_SPANS = 100, 20
"""Spans each sender sends when it starts, and when the pod is deleted."""
SERVERS = {  # container -> the Gym config's server key
    "simple-agent": "example_single_tool_call_simple_agent",
    "stub-model": "policy_model",
    "tool-server": "example_single_tool_call",
}
SENDERS = {"http-sender": "http/protobuf", "grpc-sender": "grpc"}
"""Container -> the protocol it ends up speaking (the app's own, or the injector's)."""


def service_name(container: str) -> str:
    """The ``service.name`` each container's spans carry."""
    if container in SERVERS:
        return f"nemo-gym/{SERVERS[container]}"
    return f"pod-test/{container}"


GYM_STACK: dict[str, Any] = {
    "head_server": {"host": "127.0.0.1", "port": 11000},  # not started (launcher doc)
    "policy_model": {
        "responses_api_models": {
            "stub_model": {"entrypoint": "app.py", "host": "127.0.0.1", "port": MODEL_PORT}
        }
    },
    "example_single_tool_call": {
        "resources_servers": {
            "example_single_tool_call": {
                "entrypoint": "app.py",
                "domain": "agent",
                "verified": False,
                "description": "Basic single-step tool calling",
                "host": "127.0.0.1",
                "port": TOOLS_PORT,
            }
        }
    },
    "example_single_tool_call_simple_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "entrypoint": "app.py",
                "resources_server": {
                    "type": "resources_servers",
                    "name": "example_single_tool_call",
                },
                "model_server": {"type": "responses_api_models", "name": "policy_model"},
                "host": "127.0.0.1",
                "port": AGENT_PORT,
            }
        }
    },
}

RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def config_maps(namespace: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The Gym config, the sender's code, and ``kube-root-ca.crt`` (no controller manager
    publishes it here; every pod's service-account token volume mounts it)."""

    def cm(name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        }

    return [
        cm("gym-stack", {"stack.yaml": yaml.safe_dump(GYM_STACK, sort_keys=False)}),
        cm("otlp-sender", {"pod_otlp_sender.py": SENDER.read_text()}),
        cm("kube-root-ca.crt", {"ca.crt": ca_pem.decode()}),
    ]


def _gym_server(container: str, port: int) -> dict[str, Any]:
    # Each listens on the pod IP too: the kubelet's readiness probe, and the test's
    # rollouts to the agent, come from outside the pod's network namespace.
    env = [{"name": "GYM_SERVER_BIND_HOST", "value": "0.0.0.0"}]
    return {
        "name": container,
        "image": GYM_IMAGE,
        "imagePullPolicy": "Never",
        "args": ["/etc/gym/stack.yaml", SERVERS[container]],
        "env": env,
        "ports": [{"name": f"gym-{port}", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": dict(RESTRICTED),
        "volumeMounts": [{"name": "gym-stack", "mountPath": "/etc/gym", "readOnly": True}],
    }


def _sender(container: str, own_protocol: str | None) -> dict[str, Any]:
    env = [
        {"name": "OTEL_SERVICE_NAME", "value": service_name(container)},
        # The gym-server image switches the agent on for every Python process; this app
        # is a plain OpenTelemetry SDK app.
        {"name": "GYM_TELEMETRY", "value": "0"},
    ]
    if own_protocol is not None:
        env.append({"name": "OTEL_EXPORTER_OTLP_PROTOCOL", "value": own_protocol})
    return {
        "name": container,
        "image": GYM_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python", "/opt/sender/pod_otlp_sender.py"],
        "args": ["serve", f"--spans={START_SPANS}", f"--last={LAST_SPANS}"],
        "env": env,
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": dict(RESTRICTED),
        "volumeMounts": [{"name": "otlp-sender", "mountPath": "/opt/sender", "readOnly": True}],
    }


def gym_pod(name: str, node_name: str, inject_annotation: str) -> dict[str, Any]:
    """The pod, bound to ``node_name`` (no scheduler), opted in by its annotation."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "gym-pod-test"},
            "annotations": {
                inject_annotation: "true",
                "kubectl.kubernetes.io/default-container": "simple-agent",
            },
        },
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": 60,
            "securityContext": {
                "runAsNonRoot": True,  # both images run as uid 10001
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                _gym_server("simple-agent", AGENT_PORT),
                _gym_server("stub-model", MODEL_PORT),
                _gym_server("tool-server", TOOLS_PORT),
                _sender("http-sender", "http/protobuf"),
                _sender("grpc-sender", None),
            ],
            "volumes": [
                {"name": "gym-stack", "configMap": {"name": "gym-stack"}},
                {"name": "otlp-sender", "configMap": {"name": "otlp-sender"}},
            ],
        },
    }
