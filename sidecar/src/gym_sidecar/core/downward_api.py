"""The Kubernetes downward-API contract between the injection webhook and enrichment.

The webhook (``gym_sidecar.webhook``) sets these variables and mounts this volume on the
sidecar container; the Kubernetes enrichment source reads them. Keeping both sides on
these constants is what makes them agree.
"""

from __future__ import annotations

from typing import Final

# Environment variable -> resource attribute (OpenTelemetry semantic conventions).
ENV_TO_ATTRIBUTE: Final[dict[str, str]] = {
    "K8S_POD_NAME": "k8s.pod.name",  # fieldRef: metadata.name
    "K8S_POD_UID": "k8s.pod.uid",  # fieldRef: metadata.uid
    "K8S_NAMESPACE_NAME": "k8s.namespace.name",  # fieldRef: metadata.namespace
    "K8S_NODE_NAME": "k8s.node.name",  # fieldRef: spec.nodeName
    "K8S_CONTAINER_NAME": "k8s.container.name",  # the app container's name (static value)
}

# Files of a downwardAPI volume (items: metadata.labels, metadata.annotations).
PODINFO_DIR_ENV: Final = "GYM_SIDECAR_PODINFO_DIR"
PODINFO_DEFAULT_DIR: Final = "/etc/podinfo"
PODINFO_LABELS_FILE: Final = "labels"
PODINFO_ANNOTATIONS_FILE: Final = "annotations"
PODINFO_VOLUME_NAME: Final = "gym-telemetry-podinfo"

# The pod label carrying the Gym server's name (set by the deployment; copied by the
# Kubernetes source as k8s.pod.label.<this key> when present).
SERVER_NAME_LABEL: Final = "telemetry.nemo-gym.io/server-name"
