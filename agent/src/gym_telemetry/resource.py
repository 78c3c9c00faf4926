"""The agent's resource: service and Gym server identity, plus ``container.id``.

``build_resource`` merges, lowest precedence first:

1. what is detected here (``container.id`` when the process runs in a container);
2. the SDK's defaults and environment (``telemetry.sdk.*``, ``OTEL_RESOURCE_ATTRIBUTES``,
   ``OTEL_SERVICE_NAME``), through ``Resource.create``;
3. the caller's arguments (``service_name``, ``server_name``, ``server_type``,
   ``resource_attributes``).

So argument > environment > detection > default, the SDK's usual order.
``service.name`` falls back to the Gym server name when neither an argument nor the
environment names the service.

Container detection reads ``/proc/self/cgroup`` (cgroup v1 and systemd-style v2 paths
carry the 64-hex container id) and then ``/proc/self/mountinfo`` (under cgroup v2 with
a private cgroup namespace, the runtime's ``.../containers/<id>/hostname`` bind mount
names it). It never raises; outside a container it returns None.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Final

import gym_telemetry_semconv as semconv
from opentelemetry.sdk.resources import Resource

from gym_telemetry import environment_variables

_log = logging.getLogger(__name__)

CONTAINER_ID: Final = "container.id"
DEFAULT_SERVICE_NAME: Final = "nemo-gym"

_CGROUP_PATH: Final = "/proc/self/cgroup"
_MOUNTINFO_PATH: Final = "/proc/self/mountinfo"
_HEX64: Final = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")
# ``.../containers/<id>/...`` (docker, podman ``overlay-containers``, CRI-O) in mountinfo.
_MOUNT_CONTAINER: Final = re.compile(r"/(?:overlay-)?containers/([0-9a-f]{64})/")


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in a ``/proc/self/cgroup`` text, or None.

    Handles ``.../docker/<id>``, ``.../docker-<id>.scope``, ``cri-containerd-<id>.scope``,
    ``crio-<id>.scope``, ``libpod-<id>.scope`` and kubepods paths: the last 64-hex run
    in a line's path.
    """
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        ids = _HEX64.findall(path)
        if ids:
            return str(ids[-1])
    return None


def container_id_from_mountinfo(text: str) -> str | None:
    """The container id in a ``/proc/self/mountinfo`` text, or None.

    Looks for the runtime's per-container directory (``/containers/<id>/`` or
    ``/overlay-containers/<id>/``), preferring the ``hostname``/``hosts``/``resolv.conf``
    bind mounts that every container has. Pod-sandbox paths are not container ids and
    are ignored.
    """
    fallback: str | None = None
    for line in text.splitlines():
        if "/sandboxes/" in line:
            continue
        match = _MOUNT_CONTAINER.search(line)
        if match is None:
            continue
        if any(name in line for name in ("/hostname", "/hosts", "/resolv.conf")):
            return match.group(1)
        fallback = fallback or match.group(1)
    return fallback


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def detect_container_id(
    cgroup_path: str = _CGROUP_PATH, mountinfo_path: str = _MOUNTINFO_PATH
) -> str | None:
    """The id of the container this process runs in, or None. Never raises."""
    try:
        return container_id_from_cgroup(_read(cgroup_path)) or container_id_from_mountinfo(
            _read(mountinfo_path)
        )
    except Exception as exc:  # detection is best effort; a resource without it is fine
        _log.debug("gym_telemetry: container id detection failed: %r", exc)
        return None


def build_resource(
    service_name: str | None = None,
    *,
    server_name: str | None = None,
    server_type: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resource:
    """The resource for this Gym server process (see the module docstring for precedence)."""
    env = os.environ if environ is None else environ
    detected: dict[str, Any] = {}
    container_id = detect_container_id()
    if container_id:
        detected[CONTAINER_ID] = container_id

    explicit: dict[str, Any] = {}
    if server_name:
        explicit[semconv.SERVER_NAME] = server_name
    if server_type:
        explicit[semconv.SERVER_TYPE] = server_type
    if resource_attributes:
        explicit.update({str(k): v for k, v in resource_attributes.items() if v is not None})
    if service_name:
        explicit[semconv.SERVICE_NAME] = service_name

    resource = Resource(detected).merge(Resource.create(explicit))
    current = resource.attributes.get(semconv.SERVICE_NAME)
    env_names_service = bool(env.get(environment_variables.OTEL_SERVICE_NAME)) or (
        "service.name=" in env.get(environment_variables.OTEL_RESOURCE_ATTRIBUTES, "")
    )
    if (
        not service_name
        and not env_names_service
        and (current is None or str(current).startswith("unknown_service"))
    ):
        resource = resource.merge(
            Resource({semconv.SERVICE_NAME: server_name or DEFAULT_SERVICE_NAME})
        )
    return resource
