"""Configuration of the embedded local trace store (owned by store/)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gym_sidecar.configmodel import Field, Section

DB_FILE_NAME = "traces.db"
"""The SQLite file inside the data directory."""


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_DATA_HOME/gym-sidecar``, else ``~/.local/share/gym-sidecar``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gym-sidecar"


class LocalStoreConfig(Section):
    """The ``local_store`` section: an embedded SQLite store of spans and gym.* points.

    Every bound here is counted when it engages (``gym_sidecar_store_pruned_items`` by
    reason ``max_age`` / ``max_bytes``).
    """

    enabled: bool | None = None
    """None (default): on when no ``backend.url`` is set, off otherwise. True: also with a
    backend (data goes to both). False: never."""
    data_dir: Path | None = None
    """Directory of the store (created if missing). None: :func:`default_data_dir`."""
    max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    """Spans and points stored longer ago than this are deleted by the pruner."""
    max_bytes: int = Field(default=512 * 1024 * 1024, ge=1024 * 1024)
    """Bound on the database's used pages; past it the oldest data is deleted (checked
    every ``prune_interval_s``, so the file can exceed it by what arrives in between;
    the WAL file, normally a few MiB, comes on top)."""
    prune_interval_s: float = Field(default=30.0, gt=0)
    """How often the writer thread prunes by age and size."""
    max_attribute_value_chars: int = Field(default=4096, ge=16)
    """Longer string attribute values of gym.rollout / gym.verify spans are truncated
    (counted) in the store's JSON columns; the stored OTLP requests keep them whole."""

    def active(self, has_backend: bool) -> bool:
        """Whether the sidecar should write into the store."""
        return (not has_backend) if self.enabled is None else self.enabled

    def db_path(self, environ: Mapping[str, str] | None = None) -> Path:
        """The SQLite file this config names."""
        return (self.data_dir or default_data_dir(environ)) / DB_FILE_NAME
