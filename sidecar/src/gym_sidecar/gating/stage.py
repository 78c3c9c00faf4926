"""The gate stage: drops the ScopeSpans blocks of span groups that are not ``on``.

It works on a trace request's wire view (:mod:`gym_sidecar.core.traces`). For each
ResourceSpans block it finds ``service.name`` in the block's resource bytes (parsed once
per distinct resource, then cached: :class:`ServiceNames`), asks the current policy
which groups that service drops (a cached answer), and removes whole ScopeSpans blocks
whose instrumentation scope maps to one of them from the index -- counting their spans
from the index, never walking them. A scope that carries several groups (Gym's own
telemetry puts every group in ``nemo.lens.helpers``, ``core.producers``) is gated span
by span instead: the scanner reports each span's name and bytes in such blocks
(``trace_scan``: ``ScanSpec.split_scopes``), the spans of dropped groups leave the
block (``ScopeBlock.keep_spans``) and are counted per group as whole blocks are.
ResourceSpans blocks left empty are removed and ``batch.items`` is reduced by what was
dropped. Metrics and logs pass unchanged.

Runs after the derive stage, so groups in ``metrics`` mode have already been counted
into the derived metrics when their spans are dropped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.span_groups import Mode
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gym_sidecar.core import producers
from gym_sidecar.core.stage import Batch, ProcessorStage, Signal, Stage
from gym_sidecar.core.traces import ScanSpec, ScopeBlock, TraceRequest
from gym_sidecar.gating.api import build_router
from gym_sidecar.gating.config import SpanGroupsConfig
from gym_sidecar.gating.policy import OTHER_SERVICE
from gym_sidecar.gating.reload import ConfigReloader
from gym_sidecar.gating.state import SpanGroupState
from gym_sidecar.selfmetrics import SelfMetrics

if TYPE_CHECKING:
    from starlette.routing import Router

_log = logging.getLogger(__name__)

STAGE_NAME: Final = "gate"
_UNNAMED: Final = "_unnamed"
_DROP_REASON: Final = "span_group"


def _service_name(resource_attributes: Iterable[KeyValue]) -> str | None:
    for kv in resource_attributes:
        if kv.key == semconv.SERVICE_NAME:
            value = kv.value
            return str(value.string_value) if value.HasField("string_value") else None
    return None


class ServiceNames:
    """``service.name`` of a serialized Resource (None: absent, or not a string).

    Answers are cached per resource bytes: the same few resources arrive in every
    request (one per agent process, as enriched). Bounded: at ``max_entries`` the cache
    is emptied and refills with the resources in use; a resource larger than
    ``max_resource_bytes`` is parsed each time instead of being kept.
    """

    def __init__(self, max_entries: int = 1024, max_resource_bytes: int = 16 * 1024) -> None:
        self._cache: dict[bytes, str | None] = {}
        self._max_entries = max_entries
        self._max_resource_bytes = max_resource_bytes

    def __call__(self, resource: bytes) -> str | None:
        try:
            return self._cache[resource]
        except KeyError:
            pass
        name = _service_name(Resource.FromString(resource).attributes)
        if len(resource) <= self._max_resource_bytes:
            if len(self._cache) >= self._max_entries:
                self._cache.clear()
            self._cache[resource] = name
        return name


class GateStage(ProcessorStage[None]):
    """Enforces the span-group policy held by ``state`` (see module docstring).

    Counting (received / dropped / passed, traces only) and forwarding are
    :class:`ProcessorStage`'s; a batch left with no ResourceSpans ends here.
    """

    name = STAGE_NAME
    signals = frozenset({Signal.TRACES})
    trace_scan = ScanSpec(split_scopes=producers.SPLIT_SCOPES)

    def __init__(self, state: SpanGroupState, next_stage: Stage | None, metrics: SelfMetrics):
        super().__init__(next_stage, metrics)
        self.state = state
        self._dropped_total = metrics.dropped.labels(Signal.TRACES.value, _DROP_REASON)
        self._labels: set[str] = set()
        """service.name values counted under their own name (at most max_services)."""
        self._children: dict[tuple[str, str, Mode], Any] = {}
        """Labelled counter children, cached: ``labels()`` costs more than the drop."""
        self.service_name = ServiceNames()
        """service.name per resource bytes (shared with :meth:`enabled_groups`)."""
        self.reloader: ConfigReloader | None = None
        """Set by :func:`live_reconfiguration`: watched while the stage runs."""
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start watching the config file (if a reloader is attached)."""
        if self.reloader is not None and self._watch is None:
            self._watch = asyncio.create_task(self.reloader.run(), name="span-groups-watch")

    async def shutdown(self, deadline_s: float) -> None:
        """Stop the file watcher. Safe twice or unstarted."""
        watch, self._watch = self._watch, None
        if self.reloader is not None:
            self.reloader.stop()
        if watch is not None:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    def _label(self, service: str | None) -> str:
        label = service if service is not None else _UNNAMED
        if label in self._labels:
            return label
        if len(self._labels) < self.state.settings.max_services:
            self._labels.add(label)
            return label
        self.metrics.limit_hits.labels("span_groups.max_services").inc()
        return OTHER_SERVICE

    def process(self, batch: Batch) -> None:
        assert isinstance(batch.message, TraceRequest)
        dropped = self.gate(batch.message)
        if dropped:
            batch.items -= dropped
            self._dropped_total.inc(dropped)

    def nothing_left(self, batch: Batch) -> bool:
        return not batch.message.blocks  # type: ignore[union-attr]

    def enabled_groups(self, resource: bytes) -> frozenset[str]:
        """The groups not ``off`` for the service of ``resource`` (serialized) under the
        current policy.

        The derive stage asks this so that an ``off`` group's spans are not counted.
        """
        return self.state.policy.for_service(self.service_name(resource)).enabled

    def gate(self, request: TraceRequest) -> int:
        """Remove the dropped groups' ScopeSpans (and single spans of split scopes) from
        ``request``'s index; return the spans dropped."""
        policy = self.state.policy
        scopes = self.state.scopes
        service_name = self.service_name
        dropped_total = 0
        empty: list[int] = []
        for bi, block in enumerate(request.blocks):
            service = service_name(block.current_resource)
            groups = policy.for_service(service)
            if not groups.drop:
                continue  # fast path: this service drops nothing
            label: str | None = None
            kept: list[ScopeBlock] = []
            edited = False
            for scope in block.scopes:
                group = scopes.group(scope.name)
                if group is None:
                    role = scopes.split(scope.name) if scope.split is not None else None
                    if role is None:
                        kept.append(scope)
                        continue
                    # several groups in one scope: by span name
                    dropped = self._split(scope, role, groups.drop)
                    if not dropped:
                        kept.append(scope)
                        continue
                    if label is None:
                        label = self._label(service)
                    for span_group, n in dropped.items():
                        dropped_total += n
                        self._count(span_group, label, groups.modes[span_group], n)
                    if scope.spans:
                        kept.append(scope)
                        edited = True
                    continue
                if group not in groups.drop:
                    kept.append(scope)
                    continue
                n = scope.spans
                dropped_total += n
                if label is None:
                    label = self._label(service)
                self._count(group, label, groups.modes[group], n)
            if len(kept) != len(block.scopes) or edited:
                block.scopes = kept
                block.edited = True
            if not kept:
                empty.append(bi)
        if empty:
            blocks = request.blocks
            for bi in reversed(empty):
                del blocks[bi]
            request.changed = True
        return dropped_total

    def _count(self, group: str, label: str, mode: Mode, n: int) -> None:
        """Count ``n`` spans of ``group`` dropped for the service ``label`` in ``mode``."""
        child = self._children.get((group, label, mode))
        if child is None:
            child = self.state.counters.dropped_spans.labels(group, label, mode.value)
            self._children[(group, label, mode)] = child
        child.inc(n)

    @staticmethod
    def _split(
        scope: ScopeBlock, role: producers.ScopeRole, drop: frozenset[str]
    ) -> dict[str, int]:
        """Drop the spans of ``scope`` (a split block) whose group is in ``drop``: the
        spans dropped per group (empty: the block stays as received)."""
        split = scope.split
        assert split is not None
        dropped: dict[str, int] = {}
        kept: list[int] = []
        for i, (name, _, _) in enumerate(split):
            group = role.span(name).group
            if group is None or group not in drop:
                kept.append(i)
            else:
                dropped[group] = dropped.get(group, 0) + 1
        if dropped:
            scope.keep_spans(kept)
        return dropped


def build_gate_stage(
    cfg: SpanGroupsConfig,
    next_stage: Stage,
    metrics: SelfMetrics,
    state: SpanGroupState | None = None,
) -> GateStage:
    """The gate stage for ``cfg``. Pass ``state`` to share one with the admin API and
    reloads; without it a new :class:`SpanGroupState` is made (reach it as
    ``stage.state``)."""
    return GateStage(
        state if state is not None else SpanGroupState(cfg, metrics), next_stage, metrics
    )


def live_reconfiguration(
    stage: GateStage, config_file: str | Path | None, load: Callable[[], SpanGroupsConfig]
) -> tuple[Router, Callable[[], None]]:
    """Attach live reconfiguration to ``stage``.

    Returns the admin router (``/v1/span-groups``) and the SIGHUP reload hook, and makes
    the stage watch ``config_file`` while it runs (``span_groups.watch_interval_s``;
    None: no file to watch). ``load`` returns the ``span_groups`` section to apply on a
    reload (the assembly loads the whole config again from the same sources).
    """
    reloader = ConfigReloader(stage.state, config_file, load)
    stage.reloader = reloader

    def on_sighup() -> None:
        reloader.reload("sighup")

    return build_router(stage.state), on_sighup
