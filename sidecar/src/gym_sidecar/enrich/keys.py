"""Resource attribute keys the enrichment sources add (OpenTelemetry semantic conventions).

The one place these strings live on the sidecar side; Gym's own keys come from
``gym_telemetry_semconv``. Notes on choices:

- The image tag goes out under two keys: ``container.image.tags`` (a string array, the
  current convention) and ``container.image.tag`` (a plain string, the older key, which
  the conventions now mark deprecated). The second is kept because the sidecar's
  requirements name it and because backends search and display a string key more
  easily (Jaeger's tag search matches string values).
- Docker compose's project and service are container labels, recorded per the
  convention ``container.label.<key>`` (e.g. ``container.label.com.docker.compose.service``);
  the conventions define no ``docker.compose.*`` keys.
- Pod labels and annotations use ``k8s.pod.label.<key>`` / ``k8s.pod.annotation.<key>``.
"""

from __future__ import annotations

from typing import Final

from gym_telemetry_semconv.attributes import SERVER_NAME, SERVER_TYPE

HOST_NAME: Final = "host.name"
HOST_ARCH: Final = "host.arch"
OS_TYPE: Final = "os.type"

CONTAINER_ID: Final = "container.id"
CONTAINER_NAME: Final = "container.name"
CONTAINER_IMAGE_NAME: Final = "container.image.name"
CONTAINER_IMAGE_TAGS: Final = "container.image.tags"
CONTAINER_IMAGE_TAG: Final = "container.image.tag"
CONTAINER_LABEL_PREFIX: Final = "container.label."

K8S_POD_LABEL_PREFIX: Final = "k8s.pod.label."
K8S_POD_ANNOTATION_PREFIX: Final = "k8s.pod.annotation."

GYM_SERVER_NAME: Final = SERVER_NAME
GYM_SERVER_TYPE: Final = SERVER_TYPE
