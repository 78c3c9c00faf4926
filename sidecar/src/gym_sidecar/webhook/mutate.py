"""The injection itself: a pure function from a pod to the pod with the sidecar.

Nothing here does I/O (beyond a log line) or keeps state: :func:`mutate` copies its
input and returns the injected copy, and the HTTP layer diffs the two into a JSON patch.
The mutation is convergent, so running it again (a second webhook call, ``reinvocationPolicy:
IfNeeded``) changes nothing: the sidecar is recognised by its container name, and app
variables are only ever added when missing.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import gym_telemetry_semconv as semconv

from gym_sidecar.core.downward_api import (
    ENV_TO_ATTRIBUTE,
    PODINFO_ANNOTATIONS_FILE,
    PODINFO_DEFAULT_DIR,
    PODINFO_DIR_ENV,
    PODINFO_LABELS_FILE,
    PODINFO_VOLUME_NAME,
)
from gym_sidecar.webhook.config import InjectorConfig
from gym_sidecar.webhook.otlp_env import SidecarPorts, otlp_env

_log = logging.getLogger(__name__)

INJECT_ANNOTATION = "telemetry.nemo-gym.io/inject"
"""Pod annotation (``"true"``/``"false"``); also the namespace *label* of the same name."""
INJECTED_ANNOTATION = "telemetry.nemo-gym.io/injected"
"""Set on every pod the injector changed; its value is the injection mode."""
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

CONFIG_VOLUME_NAME = "gym-telemetry-sidecar-config"
CONFIG_MOUNT_DIR = "/etc/gym-sidecar"
DATA_VOLUME_NAME = "gym-telemetry-data"
DATA_PARENT_DIR = "/var/lib"
"""The sidecar's default data directory is ``$XDG_DATA_HOME/gym-sidecar``: with the root
filesystem read-only, it must be a writable volume (an emptyDir)."""

# Where each downward-API variable comes from; the names are enrichment's constants.
_FIELD_REFS: dict[str, str] = {
    "K8S_POD_NAME": "metadata.name",
    "K8S_POD_UID": "metadata.uid",
    "K8S_NAMESPACE_NAME": "metadata.namespace",
    "K8S_NODE_NAME": "spec.nodeName",
}
_APP_CONTAINER_VAR = "K8S_CONTAINER_NAME"
AGENT_ADMIN_URL_ENV = "GYM_TELEMETRY_SIDECAR_ADMIN_URL"
"""Where the agent in an app container polls the sidecar's span groups: the agent's
``gym_telemetry.remote_config.ENV_ADMIN_URL`` (a test holds the two equal)."""
if set(_FIELD_REFS) | {_APP_CONTAINER_VAR} != set(ENV_TO_ATTRIBUTE):
    raise ImportError("downward_api.ENV_TO_ATTRIBUTE changed: update the webhook's fieldRefs")


@dataclass(frozen=True)
class Decision:
    """Whether to inject, and why (the reason is logged and counted)."""

    inject: bool
    reason: str


def decide(pod: dict[str, Any], namespace_opted_in: bool) -> Decision:
    """The opt-in rule: the pod's annotation, else its namespace's label.

    ``namespace_opted_in`` comes from which webhook entry called (its namespaceSelector
    matched the namespace label ``telemetry.nemo-gym.io/inject=true``). A pod annotation
    ``"true"`` or ``"false"`` overrides it either way.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(INJECT_ANNOTATION, "")).strip().lower()
    if value == "true":
        return Decision(True, "pod annotation")
    if value == "false":
        return Decision(False, "pod annotation opts out")
    if value:
        return Decision(False, f"pod annotation has unrecognised value {value!r}")
    if namespace_opted_in:
        return Decision(True, "namespace label")
    return Decision(False, "not opted in")


def _app_container_name(pod: dict[str, Any], containers: list[dict[str, Any]]) -> str:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    preferred = annotations.get(DEFAULT_CONTAINER_ANNOTATION)
    names = [str(c.get("name", "")) for c in containers]
    if isinstance(preferred, str) and preferred in names:
        return preferred
    return names[0] if names else ""


