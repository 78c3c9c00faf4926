"""An export request's body as the exporters send it: from the queue's pieces, never
joined into one more copy of the whole batch.

A leased batch is the concatenation of its entries' pieces (``Lease.parts``: received
bytes, slices of them, new resources). Joining them first, as the sender used to, made
one copy of the whole batch (up to ``queue.batch_max_bytes``) and held it beside the
entries for the whole export: at 10k spans/s in the default configuration it was the
largest single block alive at the sidecar's peak under load (tracemalloc,
docs/benchmarks.md, "Performance round 4"). Here:

- :func:`gzip_parts` deflates the pieces as they are, through one streaming compressor
  (the output is one gzip member that inflates to their join, the size one call over
  the join gives within a fraction of a percent);
- :func:`coalesced` yields the pieces in runs of about :data:`CHUNK_BYTES` (small pieces
  joined, large ones passed as they are), so an uncompressed body is still copied once on
  its way to the socket, but into chunks of bounded size instead of one batch-sized
  buffer.

Pure functions; the compressor releases the GIL, so :func:`gzip_parts` can run in a
worker thread.
"""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Piece = bytes | memoryview
"""One piece of a serialized request (never modified)."""

CHUNK_BYTES = 256 * 1024
"""Pieces are coalesced into runs of about this size (one h2 ``send_data`` or one
``sendall`` each)."""

GZIP_WBITS = 31
"""wbits selecting the gzip container (RFC 1952) with a 32 KiB window."""

MEM_LEVEL = 9
"""deflate's memLevel: a larger hash table and symbol buffer than the default 8. On the
benchmark's loads it costs 2.5 % fewer instructions at the same level for the same
size (+0.07 %); docs/export.md has the figures."""


@functools.cache
def _zlib() -> tuple[str, Any]:
    # Imported on first use, so a sidecar that never gzips does not load it.
    try:
        from zlib_ng import zlib_ng
    except ImportError:  # no wheel for this platform: the standard library's zlib
        # Loud on purpose: zlib costs about twice the CPU per byte (docs/benchmarks.md,
        # "Why the two harnesses disagreed"), which is easy to miss otherwise.
        logger.warning("zlib-ng is not importable: gzip export uses zlib at ~2x the CPU")
        return "zlib", zlib
    return "zlib-ng", zlib_ng


def gzip_library() -> str:
    """Which deflate implementation gzip bodies go through: ``zlib-ng`` or ``zlib``."""
    return str(_zlib()[0])


def gzip_parts(parts: Sequence[Piece], level: int) -> bytes:
    """The concatenation of ``parts`` as one standard gzip member at ``level`` (1
    fastest .. 9 smallest), deflated piece by piece (nothing is joined first)."""
    mod = _zlib()[1]
    deflater = mod.compressobj(level, mod.DEFLATED, GZIP_WBITS, MEM_LEVEL)
    out = [deflater.compress(part) for part in parts]
    out.append(deflater.flush())
    return b"".join(out)


def gzip_body(payload: bytes, level: int) -> bytes:
    """``payload`` as one standard gzip member at ``level`` (see :func:`gzip_parts`)."""
    return gzip_parts((payload,), level)


def body_size(parts: Sequence[Piece]) -> int:
    """The length of the concatenation of ``parts``."""
    return sum(map(len, parts))


def coalesced(parts: Sequence[Piece], chunk_bytes: int = CHUNK_BYTES) -> Iterator[Piece]:
    """The concatenation of ``parts`` as chunks: a piece of at least ``chunk_bytes`` as it
    is, runs of smaller ones joined up to about that size. Empty pieces are skipped."""
    run: list[Piece] = []
    size = 0
    for part in parts:
        n = len(part)
        if not n:
            continue
        if n >= chunk_bytes:
            if run:
                yield run[0] if len(run) == 1 else b"".join(run)
                run, size = [], 0
            yield part
            continue
        run.append(part)
        size += n
        if size >= chunk_bytes:
            yield run[0] if len(run) == 1 else b"".join(run)
            run, size = [], 0
    if run:
        yield run[0] if len(run) == 1 else b"".join(run)
