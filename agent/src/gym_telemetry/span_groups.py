"""Span groups in the agent: the process-wide enabled set that the endpoint wrappers
read, and one tracer per group. The names, presets, spec grammar and default modes are
``gym_telemetry_semconv.span_groups``'s, shared with the sidecar.

The enabled set is a ``frozenset`` held in a module-level holder. Readers (the wrappers,
on every request) do one attribute load and one membership test; writers
(``set_enabled``, called from ``configure_from_env``, ``init_telemetry`` or the remote
config poller's background thread) replace the whole frozenset with one attribute store.
That swap is atomic under the GIL (and under free-threading, since it is a single
reference store), so a reader sees either the old set or the new one, never a mix, and
no lock is needed on the hot path.

Each group emits through its own tracer whose instrumentation scope name is
``semconv.scope_name(group)``; the sidecar gates and derives per ScopeSpans block with
``semconv.group_of_scope``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from typing import Final

import gym_telemetry_semconv as semconv
from opentelemetry import trace

from gym_telemetry import environment_variables as env_vars

_log = logging.getLogger(__name__)

#: Spec used when ``GYM_TELEMETRY_SPAN_GROUPS`` is unset or empty (the sidecar's too).
DEFAULT_SPEC: Final = semconv.DEFAULT_SPEC
#: Spec value that turns every group it does not select off.
NONE_SPEC: Final = semconv.NONE_SPEC

GROUPS: Final[tuple[str, ...]] = semconv.ALL_GROUPS
PRESETS: Final[dict[str, frozenset[str]]] = semconv.PRESETS

_GROUP_SET: Final[frozenset[str]] = frozenset(GROUPS)


class _Enabled:
    """Holder of the current enabled set. One instance, module-level.

    ``groups`` is read without a lock on every wrapped call; it is only ever replaced
    wholesale by ``set_enabled``.
    """

    __slots__ = ("groups",)

    def __init__(self) -> None:
        self.groups: frozenset[str] = frozenset()


#: The process-wide holder the wrappers read (``group in ENABLED.groups``). Nothing is
#: enabled until ``configure_from_env``, ``set_enabled`` or ``init_telemetry`` runs.
ENABLED: Final = _Enabled()


def parse_spec(spec: str | Iterable[str] | None) -> tuple[frozenset[str], list[str]]:
    """Parse a span-group spec into (selected groups, unknown names).

    The grammar is ``gym_telemetry_semconv.parse_spec``'s: comma- or space-separated
    group and preset names, case-insensitive, ``-name`` removes, ``none`` selects
    nothing. Unknown names are returned and logged at WARNING; they are never fatal.
    The selected groups are those in mode ``on``; :func:`enabled_for_spec` adds the
    groups in ``metrics`` mode by default.
    """
    parsed = semconv.parse_spec(spec)
    _warn_unknown(parsed.unknown)
    return parsed.selected, list(parsed.unknown)


def enabled_for_spec(spec: str | Iterable[str] | None) -> frozenset[str]:
    """The groups the agent creates spans for under ``spec``: mode ``on`` or ``metrics``.

    Same rule as the sidecar's (``gym_telemetry_semconv.resolve_modes``): groups whose
    spans feed a derived metric (rollout, verify) are created unless the spec turns
    them off with ``-name`` or ``none``, so the agent's answer before its first poll
    agrees with the sidecar's default. Unknown names are logged and ignored.
    """
    parsed = semconv.parse_spec(spec)
    _warn_unknown(parsed.unknown)
    return semconv.enabled_groups(semconv.resolve_modes(spec))


def _warn_unknown(unknown: Iterable[str]) -> None:
    names = list(unknown)
    if names:
        _log.warning(
            "gym_telemetry: unknown span group(s) %s ignored; known groups: %s; presets: %s",
            ", ".join(names),
            ", ".join(GROUPS),
            ", ".join(PRESETS),
        )


def enabled_groups() -> frozenset[str]:
    """The groups enabled right now (a frozenset; never mutated in place)."""
    return ENABLED.groups


def set_enabled(groups: Iterable[str]) -> None:
    """Replace the process-wide enabled set in one atomic swap.

    Thread-safe; cheap; takes effect on the next wrapped call. Unknown group names are
    kept out (and logged): only Gym's groups can be enabled. Called by
    ``configure_from_env``, ``init_telemetry`` and the remote-config poller thread.
    """
    new = frozenset(groups)
    unknown = new - _GROUP_SET
    if unknown:
        _log.warning("gym_telemetry: ignoring unknown span group(s) %s", sorted(unknown))
        new = new & _GROUP_SET
    old = ENABLED.groups
    ENABLED.groups = new
    if new != old:
        _log.info("gym_telemetry: span groups enabled: %s", ",".join(sorted(new)) or "none")


def is_enabled(group: str) -> bool:
    """Whether ``group`` is enabled right now (what the wrappers test inline)."""
    return group in ENABLED.groups


def configure_from_env(environ: dict[str, str] | None = None) -> frozenset[str]:
    """Set the enabled set from ``GYM_TELEMETRY_SPAN_GROUPS`` (default ``"default"``).

    The set is :func:`enabled_for_spec` of the spec: with no configuration that is the
    ``default`` preset plus ``verify`` (``metrics`` mode), the same as the sidecar's
    default answer. Returns the groups now enabled. Unknown names are logged and ignored.
    """
    env = os.environ if environ is None else environ
    spec = env.get(env_vars.GYM_TELEMETRY_SPAN_GROUPS, "").strip() or DEFAULT_SPEC
    groups = enabled_for_spec(spec)
    set_enabled(groups)
    return groups


# --- one tracer per group ---------------------------------------------------------------


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("gym-telemetry-agent")
    except Exception:  # running from a source tree without metadata
        return None


_VERSION: Final = _version()
_tracers: dict[str, trace.Tracer] = {}
_tracers_lock = threading.Lock()


def tracer_for(group: str) -> trace.Tracer:
    """The tracer of ``group``: its instrumentation scope is ``semconv.scope_name(group)``.

    Resolved from the current global TracerProvider and cached. The cache is cleared by
    ``init_telemetry`` / ``reset_tracers`` when the provider changes. Before a real
    provider is set this returns the API's proxy tracer, which starts following the SDK
    provider as soon as one is installed.
    """
    tracer = _tracers.get(group)
    if tracer is None:
        with _tracers_lock:
            tracer = _tracers.get(group)
            if tracer is None:
                tracer = trace.get_tracer(semconv.scope_name(group), _VERSION)
                _tracers[group] = tracer
    return tracer


def reset_tracers() -> None:
    """Forget cached tracers (after the global TracerProvider changed; mainly tests)."""
    with _tracers_lock:
        _tracers.clear()
