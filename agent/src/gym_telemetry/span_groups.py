"""Span groups: Gym's group names and presets, the spec parser, the process-wide
enabled set that the endpoint wrappers read, and one tracer per group.

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

from opentelemetry import trace

from gym_telemetry import semconv

_log = logging.getLogger(__name__)

#: Environment variable holding the span-group spec, e.g. ``"default,sandbox"``.
ENV_SPAN_GROUPS: Final = "GYM_TELEMETRY_SPAN_GROUPS"
#: Spec used when ``GYM_TELEMETRY_SPAN_GROUPS`` is unset or empty.
DEFAULT_SPEC: Final = "default"
#: Spec value that disables every group.
NONE_SPEC: Final = "none"

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
    """Parse a span-group spec into (groups, unknown names).

    ``spec`` is a comma- (or whitespace-) separated list of group names and preset
    names, mixed freely: ``"default,sandbox"``, ``"per_rollout verify"``, ``"all"``.
    Names are case-insensitive. ``"none"`` (or an empty spec) selects no group. A
    leading ``-`` removes a group or preset after the others are added:
    ``"all,-sandbox"``. Unknown names are returned in the second element and logged at
    WARNING; they are never fatal. An iterable of names is accepted too.
    """
    if spec is None:
        return frozenset(), []
    if isinstance(spec, str):
        tokens = spec.replace(",", " ").split()
    else:
        tokens = [str(t).strip() for t in spec]
    added: set[str] = set()
    removed: set[str] = set()
    unknown: list[str] = []
    for raw in tokens:
        token = raw.strip().lower()
        if not token:
            continue
        target = added
        if token.startswith("-"):
            target = removed
            token = token[1:]
        if token == NONE_SPEC:
            continue
        if token in _GROUP_SET:
            target.add(token)
        elif token in PRESETS:
            target.update(PRESETS[token])
        else:
            unknown.append(raw.strip())
    if unknown:
        _log.warning(
            "gym_telemetry: unknown span group(s) %s ignored; known groups: %s; presets: %s",
            ", ".join(unknown),
            ", ".join(GROUPS),
            ", ".join(PRESETS),
        )
    return frozenset(added - removed), unknown


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

    Returns the groups now enabled. Unknown names are logged and ignored.
    """
    env = os.environ if environ is None else environ
    spec = env.get(ENV_SPAN_GROUPS, "").strip() or DEFAULT_SPEC
    groups, _unknown = parse_spec(spec)
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
