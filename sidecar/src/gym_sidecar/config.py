"""The sidecar's configuration: one typed model, loaded once, validated at load.

Sources, highest precedence first:

1. command-line flags (see :mod:`gym_sidecar.cli`);
2. environment variables ``GYM_SIDECAR_<KEY>``, nested keys joined with ``__``
   (``GYM_SIDECAR_BACKEND__URL``, ``GYM_SIDECAR_QUEUE__MAX_BYTES``); a value starting
   with ``{`` or ``[`` is parsed as YAML, so ``GYM_SIDECAR_ENRICH__ATTRIBUTES='{a: b}'``
   works, and ``null`` is none; the ``--backend*`` flags' twins are also spelled
   ``GYM_SIDECAR_BACKEND``, ``GYM_SIDECAR_BACKEND_PROTOCOL`` and
   ``GYM_SIDECAR_BACKEND_COMPRESSION``, and those of ``--local-store`` / ``--store-dir``
   ``GYM_SIDECAR_LOCAL_STORE`` / ``GYM_SIDECAR_STORE_DIR``;
3. the YAML file given with ``--config``, with ``${env:VAR}`` / ``${VAR}`` expanded as
   the OpenTelemetry Collector does (``$$`` is a literal ``$``);
4. the defaults below.

The loader is :mod:`gym_sidecar.configload`, shared with the injection webhook: the
sources are merged as plain dicts and validated once, so every error of every source is
reported together, each with its dotted key path
(``queue.max_bytes: Input should be greater than 0``) -- see :class:`ConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gym_telemetry_semconv as semconv

from gym_sidecar.configload import (
    ENV_NESTED_DELIMITER,
    ConfigError,
    ListenAddress,
    deep_merge,
    load_layers,
    read_yaml_file,
)
from gym_sidecar.configmodel import Field, Section, model_validator
from gym_sidecar.core import downward_api, traces
from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.hostport import split_host_port
from gym_sidecar.live.config import RolloutsConfig
from gym_sidecar.malloc import MemoryConfig
from gym_sidecar.metrics.config import MetricsConfig
from gym_sidecar.store.config import LocalStoreConfig

ENV_PREFIX = "GYM_SIDECAR_"
"""Prefix of every environment variable the sidecar reads."""
ENV_CONFIG_FILE = "GYM_SIDECAR_CONFIG"
"""Env twin of ``--config`` (a path, not a config key)."""
# GYM_SIDECAR_PODINFO_DIR is set by the injection webhook for the enrich stage's
# Kubernetes source (core/downward_api.py), GYM_SIDECAR_NATIVE picks the trace scanner
# (core/traces.py); neither is a config override.
_NOT_CONFIG_ENV = frozenset(
    {ENV_PREFIX, ENV_CONFIG_FILE, downward_api.PODINFO_DIR_ENV, traces.NATIVE_ENV}
)

MiB = 1024 * 1024


class LimitsConfig(Section):
    """Limits on what clients send and how much at once. Each refusal is counted in
    ``limit_hits{limit=<key>}``."""

    http_max_body_bytes: int = Field(default=16 * MiB, gt=0)
    """Largest OTLP/HTTP request body as sent (compressed or not); larger: 413."""
    http_max_decompressed_bytes: int = Field(default=64 * MiB, gt=0)
    """Largest OTLP/HTTP body after gzip decompression, enforced while inflating: 413."""
    grpc_max_message_bytes: int = Field(default=64 * MiB, gt=0)
    """Largest OTLP/gRPC message, inflated when it came compressed (inflation stops
    there); larger: INVALID_ARGUMENT, before it is buffered when its length prefix says
    so."""
    grpc_transport_max_bytes: int = Field(default=128 * MiB, gt=0)
    """Largest gRPC message on the wire (its length prefix, compressed or not); larger:
    RESOURCE_EXHAUSTED before it is buffered. Keep it >= ``grpc_max_message_bytes``."""
    http_max_concurrent_requests: int = Field(default=256, gt=0)
    """OTLP/HTTP requests handled at once; more get 429 + Retry-After before their body
    is read, so memory stays below this many times ``http_max_decompressed_bytes``."""
    grpc_max_concurrent_requests: int = Field(default=256, gt=0)
    """OTLP/gRPC calls handled at once; more get RESOURCE_EXHAUSTED + RetryInfo."""
    overload_retry_after_s: float = Field(default=1.0, gt=0)
    """The delay clients are told to wait when a concurrency limit refuses them."""
    http_body_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for an OTLP/HTTP request body to arrive in full; slower: 408, so a
    trickling client cannot hold a concurrency slot for ever."""
    max_message_depth: int = Field(default=100, ge=8, le=100)
    """Deepest protobuf message nesting accepted, counted in message levels from the
    request (1) down (an attribute's kvlist AnyValue adds 3 levels, an array 2); deeper:
    400 / INVALID_ARGUMENT. 100 is the protobuf parser's own fixed bound (upb), so it
    cannot be raised; OTLP/JSON is checked against this value before it is converted,
    protobuf below 100 by an extra walk over the decoded request (see docs/sidecar.md)."""
    max_request_messages: int = Field(default=1_000_000, gt=0)
    """Most protobuf messages one request may hold (each span, event, link, attribute,
    AnyValue, data point, log record ... counts one); more: 413 / INVALID_ARGUMENT,
    before decoding. Bounds decoded memory to about 180 bytes times this (an empty
    span's size in upb), however small the messages are on the wire."""
    http_max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest request line plus headers on the OTLP/HTTP and admin listeners; larger:
    431 and the connection is closed."""
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    """Longest time from a request's first byte to the end of its headers on the OTLP/HTTP
    and admin listeners; slower: 408 and the connection is closed."""
    http_idle_timeout_s: float = Field(default=30.0, gt=0)
    """How long the OTLP/HTTP and admin listeners keep a connection that has no request
    in progress (a new one, or keep-alive between requests); then it is closed."""
    http_max_connections: int = Field(default=1024, gt=0)
    """Open connections on the OTLP/HTTP listener; more are answered 503 and closed at
    once (the header and idle timeouts free the slots slow clients hold)."""
    admin_max_connections: int = Field(default=64, gt=0)
    """Open connections on the admin listener (its own pool, so OTLP clients can never
    starve health checks); more are answered 503 and closed at once."""
    grpc_message_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait, from the start of an OTLP/gRPC call, for its one request message and
    the end of the client's stream (the client's ``grpc-timeout`` when shorter); slower:
    DEADLINE_EXCEEDED. Also how long an answer may wait for the client's flow-control
    window before its stream is reset."""
    grpc_idle_timeout_s: float = Field(default=60.0, gt=0)
    """A gRPC connection with no call in progress this long is closed (GOAWAY); clients
    reconnect when they next send."""
    grpc_max_connections: int = Field(default=1024, gt=0)
    """Open connections on the gRPC port; more are closed at once, before anything is
    read."""
    grpc_max_streams_per_connection: int = Field(default=128, gt=0)
    """Concurrent calls one gRPC connection may open (HTTP/2 SETTINGS); more are refused
    with REFUSED_STREAM, which clients retry."""
    admin_body_timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait for an admin request body (``PUT /v1/span-groups``) to arrive in
    full; slower: 408."""
    close_linger_s: float = Field(default=2.0, gt=0)
    """How long a connection the sidecar closes itself (a GOAWAY on the gRPC port; a
    400, 408, 431 or 503 that closes on the HTTP listeners) keeps reading and discarding
    after its last answer was sent and its write side shut down, so the client reads
    that answer rather than a TCP reset; a client that has not closed by then is
    disconnected (counted)."""

    @model_validator(mode="after")
    def _transport_above_message(self) -> LimitsConfig:
        if self.grpc_transport_max_bytes < self.grpc_max_message_bytes:
            raise ValueError("grpc_transport_max_bytes must be >= grpc_max_message_bytes")
        return self


class SidecarConfig(Section):
    """Everything the sidecar needs to run. Sections belong to their areas."""

    grpc_listen: ListenAddress = "127.0.0.1:4317"
    http_listen: ListenAddress = "127.0.0.1:4318"
    admin_listen: ListenAddress = f"127.0.0.1:{semconv.DEFAULT_ADMIN_PORT}"
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    enrich: EnrichConfig = Field(default_factory=EnrichConfig)
    span_groups: SpanGroupsConfig = Field(default_factory=SpanGroupsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    rollouts: RolloutsConfig = Field(default_factory=RolloutsConfig)
    local_store: LocalStoreConfig = Field(default_factory=LocalStoreConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    shutdown_timeout_s: float = Field(default=10.0, gt=0)
    """Deadline for draining the pipeline and the export queue on SIGTERM/SIGINT."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    _source: ConfigSource | None = None

    @property
    def source(self) -> ConfigSource | None:
        """How this config was loaded (None when built directly, not by load_config)."""
        return self._source


