"""The sidecar runtime: start, serve until told to stop, shut down in order.

:class:`SidecarServer` holds the runtime state for one :class:`SidecarConfig`
(uvicorn's Config/Server split). Lifecycle, all on one asyncio loop:

``startup()``
    apply the ``memory`` settings (:mod:`gym_sidecar.malloc`), build the pipeline,
    start its stages (tail first), start the admin listener (``/readyz`` answers 503),
    then the gRPC and HTTP receivers; then ready.
``serve()``
    install SIGTERM/SIGINT (stop) and SIGHUP (reload) handlers, ``startup()``, wait for
    :meth:`request_stop`, then ``shutdown()``.
``shutdown()``
    1. not ready, stop accepting: receivers close their listeners and in-flight calls
       finish handing their data to the pipeline;
    2. drain the pipeline: each stage's ``shutdown`` runs head to tail, so every stage
       drains into the next (derive flushes its last interval);
    3. the export stage drains its queue within what is left of ``shutdown_timeout_s``;
    4. it closes the exporter; the admin listener closes last.
    Items accepted but never exported are logged with their count. Safe to call twice
    and without ``startup()``.

SIGHUP runs every hook in :attr:`reload_hooks` (stages add theirs in
:mod:`gym_sidecar.assemble`; others may append before ``serve()``), except when it comes
from the controlling terminal closing (:mod:`gym_sidecar.hangup`): then it stops the
sidecar as SIGTERM does.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import time

from gym_sidecar.admin import Readiness, build_admin_app
from gym_sidecar.assemble import Pipeline, ReloadHook, build_pipeline
from gym_sidecar.config import SidecarConfig
from gym_sidecar.hangup import TerminalHangup
from gym_sidecar.malloc import MemoryTuner
from gym_sidecar.receiver.grpc import GrpcReceiver
from gym_sidecar.receiver.http import OtlpHttpApp
from gym_sidecar.selfmetrics import SelfMetrics
from gym_sidecar.wire.http1.connection_limits import ConnectionLimits
from gym_sidecar.wire.http1.listener import AsgiListener
from gym_sidecar.wire.protobuf import scan as trace_scan

logger = logging.getLogger(__name__)

RECEIVER_GRACE_FRACTION = 0.25
"""Share of ``shutdown_timeout_s`` that in-flight receiver calls get to finish."""


class SidecarServer:
    """Runtime state of one sidecar. Not thread-safe: use from its event loop."""

    def __init__(self, config: SidecarConfig, metrics: SelfMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or SelfMetrics()
        self.readiness = Readiness()
        self.reload_hooks: list[ReloadHook] = []
        self.pipeline: Pipeline | None = None
        self.grpc: GrpcReceiver | None = None
        self.http: AsgiListener | None = None
        self.admin: AsgiListener | None = None
        self._stop: asyncio.Event | None = None
        self._shutdown_started = False
        self._shutdown_done: asyncio.Event | None = None
        self._memory = MemoryTuner(config.memory)
        self._hangup: TerminalHangup | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def startup(self) -> None:
        cfg = self.config
        self._memory.start()  # before the receivers' threads exist (M_ARENA_MAX)
        # Which trace scanner runs is decided (and logged) now, not at the first trace, so
        # an operator can see it on /metrics from the start.
        self.metrics.trace_scanner.labels(scanner=trace_scan.active_scanner()).set(1)
        pipeline = build_pipeline(cfg, self.metrics)
        self.pipeline = pipeline
        self.reload_hooks.extend(pipeline.reload_hooks)
        for stage in reversed(pipeline.stages):
            await stage.start()
        self.admin = AsgiListener(
            build_admin_app(
                self.readiness,
                self.metrics,
                pipeline.routers,
                body_timeout_s=cfg.limits.admin_body_timeout_s,
            ),
            cfg.admin_listen,
            "admin",
            ConnectionLimits.from_config(
                cfg.limits, self.metrics, "admin_max_connections", transport="admin"
            ),
        )
        await self.admin.start()
        self.grpc = GrpcReceiver(cfg.grpc_listen, pipeline.head, cfg.limits, self.metrics)
        await self.grpc.start()
        self.http = AsgiListener(
            OtlpHttpApp(pipeline.head, cfg.limits, self.metrics),
            cfg.http_listen,
            "OTLP/HTTP",
            ConnectionLimits.from_config(cfg.limits, self.metrics, "http_max_connections"),
        )
        await self.http.start()
        self.readiness.receivers_up = True
        # The bound addresses, not the configured ones: a ":0" listener's port is known
        # only now, and whoever started it (a test, a script) reads it from this line.
        logger.info(
            "gym-sidecar ready: grpc=%s http=%s admin=%s backend=%s",
            self.grpc.address,
            self.http.address,
            self.admin.address,
            cfg.backend.url or "<none>",
        )

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT or :meth:`request_stop`, then shut down."""
        self._stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._hangup = TerminalHangup()  # before our handler replaces nohup's SIG_IGN
        # Installed before startup: whoever waits for readiness (or the "ready" line)
        # may signal at once; a stop asked for while starting runs once started.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        try:
            await self.startup()
            await self._stop.wait()
        finally:
            # Handlers stay installed while draining: a repeated SIGTERM must not kill
            # the process halfway (the drain is bounded by shutdown_timeout_s anyway).
            try:
                await self.shutdown()
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)

    def request_stop(self, sig: int | None = None) -> None:
        """Ask :meth:`serve` to shut down (idempotent)."""
        if sig is not None:
            if self._shutdown_started:
                logger.info("received %s, already shutting down", signal.Signals(sig).name)
                return
            logger.info("received %s, shutting down", signal.Signals(sig).name)
        if self._stop is not None:
            self._stop.set()

    async def shutdown(self) -> None:
        if self._shutdown_started:
            if self._shutdown_done is not None:
                await self._shutdown_done.wait()
            return
        self._shutdown_started = True
        self._shutdown_done = asyncio.Event()
        try:
            await self._shutdown()
        finally:
            self._shutdown_done.set()

    async def _shutdown(self) -> None:
        self.readiness.shutting_down = True
        timeout_s = self.config.shutdown_timeout_s
        deadline = time.monotonic() + timeout_s
        grace_s = timeout_s * RECEIVER_GRACE_FRACTION
        # 1. stop accepting; in-flight calls finish handing data to the pipeline.
        receivers = [r for r in (self.grpc, self.http) if r is not None]
        await asyncio.gather(*(r.stop(grace_s) for r in receivers))
        # 2-4. drain head to tail; the export stage drains its queue and closes.
        if self.pipeline is not None:
            for stage in self.pipeline.stages:
                remaining = max(0.0, deadline - time.monotonic())
                try:
                    await stage.shutdown(remaining)
                except Exception:  # boundary: one stage failing must not stop the rest
                    logger.exception("stage %s failed to shut down", stage.name)
        if self.admin is not None:
            await self.admin.stop(1.0)
        await self._memory.stop()
        self._log_unsent()
        logger.info("gym-sidecar stopped")

    def _on_sighup(self) -> None:
        if self._hangup is not None and self._hangup.hung_up():
            logger.info("received SIGHUP: the controlling terminal is gone, shutting down")
            self.request_stop()
            return
        logger.info("received SIGHUP, running %d reload hook(s)", len(self.reload_hooks))
        for hook in list(self.reload_hooks):
            try:
                result = hook()
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    task.add_done_callback(_log_hook_failure)
            except Exception:  # boundary: a broken hook must not kill the sidecar
                logger.exception("reload hook %r failed", hook)

    def _log_unsent(self) -> None:
        """Log, per signal, what was accepted but neither exported nor dropped on purpose."""
        for signal_name in ("traces", "metrics", "logs"):
            received = _sum(self.metrics, "gym_sidecar_received_items", signal_name)
            exported = _sum(self.metrics, "gym_sidecar_exported_items", signal_name)
            dropped = _sum(self.metrics, "gym_sidecar_dropped_items", signal_name)
            if received:
                logger.info(
                    "%s: received=%d exported=%d dropped=%d",
                    signal_name,
                    received,
                    exported,
                    dropped,
                )
            unsent = received - exported - dropped
            if unsent > 0:
                logger.warning("%d accepted %s were not sent to the backend", unsent, signal_name)


def _sum(metrics: SelfMetrics, name: str, signal_name: str) -> int:
    value = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == f"{name}_total" and sample.labels.get("signal") == signal_name:
                value += sample.value
    return int(value)


def _log_hook_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("reload hook failed", exc_info=task.exception())
