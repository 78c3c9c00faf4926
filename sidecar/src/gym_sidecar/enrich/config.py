"""Configuration of the enrich stage (owned by enrich/).

Every source can be switched off; every cache and queue has an explicit bound. See
docs/enrichment.md for what each source adds and the precedence among them.
"""

from __future__ import annotations

from typing import Literal

from gym_sidecar.configmodel import Field, Section
from gym_sidecar.core.downward_api import SERVER_NAME_LABEL

SourceName = Literal["attributes", "environment", "gym", "kubernetes", "docker", "host"]
"""Names of the enrichment sources, as used by ``overwrite.sources``."""


class OverwriteConfig(Section):
    """Which enrichment values may replace a key the agent already set (default: none)."""

    keys: list[str] = Field(default_factory=list)
    """Resource keys whose enrichment value replaces the agent's value."""
    sources: list[SourceName] = Field(default_factory=list)
    """Sources all of whose keys replace the agent's values."""


class KubernetesConfig(Section):
    """The Kubernetes source: downward-API environment variables and podinfo files."""

    enabled: bool = True
    podinfo_dir: str | None = None
    """Directory of the downward-API volume. None: ``$GYM_SIDECAR_PODINFO_DIR`` or
    ``/etc/podinfo``."""
    labels: list[str] = Field(
        default_factory=lambda: ["app", "app.kubernetes.io/name", SERVER_NAME_LABEL]
    )
    """Pod labels copied as ``k8s.pod.label.<key>`` (only these: labels are unbounded)."""
    annotations: list[str] = Field(default_factory=list)
    """Pod annotations copied as ``k8s.pod.annotation.<key>``."""
    max_file_bytes: int = Field(default=256 * 1024, gt=0)
    """Podinfo files larger than this are ignored (and counted)."""


class DockerConfig(Section):
    """The Docker source: container metadata from the Docker Engine API."""

    enabled: bool = True
    """Look containers up when the socket exists; without a socket it is skipped."""
    base_url: str = "unix:///var/run/docker.sock"
    api_version: str = "auto"
    """Engine API version (``auto``: ask the engine once through ``GET /version``)."""
    timeout_s: float = Field(default=2.0, gt=0)
    cache_ttl_s: float = Field(default=300.0, gt=0)
    """How long a found container's metadata is reused."""
    negative_ttl_s: float = Field(default=60.0, gt=0)
    """How long a failed or empty lookup is remembered before it is tried again."""
    cache_max_entries: int = Field(default=4096, gt=0)
    max_pending_lookups: int = Field(default=64, gt=0)
    """Lookups queued or running at once; further misses are not looked up (counted)."""
    lookup_threads: int = Field(default=2, gt=0)
    by_peer_address: bool = True
    """Without ``container.id`` in the resource, find the container by the client's IP
    on a Docker network (compose). Loopback peers are never looked up."""
    labels: list[str] = Field(
        default_factory=lambda: ["com.docker.compose.project", "com.docker.compose.service"]
    )
    """Container labels copied as ``container.label.<key>``."""


class EnrichConfig(Section):
    attributes: dict[str, str] = Field(default_factory=dict)
    """Static resource attributes added to every resource."""
    server_name: str | None = None
    """Fallback for ``nemo.gym.server.name`` when the agent does not report it."""
    server_type: str | None = None
    """Fallback for ``nemo.gym.server.type`` when the agent does not report it."""
    environment: bool = True
    """Add the sidecar's own ``OTEL_RESOURCE_ATTRIBUTES``."""
    host: bool = True
    """Add ``host.name``, ``host.arch`` and ``os.type`` of the sidecar's host."""
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    docker: DockerConfig = Field(default_factory=DockerConfig)
    overwrite: OverwriteConfig = Field(default_factory=OverwriteConfig)
    cache_max_entries: int = Field(default=1024, gt=0)
    """Distinct resources whose enriched form is kept (LRU)."""
    max_resource_bytes: int = Field(default=16 * 1024, gt=0)
    """Resources larger than this (serialized) are enriched without caching (counted)."""
