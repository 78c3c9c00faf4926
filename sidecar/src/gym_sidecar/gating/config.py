"""Configuration of span-group gating (owned by gating/).

The ``span_groups`` section of the sidecar's config file::

    span_groups:
      spec: "default,verify"        # preset or comma list, like Gym's own
      modes: {verify: metrics}      # per-group mode: on | metrics | off
      services:                     # per service.name overrides
        my-resources-server: {spec: "per_rollout", modes: {model_call: off}}
      token: "..."                  # bearer token for PUT /v1/span-groups
      watch_interval_s: 2           # how often the config file is checked (0: never)

How a group's mode is decided for a service (``gym_telemetry_semconv.resolve_modes``,
the same rule the agent applies before its first poll): the service's ``spec`` (else the
global one) selects groups, which are ``on``; groups it removes with ``-name`` (or all
unselected ones, with ``none``) are ``off``; the others take their default mode,
``metrics`` for the groups that feed derived metrics (rollout, verify) and ``off`` for
the rest; then the global ``modes`` and then the service's ``modes`` override single
groups. Unknown group or preset names are validation errors, reported with their key
path.
"""

from __future__ import annotations

from typing import Annotated

import gym_telemetry_semconv as semconv
from gym_telemetry_semconv.span_groups import Mode

from gym_sidecar.configmodel import Field, Secret, Section, after, before


def unknown_names(spec: str) -> list[str]:
    """Names in ``spec`` that are neither a group, a preset nor ``none``.

    The grammar is ``gym_telemetry_semconv.parse_spec``'s, shared with the agent; the
    agent ignores such names, the sidecar rejects the spec.
    """
    return list(semconv.parse_spec(spec).unknown)


def _check_spec(spec: str) -> str:
    unknown = unknown_names(spec)
    if unknown:
        raise ValueError(
            f"unknown span group or preset {', '.join(repr(u) for u in unknown)}; "
            f"groups: {', '.join(semconv.ALL_GROUPS)}; presets: {', '.join(semconv.PRESETS)}"
        )
    return spec


def _check_group(name: str) -> str:
    if name not in semconv.ALL_GROUPS:
        raise ValueError(f"unknown span group {name!r}; groups: {', '.join(semconv.ALL_GROUPS)}")
    return name


def _as_text(value: object) -> object:
    # Environment values arrive YAML-parsed: a numeric token must stay its text.
    return value if value is None or isinstance(value, str | Secret) else str(value)


Spec = Annotated[str, after(_check_spec)]
GroupName = Annotated[str, after(_check_group)]
Modes = dict[GroupName, Mode]


class ServiceOverride(Section):
    """Span groups for one ``service.name``; unset fields fall back to the global ones."""

    spec: Spec | None = None
    """Replaces the global spec for this service."""
    modes: Modes = Field(default_factory=dict)
    """Applied on top of the global ``modes`` for this service."""


class SpanGroupsPolicyConfig(Section):
    """The part of the section that ``PUT /v1/span-groups`` may replace at run time."""

    spec: Spec = semconv.DEFAULT_SPEC
    """A preset (default, per_rollout, all) or a comma list of groups and presets."""
    modes: Modes = Field(default_factory=dict)
    """Per-group mode overriding what the spec selects."""
    services: dict[str, ServiceOverride] = Field(default_factory=dict)
    """Per ``service.name`` overrides."""


class SpanGroupsConfig(SpanGroupsPolicyConfig):
    """The whole ``span_groups`` section."""

    token: Annotated[Secret | None, before(_as_text)] = None
    """Bearer token required by ``PUT /v1/span-groups`` (else from
    ``GYM_SIDECAR_SPAN_GROUPS__TOKEN``). Without either, PUT is disabled (403)."""
    scope_groups: dict[str, GroupName] = Field(default_factory=dict)
    """Extra instrumentation-scope -> group mappings for third-party instrumentations,
    on top of the built-in table (see docs/span-groups.md)."""
    watch_interval_s: float = Field(default=2.0, ge=0)
    """How often the config file is checked for changes; 0 disables file watching."""
    max_services: int = Field(default=256, gt=0)
    """Distinct service.name values whose decisions are cached and counted by name;
    beyond it they are computed per batch and counted under service ``_other``."""

    def policy(self) -> SpanGroupsPolicyConfig:
        """The run-time-replaceable part (spec, modes, services)."""
        return SpanGroupsPolicyConfig(spec=self.spec, modes=self.modes, services=self.services)
