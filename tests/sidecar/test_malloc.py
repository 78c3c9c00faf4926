"""The ``memory`` settings: glibc's arena cap, its fixed mmap threshold and the periodic
malloc_trim."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from gym_sidecar import malloc
from gym_sidecar.config import SidecarConfig
from gym_sidecar.configmodel import ValidationError
from gym_sidecar.malloc import MemoryConfig, MemoryTuner


def test_defaults_and_validation() -> None:
    cfg = SidecarConfig()
    memory = cfg.memory
    assert (
        memory.malloc_arena_max,
        memory.malloc_mmap_threshold_bytes,
        memory.malloc_trim_interval_s,
    ) == (2, 0, 1.0)
    off = SidecarConfig.model_validate(
        {
            "memory": {
                "malloc_arena_max": 0,
                "malloc_mmap_threshold_bytes": 131072,
                "malloc_trim_interval_s": 0,
            }
        }
    )
    assert (off.memory.malloc_arena_max, off.memory.malloc_mmap_threshold_bytes) == (0, 131072)
    with pytest.raises(ValidationError):
        MemoryConfig(malloc_arena_max=-1)
    with pytest.raises(ValidationError):
        MemoryConfig(malloc_trim_interval_s=-1)
    with pytest.raises(ValidationError):
        MemoryConfig(malloc_mmap_threshold_bytes=-1)
    with pytest.raises(ValidationError):  # past glibc's bound, which it would refuse
        MemoryConfig(malloc_mmap_threshold_bytes=malloc.MAX_MMAP_THRESHOLD + 1)


@pytest.mark.skipif(malloc.libc() is None, reason="not on glibc")
def test_tuner_sets_the_arena_cap_and_trims_until_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []
    monkeypatch.setattr(malloc, "trim", lambda: trims.append(1))

    async def body() -> None:
        config = MemoryConfig(
            malloc_arena_max=4, malloc_mmap_threshold_bytes=0, malloc_trim_interval_s=0.01
        )
        tuner = MemoryTuner(config)
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


# A child process (the threshold is process-wide): a 1 MiB block freed raises glibc's
# sliding threshold to 1 MiB, so a 600 KB block then comes from the main heap (brk),
# unless the tuner fixed the threshold at 128 KiB: then it is a mapping of its own. 600 KB,
# not less: malloc serves a block from the heap's free top whatever the threshold, and
# that top can hold a few hundred KB (a 200 KB block landed there once the sidecar's
# imports changed).
_MAPPED_AFTER_BIG_FREE = textwrap.dedent(
    """
    import asyncio, ctypes, sys
    from gym_sidecar.malloc import MemoryConfig, MemoryTuner

    def in_heap(address):
        with open("/proc/self/maps") as maps:
            for line in maps:
                if line.rstrip().endswith("[heap]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    if lo <= address < hi:
                        return True
        return False

    async def main(threshold):
        tuner = MemoryTuner(MemoryConfig(
            malloc_arena_max=0, malloc_trim_interval_s=0, malloc_mmap_threshold_bytes=threshold
        ))
        tuner.start()
        big = bytearray(1 << 20)
        del big
        block = bytearray(600_000)
        address = ctypes.addressof((ctypes.c_char * len(block)).from_buffer(block))
        mapped = not in_heap(address)
        del block
        await tuner.stop()
        print(mapped)

    asyncio.run(main(int(sys.argv[1])))
    """
)


@pytest.mark.skipif(malloc.libc() is None, reason="not on glibc")
@pytest.mark.parametrize(("threshold", "mapped"), [(128 * 1024, "True"), (0, "False")])
def test_the_mmap_threshold_keeps_large_blocks_out_of_the_heap(threshold: int, mapped: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _MAPPED_AFTER_BIG_FREE, str(threshold)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == mapped, out.stderr


def test_turned_off_starts_no_task() -> None:
    async def body() -> None:
        tuner = MemoryTuner(
            MemoryConfig(
                malloc_arena_max=0, malloc_mmap_threshold_bytes=0, malloc_trim_interval_s=0
            )
        )
        tuner.start()
        assert tuner._task is None
        await tuner.stop()

    asyncio.run(body())
