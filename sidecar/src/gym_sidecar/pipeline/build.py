"""Assemble the pipeline: enrich -> derive -> gate -> queue/export.

Derive sits before gate: groups in ``metrics`` mode still feed the derived metrics,
and the gate then drops their spans.

Each area owns its line(s) below. Factories get ``(their config section, next_stage,
metrics)`` and return a :class:`Stage` (a new area not built yet would use
``PassThrough(name, next_stage, metrics)`` here). A stage that needs admin routes or
SIGHUP reload appends to ``routers`` / ``reload_hooks``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.routing import Router

from gym_sidecar.config import SidecarConfig
from gym_sidecar.export import build_export_stage
from gym_sidecar.pipeline.derive import build_derive_stage
from gym_sidecar.pipeline.enrich import build_enrich_stage
from gym_sidecar.pipeline.gate import build_gate_stage, gate_extras
from gym_sidecar.pipeline.stage import Stage
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

ReloadHook = Callable[[], Awaitable[None] | None]
"""Called on SIGHUP (sync or async). Exceptions are logged, never fatal."""


@dataclass
class Pipeline:
    """The assembled stages plus what they contribute to the admin app and reloads."""

    head: Stage
    routers: list[Router] = field(default_factory=list)
    reload_hooks: list[ReloadHook] = field(default_factory=list)

    @property
    def stages(self) -> list[Stage]:
        """Stages from head to tail."""
        out: list[Stage] = []
        stage: Stage | None = self.head
        while stage is not None:
            out.append(stage)
            stage = stage.next
        return out


def build_pipeline(cfg: SidecarConfig, metrics: SelfMetrics) -> Pipeline:
    """Build every stage, tail first, and return the head with its extras."""
    routers: list[Router] = []
    reload_hooks: list[ReloadHook] = []

    stage = build_export_stage(cfg.backend, cfg.queue, metrics, cfg.local_store)

    stage = build_gate_stage(cfg.span_groups, stage, metrics)
    extras = gate_extras(stage, cfg)
    if extras is not None:  # span-group API and SIGHUP reload
        routers.append(extras[0])
        reload_hooks.append(extras[1])

    stage = build_derive_stage(cfg.metrics, stage, metrics)

    stage = build_enrich_stage(cfg.enrich, stage, metrics)

    return Pipeline(head=stage, routers=routers, reload_hooks=reload_hooks)
