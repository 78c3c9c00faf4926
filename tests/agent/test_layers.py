"""The agent's import graph: no import runs from a lower layer up to a higher one, and
no cycle between modules; and every access to an SDK internal stays in ``_lean``.

The twin of ``tests/sidecar/test_layers.py`` (the graph helpers both use are in
``tests/support/import_graph.py``): every
``import`` / ``from ... import`` of the source tree counts, at any depth (function-local
and ``TYPE_CHECKING`` imports included). The layers are written down in docs/agent.md
("Layers").
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gym_telemetry
from gym_telemetry import _lean

from tests.support.import_graph import import_graph as graph_of
from tests.support.import_graph import imported_modules as imported_by
from tests.support.import_graph import layer_of as layer_in
from tests.support.import_graph import module_cycles, upward_imports

PACKAGE = "gym_telemetry"
ROOT = Path(gym_telemetry.__file__).resolve().parent

# Lowest first. A module belongs to the layer of the longest prefix listed here that
# names it or one of its packages; every module must be covered (a new module fails
# test_every_module_has_a_layer until it is placed).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "leaves",
        (
            "gym_telemetry",
            "gym_telemetry.environment_variables",
            "gym_telemetry.asgi",
            "gym_telemetry.outcomes",
            "gym_telemetry.streaming",
            "gym_telemetry.inflight",
            "gym_telemetry.answers",
            "gym_telemetry.genai",
        ),
    ),
    (
        "rollout id and span groups",
        ("gym_telemetry.rollout_correlation", "gym_telemetry.span_groups"),
    ),
    ("lean path over the SDK", ("gym_telemetry._lean",)),
    ("export switch", ("gym_telemetry._export",)),
    ("live events", ("gym_telemetry._live",)),
    ("wrapper engine", ("gym_telemetry._engine",)),
    ("public wrappers", ("gym_telemetry.endpoints",)),
    (
        "setup",
        ("gym_telemetry.resource", "gym_telemetry.remote_config", "gym_telemetry.provider"),
    ),
    (
        "gym integration parts",
        (
            "gym_telemetry.autoinstrument.import_hooks",
            "gym_telemetry.autoinstrument.propagation",
            "gym_telemetry.autoinstrument.identity",
            "gym_telemetry.autoinstrument.server_span",
            "gym_telemetry.autoinstrument.routes",
            "gym_telemetry.autoinstrument.gym_primitives",
            "gym_telemetry.autoinstrument.hops",
            "gym_telemetry.autoinstrument.model_calls",
            "gym_telemetry.autoinstrument.mcp",
            "gym_telemetry.autoinstrument.harness_http",
            "gym_telemetry.autoinstrument.ray_tasks",
        ),
    ),
    ("gym integration assembly", ("gym_telemetry.autoinstrument.install",)),
    (
        "entry points",
        (
            "gym_telemetry.autoinstrument",
            "gym_telemetry.autoinstrument.startup",
            "gym_telemetry.autoinstrument.launcher",
        ),
    ),
)


def import_graph() -> dict[str, set[str]]:
    return graph_of(PACKAGE, ROOT)


def imported_modules(path: Path, module: str, modules: set[str]) -> set[str]:
    return imported_by(PACKAGE, path, module, modules)


def layer_of(module: str) -> int:
    return layer_in(PACKAGE, LAYERS, module)


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_import_runs_up_a_layer() -> None:
    assert upward_imports(PACKAGE, LAYERS, import_graph()) == []


def test_no_cycle_between_modules() -> None:
    assert module_cycles(import_graph()) == []


def test_the_lean_package_imports_only_the_environment_names() -> None:
    outside = {
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        if src.startswith("gym_telemetry._lean")
        for dst in targets
        if not dst.startswith("gym_telemetry._lean")
        and dst not in {"gym_telemetry", "gym_telemetry.environment_variables"}
    }
    assert outside == set()


def test_the_checker_sees_function_local_and_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gym_telemetry import provider\n"
        "def f() -> None:\n    from gym_telemetry._lean import recorder\n"
    )
    known = {"gym_telemetry.provider", "gym_telemetry._lean.recorder"}
    found = imported_modules(source, "gym_telemetry.mod", known)
    assert found == known


# --- SDK internals: only in _lean --------------------------------------------------------


def _private_accesses(path: Path) -> set[str]:
    """Private names ``path`` reaches into on objects other than ``self``/``cls``: an
    attribute ``x._name``, ``getattr(x, "_name")`` / ``hasattr``, and names imported
    with a leading underscore from ``opentelemetry``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if node.attr.startswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            found.add(node.attr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr", "setattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
            and not node.args[1].value.startswith("__")
        ):
            found.add(node.args[1].value)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
            found.update(a.name for a in node.names if a.name.startswith("_"))
    return found


def test_no_module_outside_lean_touches_an_sdk_internal() -> None:
    touched = {
        f"{path.relative_to(ROOT)}: {sorted(names)}"
        for path in ROOT.rglob("*.py")
        if "_lean" not in path.relative_to(ROOT).parts
        for names in [_private_accesses(path) & _lean.SDK_INTERNALS]
        if names
    }
    assert touched == set()


def test_the_lean_note_names_every_sdk_internal_the_package_reads() -> None:
    """Every private name ``_lean`` reaches into on a foreign object is listed in
    ``SDK_INTERNALS`` (and so in its module note), apart from this package's own."""
    own = {
        "_attrs",
        "_recorder",
        "_plain",
        "_token",
        "_layout_checked",
        "_check_result",
        "_lean_class",
    }
    used: set[str] = set()
    for path in (ROOT / "_lean").rglob("*.py"):
        used |= _private_accesses(path)
    assert used - own - _lean.SDK_INTERNALS == set()
    note = (ROOT / "_lean" / "__init__.py").read_text().split('"""')[1]
    missing = {
        name
        for name in _lean.SDK_INTERNALS
        if re.search(r"(?<![A-Za-z0-9_])" + re.escape(name) + r"\b", note) is None
    }
    assert missing <= {
        "_remote_parent_sampled",
        "_remote_parent_not_sampled",
        "_local_parent_sampled",
        "_local_parent_not_sampled",
    }
