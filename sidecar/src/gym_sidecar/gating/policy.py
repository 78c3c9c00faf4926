"""The effective span-group policy: one immutable snapshot of who gets which mode.

A :class:`Policy` is built from a validated :class:`SpanGroupsPolicyConfig` and never
changes afterwards; a reload builds a new one and swaps the reference (see
``gating/state.py``). Per-service answers (:class:`ServiceGroups`) are computed once
and cached inside the snapshot, so a swap invalidates every cached decision at once.

Thread-safety: reads are safe from any thread; the cache is a plain dict whose
worst case under a race is computing the same immutable answer twice.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Final

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.span_groups import Mode

from gym_sidecar.gating.config import SpanGroupsPolicyConfig

#: Groups whose absence breaks joining one rollout's spans across processes.
JOINING_GROUPS: Final = (semconv.GROUP_SERVER, semconv.GROUP_HTTP_CLIENT)

#: Service label used for services beyond ``max_services``.
OTHER_SERVICE: Final = "_other"


@dataclass(frozen=True, slots=True)
class ServiceGroups:
    """The effective modes for one service.name (or for unnamed resources)."""

    service: str | None
    spec: str
    modes: dict[str, Mode]
    """Every known group -> its mode."""
    drop: frozenset[str]
    """Groups whose spans the gate stage drops (mode ``metrics`` or ``off``)."""
    enabled: frozenset[str]
    """Groups agents create spans for (mode ``on`` or ``metrics``)."""
    warnings: tuple[str, ...]
    etag: str = field(default="")

    def to_json(self) -> dict[str, Any]:
        """The document served by ``GET /v1/span-groups`` (see docs/span-groups.md)."""
        return {
            "service": self.service,
            "spec": self.spec,
            "modes": {g: str(m) for g, m in self.modes.items()},
            "enabled": sorted(self.enabled),
            "forwarded": sorted(g for g, m in self.modes.items() if m is Mode.ON),
            "warnings": list(self.warnings),
        }


def joining_warnings(modes: dict[str, Mode]) -> tuple[str, ...]:
    """Warnings for modes that break cross-process trace joining (docs/span-groups.md)."""
    out: list[str] = []
    for group in JOINING_GROUPS:
        mode = modes.get(group, Mode.OFF)
        if mode is Mode.OFF:
            out.append(
                f"span group {group!r} is off: traces no longer join across processes "
                f"(no {group} spans carry or accept the trace context)"
            )
        elif mode is Mode.METRICS:
            out.append(
                f"span group {group!r} is in metrics mode: traces still join by trace id "
                f"but every hop's {group} span is missing from the backend"
            )
    return tuple(out)


def _etag(doc: dict[str, Any]) -> str:
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


class Policy:
    """An immutable span-group policy plus a bounded cache of per-service answers."""

    def __init__(
        self, config: SpanGroupsPolicyConfig, *, generation: int, max_services: int = 256
    ) -> None:
        self.config = config
        self.generation = generation
        self.max_services = max_services
        self._cache: dict[str | None, ServiceGroups] = {}

    def for_service(self, service: str | None) -> ServiceGroups:
        """The effective groups of ``service`` (None: a resource without service.name).

        Cached for up to ``max_services`` names; past that, computed on each call.
        """
        answer = self._cache.get(service)
        if answer is None:
            answer = self._compute(service)
            if len(self._cache) < self.max_services:
                self._cache[service] = answer
        return answer

    def is_cached(self, service: str | None) -> bool:
        """Whether ``service`` has a cached answer (i.e. is within ``max_services``)."""
        return service in self._cache

    def _compute(self, service: str | None) -> ServiceGroups:
        cfg = self.config
        override = cfg.services.get(service) if service is not None else None
        spec = override.spec if override is not None and override.spec is not None else cfg.spec
        modes = semconv.resolve_modes(spec, cfg.modes)
        if override is not None:
            modes.update(override.modes)
        drop = frozenset(g for g, m in modes.items() if m is not Mode.ON)
        enabled = semconv.enabled_groups(modes)
        answer = ServiceGroups(service, spec, modes, drop, enabled, joining_warnings(modes))
        doc = answer.to_json()
        return ServiceGroups(service, spec, modes, drop, enabled, answer.warnings, etag=_etag(doc))
