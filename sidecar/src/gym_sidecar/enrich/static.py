"""The static source: the ``attributes:`` map of the sidecar config, added as given."""

from __future__ import annotations

from gym_sidecar.enrich.attributes import AttributeValue
from gym_sidecar.enrich.config import EnrichConfig


def static_attributes(cfg: EnrichConfig) -> dict[str, AttributeValue]:
    """The configured static attributes (a copy)."""
    return dict(cfg.attributes)
