"""Which top-level trees may import which.

The product packages (``semconv``, ``agent``, ``sidecar``, ``demo``) import none of
``tests``, ``testkit`` or ``bench``; ``bench`` and ``testkit`` never import ``tests``
(what the benchmarks and tests share lives in ``testkit``); ``testkit`` never imports
``bench``. Every import statement counts, at any depth (function-local and
``TYPE_CHECKING`` imports included), and so does ``python -m tests...`` in a string, the
way the benchmarks start sink processes (when it names a module of this repository).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("semconv/src", "agent/src", "sidecar/src", "demo/src")
FORBIDDEN = {
    **{tree: ("tests", "testkit", "bench") for tree in PRODUCT},
    "bench": ("tests",),
    "testkit": ("tests", "bench"),
}
_MODULE_FLAG = re.compile(r"^(?:tests|testkit|bench)(?:\.\w+)*$")


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module of this repository (not, say, a scope name)."""
    base = REPO.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imported_roots(path: Path) -> set[tuple[int, str]]:
    """(line, top-level name) of every absolute import in ``path``, plus every string
    that is a dotted module name of one of the trees (a ``-m`` argument)."""
    found: set[tuple[int, str]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _MODULE_FLAG.match(node.value)
            and _is_module(node.value)
        ):
            found.add((node.lineno, node.value.split(".")[0]))
    return found


def violations(tree: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((REPO / tree).rglob("*.py")):
        for line, root in sorted(imported_roots(path)):
            if root in forbidden:
                out.append(f"{path.relative_to(REPO)}:{line} imports {root}")
    return out


@pytest.mark.parametrize("tree", sorted(FORBIDDEN))
def test_tree_imports_point_one_way(tree: str) -> None:
    assert (REPO / tree).is_dir(), tree
    assert violations(tree, FORBIDDEN[tree]) == []


def test_the_scan_sees_imports_at_any_depth_and_module_strings(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "def f():\n"
        "    from tests.support.ports import free_port\n"
        "    return ['python', '-m', 'tests.support.ports', 'tests.not_a_module']\n"
    )
    assert imported_roots(sample) == {(1, "os"), (3, "tests"), (4, "tests")}
