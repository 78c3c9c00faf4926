"""The Gym source: ``nemo.gym.server.name`` / ``nemo.gym.server.type`` from sidecar config.

The agent normally reports both (from ``NEMO_GYM_CONFIG_PATH`` and its server class);
these configured values only fill them in for agents that do not.
"""

from __future__ import annotations

from gym_sidecar.enrich.attributes import AttributeValue
from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.enrich.keys import GYM_SERVER_NAME, GYM_SERVER_TYPE


def gym_attributes(cfg: EnrichConfig) -> dict[str, AttributeValue]:
    """The configured Gym server name and type, where given."""
    out: dict[str, AttributeValue] = {}
    if cfg.server_name:
        out[GYM_SERVER_NAME] = cfg.server_name
    if cfg.server_type:
        out[GYM_SERVER_TYPE] = cfg.server_type
    return out
