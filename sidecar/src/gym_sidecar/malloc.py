"""Keep glibc's allocator from holding on to memory the sidecar freed (``memory`` config).

Under load the sidecar allocates and frees large buffers (each received request joined
from the socket, the requests the gate re-serialized, export batches and their gzip
output). glibc keeps freed memory in its arenas and at the top of its heaps, so resident
memory at 10k spans/s sat ~8-10 MiB above idle (docs/benchmarks.md). Three settings, all
measured there:

- ``malloc_arena_max``: ``mallopt(M_ARENA_MAX, n)`` at start, before any thread exists,
  so fewer arenas each keep their own free memory;
- ``malloc_mmap_threshold_bytes`` (off by default): ``mallopt(M_MMAP_THRESHOLD, n)`` at
  start. glibc serves a block of at least this size with its own ``mmap`` and unmaps it
  on ``free``. Left alone, glibc raises the threshold to the size of each such block
  freed (up to 32 MiB), after which the ~200 KiB received requests come from the heap
  and, freed between live objects, stay resident. Fixed at 128 KiB it lowers the peak
  RSS at 10k spans/s by ~0.7 MiB, but every large buffer then costs a mapping and its
  page faults: 22-29 % fewer spans per CPU-second at full load, so it is a knob for
  memory-bound hosts, not a default;
- ``malloc_trim_interval_s``: every so often the event loop calls ``malloc_trim(0)``,
  which hands free pages back to the OS (top of the heap and, since glibc 2.8, whole
  free pages inside it).

All are no-ops where the C library is not glibc (musl, macOS): :func:`libc` is None.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import logging
from typing import Final

from gym_sidecar.configmodel import Field, Section

logger = logging.getLogger(__name__)

_M_ARENA_MAX = -8
"""mallopt parameter number of M_ARENA_MAX in glibc's malloc.h."""
_M_MMAP_THRESHOLD = -3
"""mallopt parameter number of M_MMAP_THRESHOLD in glibc's malloc.h."""
MAX_MMAP_THRESHOLD: Final = 32 * 1024 * 1024
"""glibc's upper bound for M_MMAP_THRESHOLD on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)."""


class MemoryConfig(Section):
    """How the sidecar asks glibc's allocator to give memory back (module doc)."""

    malloc_arena_max: int = Field(default=2, ge=0)
    """Set glibc's M_ARENA_MAX at start; 0 leaves glibc's default (8 x cores), or what
    ``MALLOC_ARENA_MAX`` in the environment says."""
    malloc_mmap_threshold_bytes: int = Field(default=0, ge=0, le=MAX_MMAP_THRESHOLD)
    """Set and fix glibc's M_MMAP_THRESHOLD at start (module doc: less memory, more CPU);
    0 leaves glibc's sliding threshold, or what ``MALLOC_MMAP_THRESHOLD_`` says."""
    malloc_trim_interval_s: float = Field(default=1.0, ge=0)
    """Call ``malloc_trim(0)`` this often; 0 turns it off."""


@functools.cache
def libc() -> ctypes.CDLL | None:
    """glibc, when the process runs on it (it has ``malloc_trim`` and ``mallopt``)."""
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(lib, "malloc_trim") or not hasattr(lib, "mallopt"):
        return None
    return lib


def _mallopt(param: int, value: int) -> bool:
    """``mallopt(param, value)``; True if glibc took it (False off glibc)."""
    lib = libc()
    return bool(lib is not None and lib.mallopt(param, value) == 1)


def set_arena_max(n: int) -> bool:
    """``mallopt(M_ARENA_MAX, n)``; True if glibc took it. Call before threads start."""
    return _mallopt(_M_ARENA_MAX, n)


def set_mmap_threshold(n: int) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, n)``; True if glibc took it."""
    return _mallopt(_M_MMAP_THRESHOLD, n)


def trim() -> None:
    """Return free heap memory to the OS (glibc only)."""
    lib = libc()
    if lib is not None:
        lib.malloc_trim(0)


async def trim_periodically(interval_s: float) -> None:
    """Call :func:`trim` every ``interval_s`` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        trim()


class MemoryTuner:
    """Applies a :class:`MemoryConfig`: ``start`` on the loop, ``stop`` at shutdown."""

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        cfg = self.config
        if libc() is None:
            if (
                cfg.malloc_arena_max
                or cfg.malloc_mmap_threshold_bytes
                or cfg.malloc_trim_interval_s
            ):
                logger.debug("not on glibc: the memory settings do nothing here")
            return
        if cfg.malloc_arena_max and not set_arena_max(cfg.malloc_arena_max):
            logger.warning("glibc refused M_ARENA_MAX=%d", cfg.malloc_arena_max)
        threshold = cfg.malloc_mmap_threshold_bytes
        if threshold and not set_mmap_threshold(threshold):
            logger.warning("glibc refused M_MMAP_THRESHOLD=%d", threshold)
        if cfg.malloc_trim_interval_s:
            self._task = asyncio.create_task(
                trim_periodically(cfg.malloc_trim_interval_s), name="malloc-trim"
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
