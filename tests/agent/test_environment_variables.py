"""The agent's environment variables: one module names them all, docs/agent.md lists
them all, and no other module of the agent spells one."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import gym_telemetry
from gym_telemetry import environment_variables as env_vars

ROOT = Path(gym_telemetry.__file__).resolve().parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "agent.md"
NAME = re.compile(r"\b(?:GYM_TELEMETRY|OTEL|NEMO_GYM)[A-Z0-9_]*\b")


def _doc_table() -> str:
    """The first column of the table in docs/agent.md's "Environment variables"."""
    text = DOC.read_text()
    start = text.index("## Environment variables")
    end = text.index("\n## ", start + 1)
    rows = [line for line in text[start:end].splitlines() if line.startswith("| `")]
    return "\n".join(row.split("|")[1] for row in rows)


def test_every_constant_is_its_own_name_and_documented_in_the_module() -> None:
    source = ast.parse(Path(env_vars.__file__).read_text())
    body = source.body
    documented = set()
    for node, following in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if name == "ALL":
                continue
            assert getattr(env_vars, name) == name, name
            doc = following if isinstance(following, ast.Expr) else None
            assert doc is not None and isinstance(doc.value, ast.Constant), name
            assert isinstance(doc.value.value, str) and doc.value.value.strip(), name
            documented.add(name)
    assert documented == set(env_vars.ALL)
    assert len(env_vars.ALL) >= 20


def test_docs_list_exactly_the_modules_names() -> None:
    listed = set(NAME.findall(_doc_table()))
    assert listed == set(env_vars.ALL)


def test_no_other_agent_module_spells_an_environment_variable() -> None:
    """String constants naming a variable live in environment_variables only (docstrings
    and comments may mention them)."""
    found: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "environment_variables.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
                and node.value in env_vars.ALL
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert found == []
