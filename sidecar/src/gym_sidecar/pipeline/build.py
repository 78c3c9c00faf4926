"""Assemble the pipeline: enrich -> derive -> gate -> queue/export.

Derive sits before gate: groups in ``metrics`` mode still feed the derived metrics,
and the gate then drops their spans.

Each area owns one line below; it imports that area's factory when the module exists
and falls back to a :class:`PassThrough` until it lands. Factories get
``(their config section, next_stage, metrics)`` and return a :class:`Stage`. A stage
that needs admin routes or SIGHUP reload appends to ``routers`` / ``reload_hooks``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter

from gym_sidecar.config import SidecarConfig
from gym_sidecar.pipeline.stage import Batch, PassThrough, Stage
from gym_sidecar.selfmetrics import SelfMetrics

logger = logging.getLogger(__name__)

ReloadHook = Callable[[], Awaitable[None] | None]
"""Called on SIGHUP (sync or async). Exceptions are logged, never fatal."""


@dataclass
class Pipeline:
    """The assembled stages plus what they contribute to the admin app and reloads."""

    head: Stage
    routers: list[APIRouter] = field(default_factory=list)
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


def _factory(module: str, name: str) -> Callable[..., Stage] | None:
    """``module.name`` if that module and attribute exist yet, else None."""
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return None
        raise
    factory: Callable[..., Stage] | None = getattr(mod, name, None)
    return factory


def _extras(module: str, name: str) -> Callable[..., Any] | None:
    """Like :func:`_factory`, for a module's non-stage helper."""
    return _factory(module, name)


class _DirectForward(Stage):
    """Temporary stand-in for the export stage: forwards each batch over OTLP/gRPC.

    No queue, no retry: a failed export is logged and counted as dropped. Replaced by
    ``gym_sidecar.export.build_export_stage`` as soon as that exists.
    """

    name = "export"

    def __init__(self, url: str | None, metrics: SelfMetrics) -> None:
        super().__init__(None, metrics)
        self._url = url
        self._channel: Any = None

    async def start(self) -> None:
        if self._url is not None and self._channel is None:
            import grpc

            target = self._url.split("://", 1)[-1]
            self._channel = grpc.aio.insecure_channel(
                target, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
            )

    async def consume(self, batch: Batch) -> None:
        from gym_sidecar.receiver.otlp import SPECS

        signal = batch.signal.value
        if self._channel is None:
            self.metrics.dropped.labels(signal, "no_backend").inc(batch.items)
            return
        spec = SPECS[batch.signal]
        call = self._channel.unary_unary(f"/{spec.grpc_service}/Export")
        self.metrics.export_attempts.labels(signal).inc()
        try:
            await call(batch.message.SerializeToString(), timeout=10)
        except Exception as exc:  # boundary: any transport failure drops this batch
            self.metrics.export_errors.labels(signal, "permanent").inc()
            self.metrics.dropped.labels(signal, "export_failed").inc(batch.items)
            logger.warning("export of %d %s failed: %s", batch.items, signal, exc)
            return
        self.metrics.exported.labels(signal).inc(batch.items)

    async def shutdown(self, deadline_s: float) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


def build_pipeline(cfg: SidecarConfig, metrics: SelfMetrics) -> Pipeline:
    """Build every stage, tail first, and return the head with its extras."""
    routers: list[APIRouter] = []
    reload_hooks: list[ReloadHook] = []

    export = _factory("gym_sidecar.export", "build_export_stage")
    tail: Stage = (
        export(cfg.backend, cfg.queue, metrics)
        if export
        else _DirectForward(cfg.backend.url, metrics)
    )

    gate = _factory("gym_sidecar.pipeline.gate", "build_gate_stage")
    stage: Stage = (
        gate(cfg.span_groups, tail, metrics) if gate else PassThrough("gate", tail, metrics)
    )
    gate_extras = _extras("gym_sidecar.pipeline.gate", "gate_extras")
    extras = gate_extras(stage, cfg) if gate_extras else None
    if extras is not None:  # span-group API and SIGHUP reload
        routers.append(extras[0])
        reload_hooks.append(extras[1])

    derive = _factory("gym_sidecar.pipeline.derive", "build_derive_stage")
    stage = derive(cfg.metrics, stage, metrics) if derive else PassThrough("derive", stage, metrics)

    enrich = _factory("gym_sidecar.pipeline.enrich", "build_enrich_stage")
    stage = enrich(cfg.enrich, stage, metrics) if enrich else PassThrough("enrich", stage, metrics)

    return Pipeline(head=stage, routers=routers, reload_hooks=reload_hooks)
