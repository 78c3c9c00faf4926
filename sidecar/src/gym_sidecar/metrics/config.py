"""Configuration of derived metrics (owned by metrics/)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MetricsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    interval_s: float = Field(default=10.0, gt=0)
    """metrics_interval_s: how often derived metrics are exported."""
