"""Configuration of the enrich stage (owned by enrich/)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EnrichConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    attributes: dict[str, str] = Field(default_factory=dict)
    """Static resource attributes added to every ResourceSpans block."""
