"""Configuration of the backend exporter and the export queue (owned by export/)."""

from __future__ import annotations

import importlib.util
from typing import Literal

from gym_sidecar.configload import OpaqueStr
from gym_sidecar.configmodel import Field, Section, field_validator, model_validator


class BackendConfig(Section):
    """Where and how the sidecar forwards data."""

    url: str | None = None
    """Backend endpoint, e.g. ``http://127.0.0.1:4317``. None: no OTLP backend.

    gRPC: ``http://`` is plaintext, ``https://`` uses TLS with the system roots; the path
    is ignored. HTTP: the URL is the base and ``/v1/traces`` (metrics, logs) is appended;
    a URL that already ends in ``/v1/<signal>`` has that suffix replaced per signal.
    """
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    compression: Literal["gzip", "none"] = "none"
    compression_level: int = Field(default=2, ge=1, le=9)
    """gzip level, 1 (fastest) to 9 (smallest): 1-3 through ISA-L, 4-9 through zlib-ng
    (``wire.deflate``). The default 2 sends ~4 % more bytes than 5 (the size zlib's level
    6 gives) at about a quarter of its CPU (docs/export.md has the measured trade-off).
    Ignored by ``grpc_client: grpcio`` (grpc core always compresses with zlib at its
    default level)."""
    grpc_client: Literal["auto", "h2", "grpcio"] = "auto"
    """gRPC export only: ``h2`` frames gRPC over HTTP/2 itself and gzips (``wire.deflate``)
    in a worker thread (``export/grpc_h2.py``); ``grpcio`` uses ``grpc.aio`` (the
    ``grpcio`` extra; grpc core compresses on the event loop with zlib at level 6, and
    importing it costs ~13 MiB resident). ``auto`` is ``h2`` (docs/export.md)."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Deadline of one export request (one attempt)."""
    headers: dict[str, OpaqueStr] = Field(default_factory=dict)
    """Sent with every request (gRPC metadata keys are lower-cased). The values are
    opaque: ``check-config``, reprs and log lines show ``[REDACTED]``, since they usually
    carry credentials (``authorization: Bearer ...``)."""

    @field_validator("grpc_client")
    @classmethod
    def _check_grpc_client(cls, client: str) -> str:
        # Found, not imported: importing grpc is what the default client avoids.
        if client == "grpcio" and importlib.util.find_spec("grpc") is None:
            raise ValueError(
                "grpc_client grpcio needs the grpcio package, which is not installed "
                "(pip install 'gym-telemetry-sidecar[grpcio]')"
            )
        return client

    # A field validator, not a model one: it runs even when other backend fields are
    # invalid, so `url: jaeger:4317` is reported together with their errors.
    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        return url


class QueueConfig(Section):
    """The export queue: bounded in bytes, batching by size and time, retry policy."""

    max_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """Serialized bytes held (queued plus in flight). Past it, clients get backpressure."""
    batch_max_bytes: int = Field(default=2 * 1024 * 1024, gt=0)
    """An export request concatenates queued requests of one signal up to this size
    (a single request larger than this is sent alone)."""
    batch_timeout_s: float = Field(default=0.2, ge=0)
    """How long the oldest queued request waits for more before a smaller batch goes."""
    max_in_flight: int = Field(default=2, gt=0, le=64)
    """Export requests in flight at once (each retries in place, holding its slot)."""
    retry_initial_interval_s: float = Field(default=0.5, gt=0)
    retry_max_interval_s: float = Field(default=30.0, gt=0)
    retry_multiplier: float = Field(default=2.0, ge=1.0)
    retry_jitter: float = Field(default=0.5, ge=0, lt=1)
    """Each backoff delay is multiplied by a random factor in [1 - jitter, 1 + jitter]."""
    retry_max_elapsed_s: float | None = Field(default=300.0, gt=0)
    """Give up on a batch (drop and count, reason ``retry_exhausted``) after retrying it
    this long. None: retry until shutdown."""
    backpressure_retry_after_s: float = Field(default=1.0, gt=0)
    """The delay clients are told to wait (RetryInfo / Retry-After) when the queue is full."""
    persistent: bool = False
    """Keep the queue in segment files under ``directory`` (see docs/durability.md):
    clients are answered only once their data is written (and fsynced per ``fsync``),
    and what is left at exit or after a crash is replayed at the next start."""
    directory: str | None = None
    """The on-disk queue's directory (created if missing; one sidecar per directory).
    Required when ``persistent``."""
    fsync: Literal["always", "interval"] = "always"
    """``always``: fsync before answering the client (writes are grouped, one fsync per
    group). ``interval``: answer once written to the OS, fsync every
    ``fsync_interval_ms`` (a power loss or kernel crash can lose that window)."""
    fsync_interval_ms: int = Field(default=1000, gt=0)
    segment_max_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    """The on-disk queue rolls over to a new segment file past this size; a segment is
    deleted once every record in it was delivered or dropped."""

    @model_validator(mode="after")
    def _check_sizes(self) -> QueueConfig:
        if self.batch_max_bytes > self.max_bytes:
            raise ValueError("batch_max_bytes must not exceed max_bytes")
        if self.retry_initial_interval_s > self.retry_max_interval_s:
            raise ValueError("retry_initial_interval_s must not exceed retry_max_interval_s")
        if self.persistent and not self.directory:
            raise ValueError("persistent queue needs queue.directory")
        return self
