"""The Docker source: metadata of the container that sent the data, from the Engine API.

Keyed by the resource's ``container.id`` (the agent finds it in /proc/self/cgroup or
mountinfo) or, without one, by the client's IP on a Docker network (compose). Adds
``container.name``, ``container.image.name``, ``container.image.tags`` and the older
``container.image.tag`` (see ``keys``), ``container.id`` (peer lookups only) and the
configured container labels as ``container.label.<key>``.

Contract:
- Lookups never run on the event loop: :meth:`DockerLookup.request` queues one on a
  small thread pool and returns at once; :meth:`DockerLookup.cached` answers from the
  cache only. A request that misses is enriched without Docker data; later requests of
  the same resource pick the result up.
- Results are cached with a TTL (``cache_ttl_s``); failures and unknown containers are
  cached too (``negative_ttl_s``), so a missing container costs one lookup per TTL.
- At most ``max_pending_lookups`` lookups are queued or running; misses beyond that are
  not looked up and are counted as ``limit_hits{limit="enrich_docker_pending"}``.
- With no Docker socket the source is skipped with one INFO log line.
- All methods except the lookup itself run on the event loop thread (not thread-safe).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import ipaddress
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from cachetools import TLRUCache
from gym_telemetry_semconv.ratelimit import rate_limit

from gym_sidecar.enrich.attributes import AttributeValue
from gym_sidecar.enrich.config import DockerConfig
from gym_sidecar.enrich.keys import (
    CONTAINER_ID,
    CONTAINER_IMAGE_NAME,
    CONTAINER_IMAGE_TAG,
    CONTAINER_IMAGE_TAGS,
    CONTAINER_LABEL_PREFIX,
    CONTAINER_NAME,
)
from gym_sidecar.selfmetrics import SelfMetrics

if TYPE_CHECKING:
    import docker

# The docker SDK (with requests/urllib3, ~8 MiB resident and ~0.3 s to import) is
# imported by the lookup threads only, so a sidecar without a Docker socket never loads it.

logger = logging.getLogger(__name__)
#: Lookup failures repeat per span while the daemon is unreachable: their own logger,
#: limited to one line per minute (``DockerLookup.errors`` counts every one).
_failure_log = rate_limit(logging.getLogger(__name__ + ".failures"), 60.0)

LookupKey = tuple[Literal["id", "ip"], str]
"""What a container is looked up by: its id, or an IP address on a Docker network."""

DockerAttributes = dict[str, AttributeValue]

_CONTAINER_ID = re.compile(r"^[0-9a-f]{12,64}$")
_UNIX = "unix://"


def lookup_key(container_id: str | None, peer: str | None, by_peer: bool) -> LookupKey | None:
    """The key to look a resource's container up by, or None when there is none.

    A ``container.id`` that is not 12-64 hex digits is ignored (never sent to the
    engine). Peer addresses are ``ip:port`` (``[v6]:port`` and gRPC's ``ipv4:``/``ipv6:``
    prefixes accepted); loopback and unparsable peers give None.
    """
    if container_id:
        cid = container_id.strip().lower()
        if _CONTAINER_ID.match(cid):
            return ("id", cid)
        return None
    if by_peer and peer:
        ip = peer_ip(peer)
        if ip is not None:
            return ("ip", ip)
    return None


def peer_ip(peer: str) -> str | None:
    """The IP of a peer address, or None if it is loopback or not an IP address."""
    text = peer
    for prefix in ("ipv4:", "ipv6:"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.rpartition(":")[0]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if addr.is_loopback:
        return None
    return str(addr)


def parse_image_reference(ref: str) -> tuple[str, str | None]:
    """Split an image reference into (name, tag). ``registry:5000/org/img:1.2`` gives
    (``registry:5000/org/img``, ``1.2``); a digest-only or untagged reference gives no
    tag except that an untagged, undigested one means ``latest`` (as Docker resolves it).
    """
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, (None if digest else "latest")


def container_attributes(inspect: Mapping[str, Any], labels: list[str]) -> DockerAttributes:
    """Resource attributes from an Engine API ``ContainerInspectResponse`` document."""
    out: DockerAttributes = {}
    cid = inspect.get("Id")
    if isinstance(cid, str) and cid:
        out[CONTAINER_ID] = cid
    name = inspect.get("Name")
    if isinstance(name, str) and name.strip("/"):
        out[CONTAINER_NAME] = name.lstrip("/")
    config = inspect.get("Config")
    config = config if isinstance(config, Mapping) else {}
    image = config.get("Image")
    if isinstance(image, str) and image:
        image_name, tag = parse_image_reference(image)
        out[CONTAINER_IMAGE_NAME] = image_name
        if tag:
            out[CONTAINER_IMAGE_TAGS] = (tag,)
            out[CONTAINER_IMAGE_TAG] = tag
    container_labels = config.get("Labels")
    if isinstance(container_labels, Mapping):
        for key in labels:
            value = container_labels.get(key)
            if isinstance(value, str):
                out[CONTAINER_LABEL_PREFIX + key] = value
    return out


def _ips_of(summary: Mapping[str, Any]) -> set[str]:
    settings = summary.get("NetworkSettings")
    networks = settings.get("Networks") if isinstance(settings, Mapping) else None
    ips: set[str] = set()
    if isinstance(networks, Mapping):
        for endpoint in networks.values():
            if isinstance(endpoint, Mapping):
                for field in ("IPAddress", "GlobalIPv6Address"):
                    ip = endpoint.get(field)
                    if isinstance(ip, str) and ip:
                        ips.add(ip)
    return ips


class DockerLookup:
    """Cached, asynchronous container lookups through the ``docker`` SDK (see module doc)."""

    def __init__(self, cfg: DockerConfig, metrics: SelfMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.enabled = cfg.enabled
        self._cache: TLRUCache[LookupKey, tuple[DockerAttributes | None, float]] = TLRUCache(
            maxsize=cfg.cache_max_entries, ttu=lambda _k, v, _now: v[1]
        )
        self._pending: set[LookupKey] = set()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._client: docker.APIClient | None = None
        self._client_lock = threading.Lock()
        self.lookups = 0
        self.errors = 0

    # -- lifecycle (event loop) ----------------------------------------------------
    def start(self) -> None:
        """Decide whether the source runs; logs one line when there is no socket."""
        if not self.enabled:
            return
        if self.cfg.base_url.startswith(_UNIX):
            path = self.cfg.base_url[len(_UNIX) :]
            if not os.path.exists(path):
                logger.info("Docker enrichment skipped: no Docker socket at %s", path)
                self.enabled = False
                return
        if importlib.util.find_spec("docker") is None:
            logger.warning(
                "Docker enrichment skipped: the docker SDK is not installed "
                "(install gym-telemetry-sidecar[docker])"
            )
            self.enabled = False
            return
        logger.info("Docker enrichment on: looking containers up at %s", self.cfg.base_url)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.cfg.lookup_threads, thread_name_prefix="enrich-docker"
        )

    def close(self) -> None:
        """Stop the lookup threads without waiting for running lookups. Safe twice."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- cache (event loop) --------------------------------------------------------
    def cached(self, key: LookupKey) -> tuple[DockerAttributes | None, float] | None:
        """(attributes or None for a negative result, expiry time), or None if unknown."""
        return self._cache.get(key)

    def request(self, key: LookupKey) -> None:
        """Queue a lookup of ``key`` unless one is pending; never blocks."""
        if self._executor is None or key in self._pending:
            return
        if len(self._pending) >= self.cfg.max_pending_lookups:
            self.metrics.limit_hits.labels(limit="enrich_docker_pending").inc()
            return
        self._pending.add(key)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._lookup_blocking, key)
        future.add_done_callback(functools.partial(self._done, key))

    def _done(self, key: LookupKey, future: asyncio.Future[DockerAttributes | None]) -> None:
        self._pending.discard(key)
        if future.cancelled():
            return
        result = future.result()  # _lookup_blocking never raises
        ttl = self.cfg.cache_ttl_s if result is not None else self.cfg.negative_ttl_s
        self._cache[key] = (result, time.monotonic() + ttl)

    # -- lookup (worker thread) ----------------------------------------------------
    def _lookup_blocking(self, key: LookupKey) -> DockerAttributes | None:
        import docker.errors
        import requests.exceptions

        self.lookups += 1
        try:
            client = self._get_client()
            kind, value = key
            if kind == "ip":
                summaries = client.containers()
                matches = [s for s in summaries if value in _ips_of(s)]
                if len(matches) != 1:
                    return None
                value = str(matches[0].get("Id", ""))
            inspect = client.inspect_container(value)
            return container_attributes(inspect, self.cfg.labels)
        except docker.errors.NotFound:
            return None
        # Boundary: any engine/transport failure becomes a cached negative result.
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            self._warn(key, exc)
            return None
        except Exception as exc:  # a malformed engine answer must not kill the worker
            self._warn(key, exc)
            return None

    def _get_client(self) -> docker.APIClient:
        # Created lazily in a worker thread: with api_version "auto" the SDK asks the
        # engine for its version, which is blocking I/O.
        import docker

        with self._client_lock:
            if self._client is None:
                self._client = docker.APIClient(
                    base_url=self.cfg.base_url,
                    version=self.cfg.api_version,
                    timeout=self.cfg.timeout_s,  # type: ignore[arg-type]  # stubs say int; requests takes float
                )
            return self._client

    def _warn(self, key: LookupKey, exc: Exception) -> None:
        self.errors += 1
        _failure_log.warning(
            "Docker lookup of %s %s failed (%d failures so far): %s",
            key[0],
            key[1],
            self.errors,
            exc,
        )
