"""How the demo member finds the source tree it runs from (no fixed climb from its own
file: it is a workspace member, installed wherever uv puts it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gym_telemetry_demo.gym_servers import REPO_ENV, examples_dir, repo_root

REPO = Path(__file__).resolve().parents[2]


def fake_tree(root: Path) -> Path:
    (root / "examples" / "gym_stack").mkdir(parents=True)
    (root / "scripts").mkdir()
    return root


def test_explicit_repo_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(REPO_ENV, str(REPO))
    tree = fake_tree(tmp_path / "tree")
    assert repo_root(tree) == tree.resolve()
    assert examples_dir(tree) == tree / "examples" / "gym_stack"


def test_environment_then_the_nearest_tree_above_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = fake_tree(tmp_path / "tree")
    monkeypatch.setenv(REPO_ENV, str(tree))
    monkeypatch.chdir(REPO)
    assert repo_root() == tree.resolve()
    monkeypatch.delenv(REPO_ENV)
    deep = tree / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert repo_root() == tree.resolve()


def test_no_tree_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPO_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="--repo"):
        repo_root()
    with pytest.raises(RuntimeError, match="not a gym-telemetry source tree"):
        repo_root(tmp_path)
