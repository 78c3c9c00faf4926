"""Span groups: NeMo Gym's group names, presets, scopes, the spec grammar and the modes.

Pure definitions, no process state: the agent keeps its current enabled set, the sidecar
its current policy; both work them out from here, so the two can never disagree on a
name, a preset or a default.

Modes (docs/span-groups.md): ``on`` (created and forwarded), ``metrics`` (created, the
sidecar derives metrics from them, then drops them), ``off`` (not created; the sidecar
drops any that arrive and derives nothing from them).

How a spec becomes modes (:func:`resolve_modes`):

1. Groups the spec selects are ``on``.
2. Groups it names with a leading ``-`` are ``off``; so is every unselected group when
   the spec contains ``none``.
3. Every other group gets its default mode (:data:`DEFAULT_MODES`): ``metrics`` for the
   groups whose spans feed a derived metric (:data:`DERIVED_GROUPS`), ``off`` for the
   rest. So with no configuration at all the ``gym.*`` metrics are derived while only
   the ``default`` preset's spans are forwarded.
4. Explicit per-group modes are applied last.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

# --- group names ----------------------------------------------------------------------
GROUP_JOB: Final = "job"
GROUP_SERVER: Final = "server"
GROUP_HTTP_CLIENT: Final = "http_client"
GROUP_ROLLOUT: Final = "rollout"
GROUP_VERIFY: Final = "verify"
GROUP_AGENT: Final = "agent"
GROUP_MODEL_CALL: Final = "model_call"
GROUP_SANDBOX: Final = "sandbox"

ALL_GROUPS: Final[tuple[str, ...]] = (
    GROUP_JOB,
    GROUP_SERVER,
    GROUP_HTTP_CLIENT,
    GROUP_ROLLOUT,
    GROUP_VERIFY,
    GROUP_AGENT,
    GROUP_MODEL_CALL,
    GROUP_SANDBOX,
)

PRESETS: Final[dict[str, frozenset[str]]] = {
    "default": frozenset({GROUP_JOB, GROUP_SERVER, GROUP_HTTP_CLIENT, GROUP_ROLLOUT}),
    "per_rollout": frozenset(
        {
            GROUP_SERVER,
            GROUP_HTTP_CLIENT,
            GROUP_ROLLOUT,
            GROUP_VERIFY,
            GROUP_AGENT,
            GROUP_MODEL_CALL,
        }
    ),
    "all": frozenset(ALL_GROUPS),
}

DEFAULT_SPEC: Final = "default"
"""The spec in force when none is configured (agent and sidecar alike)."""
NONE_SPEC: Final = "none"
"""Spec token that selects nothing and turns every unselected group ``off``."""

DERIVED_GROUPS: Final[frozenset[str]] = frozenset(
    {GROUP_ROLLOUT, GROUP_VERIFY, GROUP_MODEL_CALL, GROUP_HTTP_CLIENT}
)
"""Groups whose spans the sidecar derives metrics from (``metrics.SOURCE_GROUP``): the
rollouts and verifications (``gym.rollout.*``, ``gym.verify.*``), the model calls
(``gen_ai.client.*``, issue 41) and the hops between Gym servers (``gym.http.client.*``).
A group the spec leaves unselected is ``metrics`` by default, so that every derived
metric works out of the box (``http_client`` is ``on`` in the ``default`` preset)."""


# --- modes ------------------------------------------------------------------------------
class Mode(enum.StrEnum):
    """What happens to a span group's spans."""

    ON = "on"
    """Agents create the spans and the sidecar forwards them."""
    METRICS = "metrics"
    """Agents create the spans; the sidecar derives metrics from them, then drops them."""
    OFF = "off"
    """Agents do not create the spans; the sidecar drops any that arrive anyway and
    derives nothing from them."""


DEFAULT_MODES: Final[Mapping[str, Mode]] = {
    g: (Mode.METRICS if g in DERIVED_GROUPS else Mode.OFF) for g in ALL_GROUPS
}
"""The mode of a group that a spec neither selects nor turns off."""


# --- instrumentation scopes -------------------------------------------------------------
SCOPE_PREFIX: Final = "gym_telemetry."
"""Each group emits through its own tracer named ``SCOPE_PREFIX + group``."""


def scope_name(group: str) -> str:
    """Instrumentation scope name for a span group's tracer."""
    return SCOPE_PREFIX + group


def group_of_scope(scope: str) -> str | None:
    """The span group a gym_telemetry scope belongs to, or None for a foreign scope."""
    if scope.startswith(SCOPE_PREFIX):
        return scope[len(SCOPE_PREFIX) :]
    return None


# --- the spec grammar -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ParsedSpec:
    """What a spec says, before defaults are applied."""

    selected: frozenset[str]
    """Groups selected (added and not removed)."""
    removed: frozenset[str]
    """Groups named with a leading ``-`` (directly or through a preset)."""
    none: bool
    """Whether the spec contains ``none``."""
    unknown: tuple[str, ...]
    """Tokens that are neither a group, a preset nor ``none``, as written."""


def parse_spec(spec: str | Iterable[str] | None) -> ParsedSpec:
    """Parse a span-group spec. Never raises; unknown names are returned, not judged.

    ``spec`` is a comma- (or whitespace-) separated list of group and preset names:
    ``"default,sandbox"``, ``"per_rollout verify"``, ``"all"``. Names are
    case-insensitive. ``"none"`` selects nothing. A leading ``-`` removes a group or
    preset after the others are added: ``"all,-sandbox"``. An iterable of names is
    accepted too. The agent logs unknown names and ignores them; the sidecar rejects them.
    """
    if spec is None:
        tokens: list[str] = []
    elif isinstance(spec, str):
        tokens = spec.replace(",", " ").split()
    else:
        tokens = [str(t).strip() for t in spec]
    added: set[str] = set()
    removed: set[str] = set()
    unknown: list[str] = []
    none = False
    for raw in tokens:
        token = raw.strip().lower()
        if not token:
            continue
        target = added
        if token.startswith("-"):
            target = removed
            token = token[1:]
        if token == NONE_SPEC:
            none = True
        elif token in ALL_GROUPS:
            target.add(token)
        elif token in PRESETS:
            target.update(PRESETS[token])
        else:
            unknown.append(raw.strip())
    return ParsedSpec(frozenset(added - removed), frozenset(removed), none, tuple(unknown))


def resolve_modes(
    spec: str | Iterable[str] | None, modes: Mapping[str, Mode] | None = None
) -> dict[str, Mode]:
    """Every group's mode for ``spec`` plus explicit ``modes`` (see the module docstring).

    Unknown names in ``spec`` or ``modes`` are ignored here; validate them first.
    """
    parsed = parse_spec(spec)
    out: dict[str, Mode] = {}
    for group in ALL_GROUPS:
        if group in parsed.selected:
            out[group] = Mode.ON
        elif parsed.none or group in parsed.removed:
            out[group] = Mode.OFF
        else:
            out[group] = DEFAULT_MODES[group]
    if modes:
        out.update((g, Mode(m)) for g, m in modes.items() if g in out)
    return out


def enabled_groups(modes: Mapping[str, Mode]) -> frozenset[str]:
    """Groups whose spans agents create: mode ``on`` or ``metrics``."""
    return frozenset(g for g, m in modes.items() if m is not Mode.OFF)


def forwarded_groups(modes: Mapping[str, Mode]) -> frozenset[str]:
    """Groups whose spans reach the backend: mode ``on``."""
    return frozenset(g for g, m in modes.items() if m is Mode.ON)
