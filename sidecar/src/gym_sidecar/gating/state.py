"""The sidecar's live span-group state, shared by the gate stage, the admin API, the
config-file watcher and the SIGHUP reload hook.

One :class:`SpanGroupState` per sidecar. It holds the current :class:`Policy` (an
immutable snapshot, replaced wholesale on every change) plus the settings that are not
part of the policy (PUT token, extra scope table, limits).

Sources of change and who wins:
- the config file (on start, on change on disk, on SIGHUP): replaces everything, and so
  also discards what ``PUT`` set since the last load;
- ``PUT /v1/span-groups``: replaces the policy (or one service's override) in memory
  until the next file load or restart. The file stays the durable source of truth.

Threading: every mutation happens on the sidecar's event loop; readers on the loop (the
gate stage, the API) read ``state.policy`` once per batch/request. A reference swap is
atomic, so no lock is needed.
"""

from __future__ import annotations

import hmac
import logging
import weakref
from typing import Final, Literal

from prometheus_client import Counter, Gauge

from gym_sidecar.gating.config import ServiceOverride, SpanGroupsConfig, SpanGroupsPolicyConfig
from gym_sidecar.gating.policy import Policy
from gym_sidecar.gating.scopes import ScopeMap
from gym_sidecar.selfmetrics import SelfMetrics

_log = logging.getLogger(__name__)

TokenCheck = Literal["ok", "missing", "bad", "disabled"]


class GatingMetrics:
    """Span-group counters, registered once on a SelfMetrics registry."""

    def __init__(self, metrics: SelfMetrics) -> None:
        r = metrics.registry
        self.dropped_spans = Counter(
            "gym_sidecar_span_group_dropped_spans",
            "Spans dropped by the gate stage, by span group, service.name and mode.",
            ["group", "service", "mode"],
            registry=r,
        )
        self.changes = Counter(
            "gym_sidecar_span_group_changes",
            "Span-group configuration changes, by source (file, sighup, api) and outcome "
            "(applied, unchanged, invalid).",
            ["source", "outcome"],
            registry=r,
        )
        self.generation = Gauge(
            "gym_sidecar_span_group_generation",
            "Generation of the span-group policy in force (1 at start, +1 per change).",
            registry=r,
        )


_METRICS: Final[weakref.WeakKeyDictionary[SelfMetrics, GatingMetrics]] = weakref.WeakKeyDictionary()


def gating_metrics(metrics: SelfMetrics) -> GatingMetrics:
    """The GatingMetrics of ``metrics``'s registry (created on first use)."""
    gm = _METRICS.get(metrics)
    if gm is None:
        gm = GatingMetrics(metrics)
        _METRICS[metrics] = gm
    return gm


class SpanGroupState:
    """The current span-group policy and settings of one sidecar."""

    def __init__(self, config: SpanGroupsConfig, metrics: SelfMetrics) -> None:
        self.metrics = metrics
        self.counters = gating_metrics(metrics)
        self.settings = config
        self.scopes = ScopeMap(config.scope_groups)
        self.policy = Policy(config.policy(), generation=1, max_services=config.max_services)
        self.counters.generation.set(1)

    # -- changes -------------------------------------------------------------------
    def apply_config(self, config: SpanGroupsConfig, source: str) -> bool:
        """Adopt a freshly loaded ``span_groups`` section (file change, SIGHUP).

        Replaces the token, scope table and limits, and the policy when it differs
        from the one in force (discarding PUT changes). Returns whether the policy
        changed.
        """
        self.settings = config
        self.scopes = ScopeMap(config.scope_groups)
        new = config.policy()
        if new == self.policy.config and config.max_services == self.policy.max_services:
            self.counters.changes.labels(source, "unchanged").inc()
            _log.info(
                "span groups: %s reload: no change (generation %d)", source, self.policy.generation
            )
            return False
        self._swap(new, source)
        return True

    def replace_policy(self, config: SpanGroupsPolicyConfig, source: str = "api") -> Policy:
        """Replace spec, modes and every service override (``PUT`` without service)."""
        return self._swap(config, source)

    def set_service(
        self, service: str, override: ServiceOverride | None, source: str = "api"
    ) -> Policy:
        """Set (or with None remove) one service's override (``PUT ?service=NAME``)."""
        services = dict(self.policy.config.services)
        if override is None:
            services.pop(service, None)
        else:
            services[service] = override
        new = self.policy.config.model_copy(update={"services": services})
        return self._swap(new, source)

    def record_invalid(self, source: str) -> None:
        """Count a change that was refused (bad file, bad PUT body)."""
        self.counters.changes.labels(source, "invalid").inc()

    def _swap(self, config: SpanGroupsPolicyConfig, source: str) -> Policy:
        policy = Policy(
            config,
            generation=self.policy.generation + 1,
            max_services=self.settings.max_services,
        )
        self.policy = policy
        self.counters.generation.set(policy.generation)
        self.counters.changes.labels(source, "applied").inc()
        _log.info(
            "span groups: generation %d from %s: spec=%r modes=%s services=%s",
            policy.generation,
            source,
            config.spec,
            {g: str(m) for g, m in config.modes.items()},
            sorted(config.services),
        )
        return policy

    # -- auth ----------------------------------------------------------------------
    def check_token(self, authorization: str | None) -> TokenCheck:
        """Check an ``Authorization`` header against the configured bearer token.

        Constant-time comparison; the token is never logged.
        """
        token = self.settings.token
        if token is None or not token.get_secret_value():
            return "disabled"
        if not authorization:
            return "missing"
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() != "bearer" or not presented:
            return "missing"
        expected = token.get_secret_value().encode()
        return "ok" if hmac.compare_digest(presented.strip().encode(), expected) else "bad"
