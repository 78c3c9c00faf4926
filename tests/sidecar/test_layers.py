"""The sidecar's import graph: no import runs from a lower layer up to a higher one, and
no cycle, neither between modules nor between areas.

Every ``import`` / ``from ... import`` of the source tree counts, at any depth
(function-local and ``TYPE_CHECKING`` imports included): a local import hides a
dependency from a reader, not from the graph. The layers are the ones described in
``gym_sidecar/assemble.py`` and docs/sidecar.md.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import gym_sidecar

PACKAGE = "gym_sidecar"
ROOT = Path(gym_sidecar.__file__).resolve().parent

# Lowest first. A module belongs to the layer of the longest prefix listed here that
# names it or one of its packages; every module of the tree must be covered (a new
# top-level module or area fails test_every_module_has_a_layer until it is placed).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves", ("gym_sidecar", "gym_sidecar.selfmetrics", "gym_sidecar.malloc")),
    ("core", ("gym_sidecar.core",)),
    (
        "configuration",
        (
            "gym_sidecar.configload",
            "gym_sidecar.config",
            "gym_sidecar.enrich.config",
            "gym_sidecar.enrich.downward_api",
            "gym_sidecar.export.config",
            "gym_sidecar.gating.config",
            "gym_sidecar.metrics.config",
            "gym_sidecar.store.config",
        ),
    ),
    (
        "areas",
        (
            "gym_sidecar.receiver",
            "gym_sidecar.enrich",
            "gym_sidecar.metrics",
            "gym_sidecar.gating",
            "gym_sidecar.export",
            "gym_sidecar.store",
            "gym_sidecar.inspect",
            "gym_sidecar.query",
            "gym_sidecar.webui",
            "gym_sidecar.webhook",
            "gym_sidecar.admin",
            "gym_sidecar.asgi_listener",
        ),
    ),
    ("assembly", ("gym_sidecar.assemble",)),
    ("entry points", ("gym_sidecar.server", "gym_sidecar.cli")),
)


def module_name(path: Path) -> str:
    parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, module: str, modules: set[str]) -> set[str]:
    """Every gym_sidecar module ``path`` imports, at any depth of its syntax tree.

    ``from pkg import name`` imports the module ``pkg.name`` when ``modules`` has one,
    else ``pkg`` itself. (A package's ``__init__`` runs for every submodule import; it
    counts as a dependency only when something is taken from it.)
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in modules else target)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        graph[module] = {m for m in imported_modules(path, module, known) if m in known} - {module}
    return graph


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # The package itself names only its __init__ (the version), not the tree.
            inside = prefix != PACKAGE and module.startswith(prefix + ".")
            named = module == prefix or inside
            if named and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def area_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{src} ({LAYERS[layer_of(src)][0]}) -> {dst} ({LAYERS[layer_of(dst)][0]})"
        for src, targets in sorted(import_graph().items())
        for dst in sorted(targets)
        # A package's __init__ importing its own modules is not a dependency edge.
        if layer_of(dst) > layer_of(src) and not dst.startswith(src + ".")
    ]
    assert upward == []


def test_no_cycle_between_modules() -> None:
    graph = {
        src: {dst for dst in targets if not dst.startswith(src + ".")}
        for src, targets in import_graph().items()
    }
    assert cycles(graph) == []


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
