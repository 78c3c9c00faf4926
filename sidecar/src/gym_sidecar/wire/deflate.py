"""gzip and deflate: the one place the sidecar chooses its compression libraries.

Both directions use the standard library's ``zlib`` interface (``compressobj``,
``decompressobj``), from whichever library does the work at the least CPU per byte:

- **deflate** (the exporters' gzip bodies) at ``level`` 1 (fastest) .. 9 (smallest):
  levels 1-3 through ISA-L (PyPI ``isal``, Intel's igzip, at its own levels 1-3),
  levels 4-9 through zlib-ng (PyPI ``zlib-ng``). On the benchmark's batches ISA-L's
  level 2 gives the bytes of zlib-ng's level 2 at 0.39x its CPU and 4 % more than
  zlib-ng's level 5 at 0.25x its CPU (docs/export.md, "gzip"), and sizes stay
  monotone across the seam (ISA-L 3 is larger than zlib-ng 4).
- **inflate** (gzip and deflate received over OTLP/HTTP and gRPC, and gRPC answers)
  through zlib-ng: about half the standard library's CPU per byte, the same API
  (``max_length``, ``unconsumed_tail``, ``eof``, ``unused_data``), so the receivers'
  bounds read the same.

A library that cannot be imported (no wheel for the platform) falls back to the next
(ISA-L to zlib-ng, zlib-ng to the standard library's ``zlib``) with one warning, since
the cost is easy to miss otherwise; the output is standard gzip either way. Each
library is imported on first use, so a sidecar that never sees gzip loads none of them.
Compressors and decompressors release the GIL, so callers may run them in a worker
thread.
"""

from __future__ import annotations

import functools
import logging
import zlib
from typing import Any, Final, Protocol

logger = logging.getLogger(__name__)

GZIP_WBITS: Final = 31
"""wbits selecting the gzip container (RFC 1952) with a 32 KiB window."""
DEFLATE_WBITS: Final = 15
"""wbits selecting the zlib container (RFC 1950), what ``grpc-encoding: deflate`` is."""
ISAL_MAX_LEVEL: Final = 3
"""Levels up to this one go through ISA-L (its levels are 0-3)."""
MEM_LEVEL: Final = 9
"""zlib-ng's memLevel (levels 4-9): a larger hash table and symbol buffer than the
default 8, 2.2-2.4 % fewer instructions at the same size (docs/export.md)."""


class Deflater(Protocol):
    """A streaming compressor (``zlib.compressobj``'s interface)."""

    def compress(self, data: bytes | memoryview, /) -> bytes: ...
    def flush(self, mode: int = ..., /) -> bytes: ...


class Inflater(Protocol):
    """A streaming decompressor (``zlib.decompressobj``'s interface)."""

    @property
    def unconsumed_tail(self) -> bytes: ...
    @property
    def unused_data(self) -> bytes: ...
    @property
    def eof(self) -> bool: ...
    def decompress(self, data: bytes | memoryview, max_length: int = ..., /) -> bytes: ...


@functools.cache
def _zlib_ng() -> tuple[str, Any]:
    try:
        from zlib_ng import zlib_ng
    except ImportError:
        logger.warning("zlib-ng is not importable: gzip uses zlib at ~2x the CPU")
        return "zlib", zlib
    return "zlib-ng", zlib_ng


@functools.cache
def _isal() -> tuple[str, Any]:
    try:
        from isal import isal_zlib
    except ImportError:
        fallback = _zlib_ng()
        logger.warning(
            "isal is not importable: gzip levels 1-3 use %s at ~2.5x the CPU", fallback[0]
        )
        return fallback
    return "isal", isal_zlib


def _deflate_library(level: int) -> tuple[str, Any]:
    return _isal() if level <= ISAL_MAX_LEVEL else _zlib_ng()


def deflate_library(level: int) -> str:
    """Which library deflates at ``level``: ``isal``, ``zlib-ng`` or ``zlib``."""
    return str(_deflate_library(level)[0])


def inflate_library() -> str:
    """Which library inflates: ``zlib-ng`` or ``zlib``."""
    return str(_zlib_ng()[0])


def gzip_compressor(level: int) -> Deflater:
    """A compressor writing one standard gzip member at ``level`` (1 fastest .. 9
    smallest; module doc for which library does which level)."""
    name, mod = _deflate_library(level)
    if name == "isal":
        return mod.compressobj(level, mod.DEFLATED, GZIP_WBITS)  # type: ignore[no-any-return]
    return mod.compressobj(level, mod.DEFLATED, GZIP_WBITS, MEM_LEVEL)  # type: ignore[no-any-return]


def inflater(wbits: int) -> Inflater:
    """A decompressor for ``wbits`` (:data:`GZIP_WBITS`, :data:`DEFLATE_WBITS`)."""
    return _zlib_ng()[1].decompressobj(wbits)  # type: ignore[no-any-return]


def inflate_errors() -> tuple[type[Exception], ...]:
    """The exceptions a broken stream raises from :func:`inflater`'s decompressors."""
    return (_zlib_ng()[1].error, zlib.error)
