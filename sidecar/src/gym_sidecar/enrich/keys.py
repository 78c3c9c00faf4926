"""Resource attribute keys the enrichment sources add (OpenTelemetry semantic conventions).

The one place these strings live on the sidecar side; Gym's own keys come from
``gym_telemetry.semconv``. Notes on choices:

- ``container.image.tags`` (a string array) is the current, stable key; the older
  ``container.image.tag`` is deprecated in the conventions and is not emitted.
- Docker compose's project and service are container labels, recorded per the
  convention ``container.label.<key>`` (e.g. ``container.label.com.docker.compose.service``);
  the conventions define no ``docker.compose.*`` keys.
- Pod labels and annotations use ``k8s.pod.label.<key>`` / ``k8s.pod.annotation.<key>``.
"""

from __future__ import annotations

from typing import Final

from gym_telemetry.semconv import SERVER_NAME, SERVER_TYPE

HOST_NAME: Final = "host.name"
HOST_ARCH: Final = "host.arch"
OS_TYPE: Final = "os.type"

CONTAINER_ID: Final = "container.id"
CONTAINER_NAME: Final = "container.name"
CONTAINER_IMAGE_NAME: Final = "container.image.name"
CONTAINER_IMAGE_TAGS: Final = "container.image.tags"
CONTAINER_LABEL_PREFIX: Final = "container.label."

K8S_POD_LABEL_PREFIX: Final = "k8s.pod.label."
K8S_POD_ANNOTATION_PREFIX: Final = "k8s.pod.annotation."

GYM_SERVER_NAME: Final = SERVER_NAME
GYM_SERVER_TYPE: Final = SERVER_TYPE
