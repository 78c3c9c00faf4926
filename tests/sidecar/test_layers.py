"""The sidecar's import graph: no import runs from a lower layer up to a higher one, and
no cycle, neither between modules nor between areas.

Every ``import`` / ``from ... import`` of the source tree counts, at any depth
(function-local and ``TYPE_CHECKING`` imports included): a local import hides a
dependency from a reader, not from the graph. The layers are the ones described in
``gym_sidecar/assemble.py`` and docs/sidecar.md. The graph helpers are shared with the
agent's twin, ``tests/agent/test_layers.py`` (``tests/support/import_graph.py``).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import gym_sidecar

from tests.support.import_graph import cycles, module_cycles, upward_imports
from tests.support.import_graph import import_graph as graph_of
from tests.support.import_graph import imported_modules as imported_by
from tests.support.import_graph import layer_of as layer_in

PACKAGE = "gym_sidecar"
ROOT = Path(gym_sidecar.__file__).resolve().parent

# Lowest first. A module belongs to the layer of the longest prefix listed here that
# names it or one of its packages; every module of the tree must be covered (a new
# top-level module or area fails test_every_module_has_a_layer until it is placed).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "leaves",
        (
            "gym_sidecar",
            "gym_sidecar.selfmetrics",
            "gym_sidecar.malloc",
            "gym_sidecar.hostport",
            "gym_sidecar.hangup",
            "gym_sidecar.configmodel",
        ),
    ),
    ("core", ("gym_sidecar.core",)),
    (
        "configuration",
        (
            "gym_sidecar.configload",
            "gym_sidecar.config",
            "gym_sidecar.enrich.config",
            "gym_sidecar.export.config",
            "gym_sidecar.gating.config",
            "gym_sidecar.metrics.config",
            "gym_sidecar.store.config",
            "gym_sidecar.live.config",
        ),
    ),
    ("wire", ("gym_sidecar.wire",)),
    (
        "areas",
        (
            "gym_sidecar.receiver",
            "gym_sidecar.enrich",
            "gym_sidecar.metrics",
            "gym_sidecar.live",
            "gym_sidecar.gating",
            "gym_sidecar.export",
            "gym_sidecar.store",
            "gym_sidecar.inspect",
            "gym_sidecar.query",
            "gym_sidecar.webui",
            "gym_sidecar.webhook",
            "gym_sidecar.admin",
        ),
    ),
    ("assembly", ("gym_sidecar.assemble",)),
    ("entry points", ("gym_sidecar.server", "gym_sidecar.cli")),
)


def import_graph() -> dict[str, set[str]]:
    return graph_of(PACKAGE, ROOT)


def imported_modules(path: Path, module: str, modules: set[str]) -> set[str]:
    return imported_by(PACKAGE, path, module, modules)


def layer_of(module: str) -> int:
    return layer_in(PACKAGE, LAYERS, module)


AREAS = [name for name, _ in LAYERS].index("areas")


def area_of(module: str) -> str:
    """The area of a module of the areas layer or above: its package under the root. A
    module of a lower layer counts as its layer (an area's ``config`` module is
    configuration, which the wire layer may import, and the upward-import check already
    keeps every lower layer from importing an area)."""
    layer = layer_of(module)
    if layer < AREAS:
        return LAYERS[layer][0]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_import_runs_up_a_layer() -> None:
    upward = upward_imports(PACKAGE, LAYERS, import_graph())
    assert upward == []


def test_no_cycle_between_modules() -> None:
    assert module_cycles(import_graph()) == []


def test_no_cycle_between_areas() -> None:
    areas: dict[str, set[str]] = defaultdict(set)
    for src, targets in import_graph().items():
        for dst in targets:
            if area_of(dst) != area_of(src):
                areas[area_of(src)].add(area_of(dst))
    assert cycles(dict(areas)) == []


def test_core_imports_no_area() -> None:
    core = LAYERS[1][1][0]
    for src, targets in import_graph().items():
        if src.startswith(core):
            assert all(layer_of(dst) <= 1 for dst in targets), (src, targets)


def test_the_checker_sees_function_local_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("def f() -> None:\n    from gym_sidecar.store import exporter\n")
    found = imported_modules(source, "gym_sidecar.export.mod", {"gym_sidecar.store.exporter"})
    assert found == {"gym_sidecar.store.exporter"}
