"""The enrich stage: adds server metadata (config, environment, host, Gym, Kubernetes,
Docker) to the resource of every ResourceSpans / ResourceMetrics / ResourceLogs block.

It never drops data and never blocks: Docker lookups run in background threads (see
``gym_sidecar.enrich.docker_lookup``). Rules and sources: ``gym_sidecar.enrich.enricher``
and docs/enrichment.md.
"""

from __future__ import annotations

from gym_sidecar.enrich.config import EnrichConfig
from gym_sidecar.enrich.enricher import Enricher
from gym_sidecar.pipeline.stage import Batch, Signal, Stage
from gym_sidecar.selfmetrics import SelfMetrics

STAGE_NAME = "enrich"


class EnrichStage(Stage):
    """Enriches each batch in place, counts it, and passes it on."""

    name = STAGE_NAME

    def __init__(self, enricher: Enricher, next_stage: Stage | None, metrics: SelfMetrics) -> None:
        super().__init__(next_stage, metrics)
        self.enricher = enricher
        self._counters = {
            signal: (
                metrics.stage_items.labels(STAGE_NAME, signal.value, "received"),
                metrics.stage_items.labels(STAGE_NAME, signal.value, "passed"),
            )
            for signal in Signal
        }

    async def consume(self, batch: Batch) -> None:
        received, passed = self._counters[batch.signal]
        received.inc(batch.items)
        self.enricher.enrich(batch.message, batch.peer)
        passed.inc(batch.items)
        if self.next is not None:
            await self.next.consume(batch)

    async def shutdown(self, deadline_s: float) -> None:
        """Stops Docker lookup threads (nothing to drain: the stage holds no data)."""
        self.enricher.close()


def build_enrich_stage(cfg: EnrichConfig, next_stage: Stage, metrics: SelfMetrics) -> Stage:
    """The enrich stage for ``cfg`` in front of ``next_stage``.

    Blocking at build time only: reads the environment, host facts and the downward-API
    files once, and checks for the Docker socket (one INFO line if it is absent).
    """
    return EnrichStage(Enricher.from_config(cfg, metrics), next_stage, metrics)
