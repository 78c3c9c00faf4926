"""Configuration of the backend exporter and the export queue (owned by export/)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BackendConfig(BaseModel):
    """Where and how the sidecar forwards data."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    """Backend endpoint, e.g. ``http://127.0.0.1:4317``. None: no OTLP backend."""
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    compression: Literal["gzip", "none"] = "none"
    timeout_s: float = Field(default=10.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)


class QueueConfig(BaseModel):
    """The export queue: bounded in bytes, batching by size and time."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    batch_max_bytes: int = Field(default=2 * 1024 * 1024, gt=0)
    batch_timeout_s: float = Field(default=0.2, ge=0)
