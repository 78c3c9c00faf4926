"""The ``memory`` settings: glibc's arena cap and the periodic malloc_trim."""

from __future__ import annotations

import asyncio

import pytest
from gym_sidecar import malloc
from gym_sidecar.config import SidecarConfig
from gym_sidecar.malloc import MemoryConfig, MemoryTuner
from pydantic import ValidationError


def test_defaults_and_validation() -> None:
    cfg = SidecarConfig()
    assert (cfg.memory.malloc_arena_max, cfg.memory.malloc_trim_interval_s) == (2, 1.0)
    off = SidecarConfig.model_validate(
        {"memory": {"malloc_arena_max": 0, "malloc_trim_interval_s": 0}}
    )
    assert off.memory.malloc_arena_max == 0
    with pytest.raises(ValidationError):
        MemoryConfig(malloc_arena_max=-1)
    with pytest.raises(ValidationError):
        MemoryConfig(malloc_trim_interval_s=-1)


@pytest.mark.skipif(malloc.libc() is None, reason="not on glibc")
def test_tuner_sets_the_arena_cap_and_trims_until_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []
    monkeypatch.setattr(malloc, "trim", lambda: trims.append(1))

    async def body() -> None:
        tuner = MemoryTuner(MemoryConfig(malloc_arena_max=4, malloc_trim_interval_s=0.01))
        tuner.start()
        for _ in range(500):
            if len(trims) >= 3:
                break
            await asyncio.sleep(0.01)
        await tuner.stop()
        count = len(trims)
        await asyncio.sleep(0.05)
        assert count >= 3
        assert len(trims) == count  # stopped

    asyncio.run(body())
    assert malloc.set_arena_max(8)  # glibc accepts M_ARENA_MAX (restores its default)


def test_turned_off_starts_no_task() -> None:
    async def body() -> None:
        tuner = MemoryTuner(MemoryConfig(malloc_arena_max=0, malloc_trim_interval_s=0))
        tuner.start()
        assert tuner._task is None
        await tuner.stop()

    asyncio.run(body())
