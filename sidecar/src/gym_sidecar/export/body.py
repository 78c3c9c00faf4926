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

from collections.abc import Iterator, Sequence

from gym_sidecar.wire import deflate

Piece = bytes | memoryview
"""One piece of a serialized request (never modified)."""

CHUNK_BYTES = 256 * 1024
"""Pieces are coalesced into runs of about this size (one h2 ``send_data`` or one
``sendall`` each)."""


def gzip_parts(parts: Sequence[Piece], level: int) -> bytes:
    """The concatenation of ``parts`` as one standard gzip member at ``level`` (1
    fastest .. 9 smallest; ``wire.deflate`` says which library does which level),
    deflated piece by piece (nothing is joined first)."""
    deflater = deflate.gzip_compressor(level)
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