FLAG_ENV_ALIASES: dict[str, str] = {
    "GYM_SIDECAR_BACKEND": "backend__url",
    "GYM_SIDECAR_BACKEND_PROTOCOL": "backend__protocol",
    "GYM_SIDECAR_BACKEND_COMPRESSION": "backend__compression",
    "GYM_SIDECAR_LOCAL_STORE": "local_store__enabled",
    "GYM_SIDECAR_STORE_DIR": "local_store__data_dir",
}
"""Env twins of the ``--backend*``, ``--local-store`` and ``--store-dir`` flags, besides
their nested spellings."""


def load_config(
    config_file: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SidecarConfig:
    """Merge defaults < file < environment < ``overrides`` (flags) and validate once.

    ``overrides`` is a nested dict of values set on the command line; ``environ`` (default
    ``os.environ``) is read for ``GYM_SIDECAR_*`` and for the file's ``${env:VAR}``.
    Raises :class:`ConfigError` listing every error with its key path.
    """
    env = os.environ if environ is None else environ
    cfg = load_layers(
        SidecarConfig,
        prefix=ENV_PREFIX,
        environ=env,
        config_file=config_file,
        overrides=overrides,
        aliases=FLAG_ENV_ALIASES,
        ignore_env=_NOT_CONFIG_ENV,
    )
    cfg._source = ConfigSource(
        Path(config_file) if config_file is not None else None,
        # All of it, not only GYM_SIDECAR_*: the file's ${env:VAR} may name any variable.
        dict(env),
        dict(overrides or {}),
    )
    return cfg


@dataclass(frozen=True)
class ConfigSource:
    """Where a loaded config came from, so it can be loaded again the same way (span
    groups reload it on SIGHUP and when the file changes)."""

    config_file: Path | None
    environ: Mapping[str, str] = field(repr=False)  # may hold the span-group token
    overrides: Mapping[str, Any] = field(repr=False)

    def load(self) -> SidecarConfig:
        """Load the config again from the same file, environment and flags."""
        return load_config(self.config_file, self.environ, self.overrides)


__all__ = [
    "ENV_CONFIG_FILE",
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "FLAG_ENV_ALIASES",
    "ConfigError",
    "ConfigSource",
    "LimitsConfig",
    "ListenAddress",
    "SidecarConfig",
    "deep_merge",
    "load_config",
    "read_yaml_file",
    "split_host_port",
]
