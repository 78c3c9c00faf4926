"""Configuration of span-group gating (owned by gating/)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpanGroupsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: str = "default"
    """A preset (default, per_rollout, all) or a comma list of groups and presets."""
