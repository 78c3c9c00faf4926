"""TEST TOOLING ONLY -- a stand-in for what PyPI's nemo-lens 0.1.0 lacks, so that NeMo Gym
0.7.0's own telemetry (``nemo_gym.telemetry``) runs in the tests. Never installed, never
shipped: a test puts this directory on ``PYTHONPATH`` of the Gym servers it starts from
the ``lens`` environment (``scripts/gym_env.py --recipe lens``), and Python imports this
``sitecustomize`` at start-up.

What Gym 0.7.0 imports from Lens and 0.1.0 does not have (Lens's repository has them; the
next Lens release switches Gym's telemetry on, docs/nemo-gym.md):

- ``nemo.lens.groups.SpanRegistry``: Gym registers its groups and presets under the
  namespace ``nemo_gym`` (``register(namespace, groups=, presets=, allow_override=)``)
  and resolves a spec with ``SpanRegistry.resolve(spec)[0]``. Without it Gym's
  ``span_groups`` import fails quietly and every gate reads False.
- ``nemo.lens.semconv.NV_DL_RANK`` / ``NV_DL_WORLD_SIZE``: resource-attribute names
  Gym's ``init_telemetry`` imports (their ImportError keeps telemetry off); the values
  are ``nv.dl.rank`` / ``nv.dl.world_size``.
- A spec resolved against that registry: 0.1.0's ``NemoLensConfig.resolved_span_groups``
  resolves against its own ``SpanGroup`` class, which knows none of Gym's groups and
  raises on ``per_rollout``.

Written here from those facts (the names Gym calls and what it expects back), not from
Lens's code. Everything else Gym runs is Lens 0.1.0's own: its ``setup_telemetry``
(providers, OTLP exporters, propagator), ``managed_span`` (the spans, their exception
events), its meter (Gym's in-process metrics) and its FastAPI instrumentation.

Nothing happens unless ``nemo.lens`` imports (any other environment is untouched); a
failure here must not stop a server, so it is reported on stderr and ignored.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

#: The values of the two resource-attribute names Gym 0.7.0 imports.
NV_DL_RANK = "nv.dl.rank"
NV_DL_WORLD_SIZE = "nv.dl.world_size"
#: The spec keyword every registered group answers to.
ALL = "all"


class SpanRegistry:
    """Span groups and presets registered per namespace; a spec resolves against all.

    ``resolve(spec)`` returns ``(groups, unknown)``: the union of the named groups and
    presets (a preset's groups are the union over the namespaces that define it;
    ``all`` is every registered group) and the entries that named nothing registered
    (dropped, as Gym's docs say, not raised).
    """

    _lock = threading.Lock()
    _groups: dict[str, frozenset[str]] = {}
    _presets: dict[str, dict[str, frozenset[str]]] = {}

    @classmethod
    def register(
        cls,
        namespace: str,
        *,
        groups: Iterable[str],
        presets: Mapping[str, Iterable[str]] | None = None,
        allow_override: bool = False,
    ) -> None:
        with cls._lock:
            if namespace in cls._groups and not allow_override:
                raise ValueError(f"span-group namespace {namespace!r} is already registered")
            cls._groups[namespace] = frozenset(groups)
            cls._presets[namespace] = {
                name: frozenset(members) for name, members in (presets or {}).items()
            }

    @classmethod
    def unregister(cls, namespace: str) -> None:
        with cls._lock:
            cls._groups.pop(namespace, None)
            cls._presets.pop(namespace, None)

    @classmethod
    def groups(cls) -> frozenset[str]:
        with cls._lock:
            return frozenset().union(*cls._groups.values())

    @classmethod
    def resolve(cls, spec: str) -> tuple[frozenset[str], frozenset[str]]:
        with cls._lock:
            every = frozenset().union(*cls._groups.values())
            found: set[str] = set()
            unknown: set[str] = set()
            for entry in (p.strip().lower() for p in spec.split(",")):
                if not entry:
                    continue
                if entry == ALL:
                    found |= every
                    continue
                in_presets = [p[entry] for p in cls._presets.values() if entry in p]
                if in_presets:
                    found |= frozenset().union(*in_presets)
                elif entry in every:
                    found.add(entry)
                else:
                    unknown.add(entry)
            return frozenset(found), frozenset(unknown)


def _resolved_span_groups(config: Any) -> frozenset[str]:
    return SpanRegistry.resolve(config.span_groups)[0]


def _install() -> None:
    try:
        import nemo.lens.config as lens_config
        import nemo.lens.groups as lens_groups
        import nemo.lens.semconv as lens_semconv
    except ImportError:
        return  # not the lens environment: nothing to stand in for
    if not hasattr(lens_groups, "SpanRegistry"):
        lens_groups.SpanRegistry = SpanRegistry  # type: ignore[attr-defined]
        lens_config.NemoLensConfig.resolved_span_groups = property(_resolved_span_groups)  # type: ignore[assignment]
    for name, value in (("NV_DL_RANK", NV_DL_RANK), ("NV_DL_WORLD_SIZE", NV_DL_WORLD_SIZE)):
        if not hasattr(lens_semconv, name):
            setattr(lens_semconv, name, value)


try:
    _install()
except Exception as exc:  # boundary: test tooling must never stop a server from starting
    print(f"lens stand-in not installed: {exc!r}", file=sys.stderr)
