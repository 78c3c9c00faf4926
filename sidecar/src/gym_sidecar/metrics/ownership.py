"""One owner per metric name: copies of the names the sidecar derives, sent by other
producers, are renamed (or dropped) before they reach the backend.

The sidecar derives ``gym.rollout.*``, ``gym.verify.*`` and ``gym.env.step.*`` from
spans, before any sampling, with its own semantics (one point per outermost rollout;
``succeeded`` and ``error.type`` on verifications; a windowed success rate). NeMo Gym's
own telemetry (``nemo_gym.telemetry`` on nemo-lens) records in-process metrics under
some of the same names with other semantics (Gym 0.7.0: ``gym.rollout.duration_ms``
without attributes, ``gym.verify.duration_ms`` without ``succeeded``,
``gym.verify.success_rate`` cumulative since the process started; Gym's main branch
adds ``gym.rollout.completed_total``). Two producers of one name at a backend make one
series mean two things, so every metric arriving at the sidecar whose name starts with
one of ``metrics.owned.prefixes`` (and whose scope is not the sidecar's own derived
scope, so a sidecar forwarding to another keeps its points) is, by
``metrics.owned.action``:

- ``rename`` (default): renamed ``rename_prefix`` + the name without its leading
  ``gym.`` (``gym.rollout.duration_ms`` -> ``gym.inprocess.rollout.duration_ms``):
  nothing Gym records is lost (``gym.rollout.completed_total`` answers a question the
  spans do not), and each name has one producer;
- ``drop``: removed, with its points;
- ``keep``: passed on unchanged (two producers per name: the operator's choice).

Every point renamed or dropped is counted in
``gym_sidecar_owned_metric_points_total{action, prefix}`` (the configured prefix it
matched: a bounded label), and each distinct name is logged once at INFO (then at most
one line a minute per action). Every other metric -- Gym's
``gym.servers.active``, ``gym.sandbox.*``, ``gym.http.*``, ``gym.model.*`` -- passes
unchanged (enriched like any other). Runs in the derive stage, on metric batches only,
in place; not thread-safe (the event loop's).
"""

from __future__ import annotations

import logging
from typing import Final

from gym_telemetry_semconv.ratelimit import rate_limit
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gym_sidecar.metrics.config import OwnedMetricsConfig
from gym_sidecar.metrics.otlp_request import SCOPE_NAME
from gym_sidecar.selfmetrics import CounterChild, LoopCounter, SelfMetrics

_log = rate_limit(logging.getLogger(__name__), 60.0)

GYM_PREFIX: Final = "gym."
_MAX_LOGGED: Final = 256
"""Distinct names remembered for the once-per-name log line."""


def _points(metric: object) -> int:
    kind = metric.WhichOneof("data")  # type: ignore[attr-defined]
    if kind is None:
        return 0
    return len(getattr(metric, kind).data_points)


class MetricOwnership:
    """Applies ``metrics.owned`` to metric requests (module doc)."""

    def __init__(self, cfg: OwnedMetricsConfig, metrics: SelfMetrics) -> None:
        self.cfg = cfg
        self._prefixes = tuple(cfg.prefixes)
        self._counter = LoopCounter(
            "gym_sidecar_owned_metric_points",
            "Points of metrics named like the ones the sidecar derives, sent by another "
            "producer (e.g. Gym's own in-process copies), renamed or dropped "
            "(metrics.owned), by action and the owned prefix they matched.",
            ["action", "prefix"],
            registry=metrics.registry,
        )
        self._children: dict[str, CounterChild] = {}
        self._logged: set[str] = set()

    def renamed(self, name: str) -> str:
        """The name a copy of ``name`` gets under ``rename``."""
        rest = name[len(GYM_PREFIX) :] if name.startswith(GYM_PREFIX) else name
        return self.cfg.rename_prefix + rest

    def _owned_prefix(self, name: str) -> str | None:
        for prefix in self._prefixes:
            if name.startswith(prefix):
                return prefix
        return None

    def apply(self, request: ExportMetricsServiceRequest) -> int:
        """Rename or drop the copies in ``request`` (in place); the points dropped."""
        action = self.cfg.action
        if action == "keep" or not self._prefixes:
            return 0
        dropped = 0
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                if sm.scope.name == SCOPE_NAME:
                    continue  # the sidecar's own derived metrics (a sidecar upstream)
                doomed: list[int] = []
                for i, metric in enumerate(sm.metrics):
                    prefix = self._owned_prefix(metric.name)
                    if prefix is None:
                        continue
                    points = _points(metric)
                    self._count(prefix, points, metric.name, sm.scope.name)
                    if action == "drop":
                        doomed.append(i)
                        dropped += points
                    else:
                        metric.name = self.renamed(metric.name)
                for i in reversed(doomed):
                    del sm.metrics[i]
        return dropped

    def _count(self, prefix: str, points: int, name: str, scope: str) -> None:
        action = self.cfg.action
        child = self._children.get(prefix)
        if child is None:
            child = self._counter.labels(action, prefix)
            self._children[prefix] = child
        child.inc(points)
        if name not in self._logged and len(self._logged) < _MAX_LOGGED:
            self._logged.add(name)
            target = f" as {self.renamed(name)!r}" if action == "rename" else ""
            _log.info(
                "metric %r from scope %r: the sidecar derives this name itself; "
                "its copy is %s%s (metrics.owned)",
                name,
                scope,
                "renamed" if action == "rename" else "dropped",
                target,
            )
