"""The import graph of one package's source tree, its layers and its cycles: shared by
``tests/agent/test_layers.py`` and ``tests/sidecar/test_layers.py``.

Every ``import`` / ``from ... import`` counts, at any depth of the syntax tree
(function-local and ``TYPE_CHECKING`` imports included): a local import hides a
dependency from a reader, not from the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

Layers = tuple[tuple[str, tuple[str, ...]], ...]


def module_name(package: str, root: Path, path: Path) -> str:
    """The dotted name of the module at ``path`` inside ``package`` (rooted at ``root``)."""
    parts = (package, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(package: str, path: Path, module: str, modules: set[str]) -> set[str]:
    """Every module of ``package`` that ``path`` (module ``module``) imports.

    ``from pkg import name`` imports the module ``pkg.name`` when ``modules`` has one,
    else ``pkg`` itself. (A package's ``__init__`` runs for every submodule import; it
    counts as a dependency only when something is taken from it.)
    """
    base_package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base_package.split(".")
                base = parts[: len(parts) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in modules else target)
    return {name for name in found if name == package or name.startswith(package + ".")}


def import_graph(package: str, root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (itself excluded)."""
    files = {module_name(package, root, p): p for p in root.rglob("*.py")}
    known = set(files)
    return {
        module: {m for m in imported_modules(package, path, module, known) if m in known} - {module}
        for module, path in files.items()
    }


def layer_of(package: str, layers: Layers, module: str) -> int:
    """The index of the layer of the longest prefix in ``layers`` naming ``module`` or
    one of its packages (the package itself names only its ``__init__``)."""
    best: tuple[int, int] | None = None  # (prefix length, layer index)
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            inside = prefix != package and module.startswith(prefix + ".")
            if (module == prefix or inside) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def upward_imports(package: str, layers: Layers, graph: dict[str, set[str]]) -> list[str]:
    """Every edge from a lower layer to a higher one (a package's ``__init__`` importing
    its own modules is not a dependency edge)."""

    def layer(module: str) -> int:
        return layer_of(package, layers, module)

    return [
        f"{src} ({layers[layer(src)][0]}) -> {dst} ({layers[layer(dst)][0]})"
        for src, targets in sorted(graph.items())
        for dst in sorted(targets)
        if layer(dst) > layer(src) and not dst.startswith(src + ".")
    ]


def module_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between modules (a package's ``__init__`` importing its own modules
    excluded)."""
    return cycles(
        {
            src: {dst for dst in targets if not dst.startswith(src + ".")}
            for src, targets in graph.items()
        }
    )


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
