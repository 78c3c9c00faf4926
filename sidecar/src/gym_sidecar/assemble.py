"""The assembly: the only module that knows every area and wires them together.

The pipeline is receive -> enrich -> live -> derive -> gate -> queue/export. Derive sits
before gate: groups in ``metrics`` mode still feed the derived metrics, and the gate then
drops their spans. The live stage consumes the agents' live events into the rollouts
tracker, which the derive stage tells where rollouts end.

Layers (lowest first; a module imports only from its own layer or below, and no cycle;
``tests/sidecar/test_layers.py`` checks every import, function-local ones included):

1. leaves: ``gym_sidecar`` (the version), :mod:`gym_sidecar.selfmetrics`,
   :mod:`gym_sidecar.configmodel` (typed configuration sections);
2. core: :mod:`gym_sidecar.core` (stage, exporter and OTLP contracts);
3. configuration: :mod:`gym_sidecar.configload` (the loader shared with the webhook),
   :mod:`gym_sidecar.config` and each area's ``config`` module;
4. areas: receiver, enrich, metrics, gating, export, store, inspect, webhook, and the
   admin app and ASGI listener; areas meet only through core (store's exporter is a
   :class:`~gym_sidecar.core.exporter.Exporter`, not an import of export);
5. assembly: this module;
6. entry points: :mod:`gym_sidecar.server`, :mod:`gym_sidecar.cli`.

Factories get ``(their config section, next_stage, metrics)`` and return a
:class:`Stage` (an area switched off is a ``PassThrough(name, next_stage, metrics)``).
A stage that needs admin routes or SIGHUP reload appends to ``routers`` /
``reload_hooks``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from starlette.routing import Router

from gym_sidecar.config import SidecarConfig
from gym_sidecar.core.exporter import Exporter
from gym_sidecar.core.stage import Stage
from gym_sidecar.enrich.stage import build_enrich_stage
from gym_sidecar.export.config import BackendConfig, QueueConfig
from gym_sidecar.export.fanout import FanOutExporter
from gym_sidecar.export.grpc_h2 import GrpcH2Exporter
from gym_sidecar.export.queue import ExportQueue, MemoryQueue
from gym_sidecar.export.sender import Sender
from gym_sidecar.export.stage import NoBackendStage, QueueStage
from gym_sidecar.gating.stage import build_gate_stage, live_reconfiguration
from gym_sidecar.live.api import live_router
from gym_sidecar.live.stage import build_live_stage
from gym_sidecar.metrics.stage import build_derive_stage
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.store.config import LocalStoreConfig

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

    gate = build_gate_stage(cfg.span_groups, stage, metrics)
    # Reloads load the whole config again from the same file, environment and flags
    # (cfg.source) and apply only its span_groups section; a config built in code, not
    # from a file, re-applies what it was given on SIGHUP.
    source = cfg.source
    if source is not None:
        router, on_sighup = live_reconfiguration(
            gate, source.config_file, lambda: source.load().span_groups
        )
    else:
        router, on_sighup = live_reconfiguration(gate, None, lambda: cfg.span_groups)
    routers.append(router)  # the span-group API
    reload_hooks.append(on_sighup)
    # Derive asks the gate's policy so that spans of groups that are off are not derived.
    stage = build_derive_stage(cfg.metrics, gate, metrics, gate.enabled_groups)
    # The live stage hands rollout ends from the derive stage to its tracker.
    stage, tracker = build_live_stage(cfg.rollouts, stage, metrics)
    routers.append(live_router(tracker))  # GET /v1/rollouts/live

    stage = build_enrich_stage(cfg.enrich, stage, metrics)

    return Pipeline(head=stage, routers=routers, reload_hooks=reload_hooks)


def build_exporter(backend: BackendConfig) -> Exporter:
    """The OTLP exporter ``backend.protocol`` names. Call on the running event loop."""
    if backend.protocol == "grpc":
        if backend.grpc_client == "grpcio":
            # Imported only when asked for: grpc core is ~13 MiB resident, and nothing
            # else in the sidecar needs it.
            from gym_sidecar.export.otlp_grpc import OtlpGrpcExporter

            return OtlpGrpcExporter(backend)
        return GrpcH2Exporter(backend)
    # Imported only for OTLP/HTTP export (http_post's worker thread, ssl contexts).
    from gym_sidecar.export.otlp_http import OtlpHttpExporter

    return OtlpHttpExporter(backend)


def build_queue(queue: QueueConfig, metrics: SelfMetrics) -> ExportQueue:
    """The export queue ``queue`` asks for: in memory, or on disk when ``persistent``
    (:func:`gym_sidecar.export.disk_queue.build_queue`, which may raise OSError)."""
    if not queue.persistent:
        return MemoryQueue(queue.max_bytes)
    # Imported only when asked for: the on-disk queue's modules (segments, replay) are
    # resident memory a sidecar with the in-memory default never uses.
    from gym_sidecar.export import disk_queue

    return disk_queue.build_queue(queue, metrics)


def build_export_stage(
    backend: BackendConfig,
    queue: QueueConfig,
    metrics: SelfMetrics,
    local_store: LocalStoreConfig | None = None,
) -> Stage:
    """The pipeline's last stage: queue -> batch -> export with retry and backpressure.

    With ``local_store`` active (:meth:`LocalStoreConfig.active`: by default when
    ``backend.url`` is unset) the embedded store is an exporter too: the only one, or
    beside the backend behind a :class:`FanOutExporter`. With neither it returns a stage
    that drops and counts everything (reason ``no_backend``) and warns once at start.
    Opening the store may raise OSError. Call on the running event loop
    (the gRPC channel binds to it); then ``start()`` before traffic and
    ``shutdown(deadline_s)`` at the end, which drains the queue and closes the exporter.
    """
    exporters: list[Exporter] = []
    if backend.url is not None:
        exporters.append(build_exporter(backend))
    if local_store is not None and local_store.active(backend.url is not None):
        # Imported only when the store is on: a sidecar with a backend never loads
        # sqlite3 and the store's modules (~1.5 MiB resident).
        from gym_sidecar.store.exporter import LocalStoreExporter
        from gym_sidecar.store.writer import StoreMetrics

        store_metrics = StoreMetrics(metrics.registry)
        exporters.append(LocalStoreExporter(local_store.db_path(), local_store, store_metrics))
    if not exporters:
        return NoBackendStage(metrics)
    exporter = exporters[0] if len(exporters) == 1 else FanOutExporter(exporters)
    export_queue = build_queue(queue, metrics)  # in memory, or on disk (queue.persistent)
    sender = Sender(export_queue, exporter, queue, metrics)
    return QueueStage(export_queue, sender, metrics, queue.backpressure_retry_after_s)
