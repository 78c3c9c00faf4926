"""issue 17.1: the sidecar depends on the shared names, never on the agent.

The sidecar image must not carry the OpenTelemetry SDK, the OTLP exporter or the agent's
``.pth`` start-up hook, so neither its declared dependencies nor any module under
``sidecar/src`` may name the agent. ``gym_telemetry_semconv`` itself depends on nothing.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _dependencies(member: str) -> list[str]:
    with (REPO / member / "pyproject.toml").open("rb") as fh:
        project = tomllib.load(fh)["project"]
    return [re.split(r"[\s\[<>=!~;(@]", d, maxsplit=1)[0].lower() for d in project["dependencies"]]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def _agent_imports(src: Path) -> list[str]:
    bad = []
    for path in sorted(src.rglob("*.py")):
        for module in _imported_modules(path):
            if module == "gym_telemetry" or module.startswith("gym_telemetry."):
                bad.append(f"{path.relative_to(REPO)}: {module}")
    return bad


def test_sidecar_declares_semconv_and_not_the_agent() -> None:
    deps = _dependencies("sidecar")
    assert "gym-telemetry-semconv" in deps
    assert "gym-telemetry-agent" not in deps


def test_agent_declares_semconv() -> None:
    assert "gym-telemetry-semconv" in _dependencies("agent")


def test_semconv_has_no_dependencies() -> None:
    assert _dependencies("semconv") == []


def test_no_sidecar_module_imports_the_agent() -> None:
    assert _agent_imports(REPO / "sidecar" / "src") == []


def test_the_check_finds_an_agent_import(tmp_path: Path) -> None:
    """The scan above can fail: it sees plain, from- and function-local imports."""
    module = tmp_path / "m.py"
    module.write_text(
        "import gym_telemetry_semconv\n"
        "def f():\n    from gym_telemetry.span_groups import parse_spec\n"
        "import gym_telemetry\n"
    )
    assert _imported_modules(module) >= {"gym_telemetry.span_groups", "gym_telemetry"}
    assert "gym_telemetry_semconv" in _imported_modules(module)


def test_semconv_imports_only_the_standard_library() -> None:
    import sys

    src = REPO / "semconv" / "src"
    for path in sorted(src.rglob("*.py")):
        for module in _imported_modules(path):
            top = module.split(".")[0]
            assert top == "gym_telemetry_semconv" or top in sys.stdlib_module_names, (
                f"{path.relative_to(REPO)} imports {module}"
            )
