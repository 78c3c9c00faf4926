"""The enrich stage: adds server metadata (config, environment, host, Gym, Kubernetes,
Docker) to the resource of every ResourceSpans / ResourceMetrics / ResourceLogs block.

It never drops data and never blocks: Docker lookups run in background threads (see
``gym_sidecar.enrich.docker_lookup``). Rules and sources: ``gym_sidecar.enrich.enricher``
and docs/enrichment.md.
"""

from __future__ import annotations

from gym_sidecar.core.stage import Batch, ProcessorStage, Stage
from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.enrich.enricher import Enricher
from gym_sidecar.selfmetrics import SelfMetrics

STAGE_NAME = "enrich"


class EnrichStage(ProcessorStage[None]):
    """Enriches each batch in place (every signal); :class:`ProcessorStage` counts it
    and passes it on."""

    name = STAGE_NAME

    def __init__(self, enricher: Enricher, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        self.enricher = enricher

    def process(self, batch: Batch) -> None:
        self.enricher.enrich(batch.message, batch.peer)

    async def shutdown(self, deadline_s: float) -> None:
        """Stops Docker lookup threads (nothing to drain: the stage holds no data)."""
        self.enricher.close()


def build_enrich_stage(cfg: EnrichConfig, next_stage: Stage, metrics: SelfMetrics) -> Stage:
    """The enrich stage for ``cfg`` in front of ``next_stage``.

    Blocking at build time only: reads the environment, host facts and the downward-API
    files once, and checks for the Docker socket (one INFO line if it is absent).
    """
    return EnrichStage(Enricher.from_config(cfg, metrics), next_stage, metrics)