def sidecar_container(config: InjectorConfig, app_container: str, native: bool) -> dict[str, Any]:
    """The container spec added to a pod (before the native/plain placement)."""
    env: list[dict[str, Any]] = [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in _FIELD_REFS.items()
    ]
    env.append({"name": _APP_CONTAINER_VAR, "value": app_container})
    env.append({"name": PODINFO_DIR_ENV, "value": PODINFO_DEFAULT_DIR})
    # Probes and Prometheus reach the admin listener on the pod IP, not on loopback.
    env.append({"name": "GYM_SIDECAR_ADMIN_LISTEN", "value": f"0.0.0.0:{config.admin_port}"})
    # The sidecar's data directory when its config names none (local store, disk queue).
    env.append({"name": "XDG_DATA_HOME", "value": DATA_PARENT_DIR})
    mounts: list[dict[str, Any]] = [
        {"name": PODINFO_VOLUME_NAME, "mountPath": PODINFO_DEFAULT_DIR, "readOnly": True},
        {"name": DATA_VOLUME_NAME, "mountPath": f"{DATA_PARENT_DIR}/gym-sidecar"},
    ]
    if config.config_map is not None:
        env.append(
            {"name": "GYM_SIDECAR_CONFIG", "value": f"{CONFIG_MOUNT_DIR}/{config.config_key}"}
        )
        mounts.append({"name": CONFIG_VOLUME_NAME, "mountPath": CONFIG_MOUNT_DIR, "readOnly": True})
    env.extend({"name": k, "value": v} for k, v in sorted(config.sidecar_env.items()))
    env.extend(
        {
            "name": k,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key, "optional": True}},
        }
        for k, ref in sorted(config.sidecar_secret_env.items())
    )
    container: dict[str, Any] = {
        "name": config.container_name,
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "args": ["run"],
        "ports": [
            {"name": "otlp-grpc", "containerPort": config.grpc_port, "protocol": "TCP"},
            {"name": "otlp-http", "containerPort": config.http_port, "protocol": "TCP"},
            {"name": "gym-admin", "containerPort": config.admin_port, "protocol": "TCP"},
        ],
        "env": env,
        "volumeMounts": mounts,
        "resources": config.resources.model_dump(),
        "livenessProbe": {
            "httpGet": {"path": semconv.HEALTHZ_PATH, "port": config.admin_port},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": config.security_context.to_kubernetes(),
    }
    if native:
        # The app containers start only once this succeeds: the sidecar is ready first.
        container["restartPolicy"] = "Always"
        container["startupProbe"] = {
            "httpGet": {"path": semconv.READYZ_PATH, "port": config.admin_port},
            "periodSeconds": 1,
            "failureThreshold": config.startup_failure_threshold,
        }
    return container


def _volumes(config: InjectorConfig) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {
            "name": PODINFO_VOLUME_NAME,
            "downwardAPI": {
                "items": [
                    {"path": PODINFO_LABELS_FILE, "fieldRef": {"fieldPath": "metadata.labels"}},
                    {
                        "path": PODINFO_ANNOTATIONS_FILE,
                        "fieldRef": {"fieldPath": "metadata.annotations"},
                    },
                ]
            },
        }
    ]
    volumes.append({"name": DATA_VOLUME_NAME, "emptyDir": {"sizeLimit": config.data_size_limit}})
    if config.config_map is not None:
        volumes.append({"name": CONFIG_VOLUME_NAME, "configMap": {"name": config.config_map}})
    return volumes


_VOLUME_ROLES = {
    PODINFO_VOLUME_NAME: "pod labels and annotations (enrichment)",
    DATA_VOLUME_NAME: "data directory",
    CONFIG_VOLUME_NAME: "configuration",
}


def _pod_name(pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or metadata.get("generateName") or "<unnamed>"
    return f"{metadata.get('namespace') or ''}/{name}".lstrip("/")


def already_injected(pod: dict[str, Any], config: InjectorConfig) -> bool:
    """True when the pod already holds a container with the sidecar's name."""
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if container.get("name") == config.container_name:
                return True
    return False


def mutate(pod: dict[str, Any], config: InjectorConfig) -> dict[str, Any]:
    """Return a copy of ``pod`` with the sidecar injected; ``pod`` is left untouched.

    Adds (each only when absent): the sidecar container -- as the first init container
    with ``restartPolicy: Always`` when ``config.native_sidecar()``, else as a plain
    container --, the downward-API and config volumes, on every app container the OTLP
    endpoint and protocol (:func:`gym_sidecar.webhook.otlp_env.otlp_env`: right for the
    protocol the app speaks, never overriding its own), the ``app_env`` variables and
    the agent's span-group poll URL (``GYM_TELEMETRY_SIDECAR_ADMIN_URL``, on the
    configured ``admin_port``), and the
    ``telemetry.nemo-gym.io/injected`` annotation. A pod volume that already has an
    injected volume's name is kept, with a warning logged.
    Raises ValueError for a pod without ``spec.containers`` (the caller fails open).
    """
    out = copy.deepcopy(pod)
    spec = out.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        raise ValueError("pod has no spec.containers list")
    containers: list[dict[str, Any]] = spec["containers"]
    app_containers = [c for c in containers if c.get("name") != config.container_name]
    native = config.native_sidecar()

    if not already_injected(out, config):
        sidecar = sidecar_container(config, _app_container_name(out, app_containers), native)
        if native:
            spec["initContainers"] = [sidecar, *(spec.get("initContainers") or [])]
        else:
            containers.append(sidecar)
        volumes = spec.setdefault("volumes", [])
        present = {v.get("name"): v for v in volumes}
        for volume in _volumes(config):
            own = present.get(volume["name"])
            if own is None:
                volumes.append(volume)
            elif own != volume:
                # The sidecar would mount the pod's own volume in its place: say so.
                _log.warning(
                    "pod %s already has a volume named %r unlike the injected one; the "
                    "sidecar mounts the pod's volume there (rename it, or expect the "
                    "sidecar's %s to be wrong)",
                    _pod_name(out),
                    volume["name"],
                    _VOLUME_ROLES.get(volume["name"], "volume"),
                )
        metadata = out.setdefault("metadata", {})
        annotations = metadata.get("annotations") or {}
        annotations[INJECTED_ANNOTATION] = "native-sidecar" if native else "container"
        metadata["annotations"] = annotations

    app_env = {AGENT_ADMIN_URL_ENV: f"http://localhost:{config.admin_port}", **config.app_env}
    ports = SidecarPorts(grpc=config.grpc_port, http=config.http_port)
    for container in app_containers:
        env = container.setdefault("env", [])
        env.extend(
            otlp_env(
                env,
                has_env_from=bool(container.get("envFrom")),
                ports=ports,
                default_protocol=config.otlp_protocol,
            )
        )
        present_names = {e.get("name") for e in env}
        env.extend(
            {"name": k, "value": v} for k, v in sorted(app_env.items()) if k not in present_names
        )  # never empty afterwards: app_env always holds the admin URL
    return out
