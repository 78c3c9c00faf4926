"""The enrichment itself: merge source attributes into OTLP resources, once per resource.

Precedence among sources (highest first; a higher source's value wins a key two
sources both give): ``attributes`` (static config) > ``environment``
(OTEL_RESOURCE_ATTRIBUTES) > ``gym`` (configured server name/type) > ``kubernetes`` >
``docker`` > ``host``. A key the agent already set is kept unless ``overwrite.keys``
names it or ``overwrite.sources`` names the source whose value won.

Cost: the enriched form of each distinct resource (keyed by its serialized bytes, plus
the client's IP when Docker peer lookups are on) is computed once and kept in a bounded
LRU. Per request, a ResourceSpans block of a trace request (its wire view,
:mod:`gym_sidecar.core.traces`) costs one cache lookup keyed by the resource bytes as
received, and sets the block's ``resource_out`` to the cached enriched bytes when they
differ; a ResourceMetrics / ResourceLogs block costs one serialization, one cache lookup
and one copy of the cached Resource. Docker data that is not cached yet is fetched in
the background (see ``docker_lookup``); the entry is recomputed when it arrives or
expires. Event-loop thread only; not thread-safe.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cachetools import LRUCache
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.core.stage import ExportRequest
from gym_sidecar.core.traces import TraceRequest
from gym_sidecar.enrich.attributes import AttributeValue, to_any_value
from gym_sidecar.enrich.config import EnrichConfig, SourceName
from gym_sidecar.enrich.docker_lookup import (
    DockerAttributes,
    DockerLookup,
    LookupKey,
    lookup_key,
    peer_ip,
)
from gym_sidecar.enrich.environment import environment_attributes
from gym_sidecar.enrich.gym import gym_attributes
from gym_sidecar.enrich.host import host_attributes
from gym_sidecar.enrich.keys import CONTAINER_ID
from gym_sidecar.enrich.kubernetes import kubernetes_attributes
from gym_sidecar.enrich.static import static_attributes
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

PRECEDENCE: Final[tuple[SourceName, ...]] = (
    "attributes",
    "environment",
    "gym",
    "kubernetes",
    "docker",
    "host",
)
"""Sources, highest precedence first."""

CacheKey = bytes | tuple[bytes, str | None]


@dataclass(slots=True)
class _Entry:
    resource: Resource
    unchanged: bool
    source: Resource
    docker_key: LookupKey | None
    docker_attrs: DockerAttributes | None
    recheck_at: float
    """When to look at the Docker cache again (inf: never; 0: every time, pending)."""
    serialized: bytes | None = None
    """``resource`` serialized, made when a trace block first needs it."""

    def resource_bytes(self) -> bytes:
        if self.serialized is None:
            self.serialized = self.resource.SerializeToString()
        return self.serialized


def resource_blocks(message: ExportRequest) -> Sequence[Any]:
    """The ResourceMetrics / ResourceLogs blocks of a metrics or logs request."""
    if isinstance(message, TraceRequest):
        raise TypeError("a trace request's blocks are its wire view's (TraceRequest.blocks)")
    if message.DESCRIPTOR.name == "ExportMetricsServiceRequest":
        return message.resource_metrics  # type: ignore[union-attr]
    return message.resource_logs  # type: ignore[union-attr]


class Enricher:
    """Adds source attributes to resources (see the module docstring for the rules)."""

    def __init__(
        self,
        cfg: EnrichConfig,
        layers: Mapping[SourceName, Mapping[str, AttributeValue]],
        docker: DockerLookup | None,
        metrics: SelfMetrics,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.docker = docker
        self._layers = {name: dict(attrs) for name, attrs in layers.items()}
        self._overwrite_keys = frozenset(cfg.overwrite.keys)
        self._overwrite_sources = frozenset(cfg.overwrite.sources)
        self._cache: LRUCache[CacheKey, _Entry] = LRUCache(maxsize=cfg.cache_max_entries)
        self._oversize = metrics.limit_hits.labels(limit="enrich_max_resource_bytes")
        self.computed = 0
        """Resources enriched from scratch (cache misses, oversize, Docker updates)."""

    @classmethod
    def from_config(
        cls,
        cfg: EnrichConfig,
        metrics: SelfMetrics,
        environ: Mapping[str, str] | None = None,
    ) -> Enricher:
        """Read every static source once (environment, host, podinfo files: blocking,
        startup only) and prepare the Docker source (skipped without a socket)."""
        layers: dict[SourceName, Mapping[str, AttributeValue]] = {
            "attributes": static_attributes(cfg),
            "environment": environment_attributes(environ) if cfg.environment else {},
            "gym": gym_attributes(cfg),
            "kubernetes": kubernetes_attributes(cfg.kubernetes, environ),
            "host": host_attributes() if cfg.host else {},
        }
        docker: DockerLookup | None = None
        if cfg.docker.enabled:
            docker = DockerLookup(cfg.docker, metrics)
            docker.start()
            if not docker.enabled:
                docker = None
        logger.info(
            "enrichment sources: %s",
            ", ".join(f"{name}={len(attrs)} keys" for name, attrs in layers.items()),
        )
        return cls(cfg, layers, docker, metrics)

    def close(self) -> None:
        """Stop background lookups. Safe twice."""
        if self.docker is not None:
            self.docker.close()

    # -- per request ---------------------------------------------------------------
    def enrich(self, message: ExportRequest, peer: str | None) -> None:
        """Enrich every resource block of ``message`` in place (never blocks)."""
        docker = self.docker
        by_peer = docker is not None and self.cfg.docker.by_peer_address
        ip = peer_ip(peer) if by_peer and peer else None
        if isinstance(message, TraceRequest):
            for block in message.blocks:
                entry = self._entry(block.current_resource, None, ip, by_peer)
                if not entry.unchanged:
                    block.resource_out = entry.resource_bytes()
            return
        for block in resource_blocks(message):
            resource = block.resource
            entry = self._entry(resource.SerializeToString(), resource, ip, by_peer)
            if not entry.unchanged:
                resource.CopyFrom(entry.resource)

    def _entry(
        self, raw: bytes, resource: Resource | None, ip: str | None, by_peer: bool
    ) -> _Entry:
        """The enriched form of the resource serialized as ``raw`` (``resource``: the
        same, parsed, if at hand), from the cache or computed."""
        if len(raw) > self.cfg.max_resource_bytes:
            self._oversize.inc()
            return self._compute(resource if resource is not None else Resource.FromString(raw), ip)
        key: CacheKey = (raw, ip) if by_peer else raw
        entry = self._cache.get(key)
        if entry is None:
            source = resource if resource is not None else Resource.FromString(raw)
            entry = self._compute(source, ip)
            self._cache[key] = entry
        elif entry.docker_key is not None and entry.recheck_at <= time.monotonic():
            entry = self._recheck(key, entry)
        return entry

    # -- computing -----------------------------------------------------------------
    def _docker_state(self, key: LookupKey | None) -> tuple[DockerAttributes | None, float]:
        if key is None or self.docker is None:
            return None, math.inf
        hit = self.docker.cached(key)
        if hit is None:
            self.docker.request(key)
            return None, 0.0
        return hit

    def _compute(self, resource: Resource, ip: str | None) -> _Entry:
        self.computed += 1
        source = Resource()
        source.CopyFrom(resource)
        docker_key: LookupKey | None = None
        if self.docker is not None:
            container_id = None
            for kv in source.attributes:
                if kv.key == CONTAINER_ID and kv.value.HasField("string_value"):
                    container_id = kv.value.string_value
            docker_key = lookup_key(container_id, ip, self.cfg.docker.by_peer_address)
        docker_attrs, recheck_at = self._docker_state(docker_key)
        enriched, unchanged = self._merge(source, docker_attrs)
        return _Entry(enriched, unchanged, source, docker_key, docker_attrs, recheck_at)

    def _recheck(self, key: CacheKey, entry: _Entry) -> _Entry:
        docker_attrs, recheck_at = self._docker_state(entry.docker_key)
        if docker_attrs != entry.docker_attrs:
            self.computed += 1
            enriched, unchanged = self._merge(entry.source, docker_attrs)
            entry = _Entry(
                enriched, unchanged, entry.source, entry.docker_key, docker_attrs, recheck_at
            )
            self._cache[key] = entry
        else:
            entry.recheck_at = recheck_at
        return entry

    def _winning(
        self, docker_attrs: DockerAttributes | None
    ) -> Iterable[tuple[str, AttributeValue, SourceName]]:
        merged: dict[str, tuple[AttributeValue, SourceName]] = {}
        for name in reversed(PRECEDENCE):
            attrs = docker_attrs if name == "docker" else self._layers.get(name)
            for key, value in (attrs or {}).items():
                merged[key] = (value, name)
        return ((k, v, s) for k, (v, s) in merged.items())

    def _merge(
        self, source: Resource, docker_attrs: DockerAttributes | None
    ) -> tuple[Resource, bool]:
        out = Resource()
        out.CopyFrom(source)
        index = {kv.key: i for i, kv in enumerate(out.attributes)}
        changed = False
        for key, value, name in self._winning(docker_attrs):
            position = index.get(key)
            if position is None:
                out.attributes.append(KeyValue(key=key, value=to_any_value(value)))
                changed = True
            elif key in self._overwrite_keys or name in self._overwrite_sources:
                current = out.attributes[position].value
                wanted = to_any_value(value)
                if current != wanted:
                    current.CopyFrom(wanted)
                    changed = True
        return out, not changed
