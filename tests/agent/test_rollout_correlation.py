"""Rollout correlation: own ContextVar, or Gym's when nemo_gym is importable."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import pytest
from gym_telemetry import rollout_correlation as rc


@pytest.fixture(autouse=True)
def _re_resolve() -> Iterator[None]:
    yield
    rc.resolve(force=True)


def _fake_gym(monkeypatch: pytest.MonkeyPatch) -> ContextVar[str | None]:
    var: ContextVar[str | None] = ContextVar("nemo_gym_rollout_id", default=None)
    mod = types.ModuleType(rc.GYM_MODULE)

    @contextmanager
    def rollout_context(rollout_id: str | None) -> Iterator[None]:
        token = var.set(rollout_id)
        try:
            yield
        finally:
            var.reset(token)

    mod._ROLLOUT_ID = var  # type: ignore[attr-defined]
    mod.current_rollout_id = var.get  # type: ignore[attr-defined]
    mod.rollout_context = rollout_context  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, rc.GYM_MODULE, mod)
    return var


def test_own_context_var_without_gym(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, rc.GYM_MODULE, raising=False)
    monkeypatch.setattr(rc.importlib.util, "find_spec", lambda name: None)
    assert rc.resolve(force=True) is False
    assert rc.current_rollout_id() is None
    with rc.rollout_context("r-1"):
        assert rc.current_rollout_id() == "r-1"
        assert rc.ROLLOUT_ID_VAR.get() == "r-1"
        with rc.rollout_context(None):
            assert rc.current_rollout_id() is None
        assert rc.current_rollout_id() == "r-1"
    assert rc.current_rollout_id() is None


def test_gyms_context_var_is_the_one_used(monkeypatch: pytest.MonkeyPatch) -> None:
    gym_var = _fake_gym(monkeypatch)
    assert rc.resolve(force=True) is True
    token = gym_var.set("set-by-gym")  # e.g. Gym's RolloutContextMiddleware
    try:
        assert rc.current_rollout_id() == "set-by-gym"
    finally:
        gym_var.reset(token)
    with rc.rollout_context("set-by-us"):
        assert gym_var.get() == "set-by-us"  # one scheme: Gym's own code sees it
    assert rc.ROLLOUT_ID_VAR.get() is None


def test_broken_gym_falls_back_to_own_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, rc.GYM_MODULE, raising=False)
    monkeypatch.setattr(rc.importlib.util, "find_spec", lambda name: object())

    def broken_import(name: str) -> types.ModuleType:
        raise SyntaxError("nemo_lens broke nemo_gym.telemetry")

    monkeypatch.setattr(rc.importlib, "import_module", broken_import)
    assert rc.resolve(force=True) is False
    with rc.rollout_context("r-2"):
        assert rc.current_rollout_id() == "r-2"


def test_context_is_per_task() -> None:
    async def one(rid: str) -> str | None:
        with rc.rollout_context(rid):
            await asyncio.sleep(0.01)
            return rc.current_rollout_id()

    async def main() -> list[str | None]:
        return list(await asyncio.gather(*(one(f"r{i}") for i in range(5))))

    assert asyncio.run(main()) == [f"r{i}" for i in range(5)]


def test_fallback_is_read_when_gym_has_no_id(monkeypatch: pytest.MonkeyPatch) -> None:
    gym_var = _fake_gym(monkeypatch)
    rc.resolve(force=True)
    rc.set_fallback(rc.ROLLOUT_ID_VAR.get)
    try:
        assert rc.current_rollout_id() is None
        with rc.own_rollout_context("from-telemetry"):
            assert gym_var.get() is None  # Gym's ContextVar is never written
            assert rc.current_rollout_id() == "from-telemetry"
            token = gym_var.set("from-gym")
            try:
                assert rc.current_rollout_id() == "from-gym"  # Gym's id wins
            finally:
                gym_var.reset(token)
        rc.resolve(force=True)  # the fallback survives re-resolution
        with rc.own_rollout_context("again"):
            assert rc.current_rollout_id() == "again"
    finally:
        rc.set_fallback(None)
    with rc.own_rollout_context("gone"):
        assert rc.current_rollout_id() is None


def test_fallback_equal_to_the_primary_is_not_composed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, rc.GYM_MODULE, raising=False)
    monkeypatch.setattr(rc.importlib.util, "find_spec", lambda name: None)
    rc.resolve(force=True)
    rc.set_fallback(rc.ROLLOUT_ID_VAR.get)
    try:
        assert rc.getter() == rc.ROLLOUT_ID_VAR.get  # one ContextVar.get, no wrapper
        with rc.own_rollout_context("r-3"):
            assert rc.current_rollout_id() == "r-3"
    finally:
        rc.set_fallback(None)


def test_a_raising_fallback_reads_as_no_id(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gym(monkeypatch)
    rc.resolve(force=True)

    def broken() -> str | None:
        raise RuntimeError("fallback broke")

    rc.set_fallback(broken)
    try:
        assert rc.current_rollout_id() is None
        with rc.rollout_context("from-gym"):
            assert rc.current_rollout_id() == "from-gym"
    finally:
        rc.set_fallback(None)


def test_the_gym_integration_binds_through_the_public_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    gym_var = _fake_gym(monkeypatch)
    rc.resolve(force=True)
    rc.bind_fallback()
    rc.bind_fallback()  # idempotent
    try:
        with rc.own_rollout_context("from-telemetry"):
            assert rc.current_rollout_id() == "from-telemetry"
            assert gym_var.get() is None
    finally:
        rc.set_fallback(None)
