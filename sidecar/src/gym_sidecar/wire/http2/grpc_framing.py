"""gRPC's framing on an HTTP/2 stream, for both ends (the receiver's server and the
exporter's client): the 5-byte length prefix of a message, its compression
(``grpc-encoding``) and the ``grpc-timeout`` header.

- :func:`prefix` / :func:`read_prefix`: a message is a flag byte (1: compressed), a
  4-byte big-endian length, then the message;
- :func:`inflate`: a compressed message, from its DATA chunks, inflated up to a bound
  (:class:`InflateError` past it, or for broken data);
- :func:`format_timeout` / :func:`parse_timeout`: ``grpc-timeout``, 1-8 ASCII digits and
  a unit (H M S m u n).

Pure functions; no I/O, no counters (each end counts in its own terms).
"""

from __future__ import annotations

import struct

from gym_sidecar.wire import deflate

PREFIX_BYTES = 5
"""The length prefix of every gRPC message: a flag byte and a 4-byte length."""
CONTENT_TYPE = b"application/grpc"
ENCODINGS = {b"gzip": deflate.GZIP_WBITS, b"deflate": deflate.DEFLATE_WBITS}
"""``grpc-encoding`` values either end inflates, and their zlib window bits."""

_PREFIX = struct.Struct(">BI")
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_MAX_TIMEOUT_DIGITS = 99_999_999


def prefix(compressed: bool, length: int) -> bytes:
    """The 5-byte prefix of a message of ``length`` bytes."""
    return _PREFIX.pack(1 if compressed else 0, length)


def read_prefix(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """``(flag, length)`` from the first :data:`PREFIX_BYTES` of ``data``."""
    flag, length = _PREFIX.unpack_from(data)
    return flag, length


EMPTY_MESSAGE = prefix(False, 0)
"""An empty message, framed (what an empty response is on the wire)."""


class InflateError(Exception):
    """A compressed message that cannot be had: ``reason`` is ``too_large`` (more than
    the bound inflated) or ``bad_gzip`` (broken, truncated, or followed by data)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def inflate(chunks: list[bytes | memoryview], encoding: bytes, max_bytes: int) -> bytes:
    """The compressed message in ``chunks`` (its DATA as received, the first chunk
    starting with the 5-byte prefix) inflated; ``encoding`` one of :data:`ENCODINGS`.

    Inflated chunk by chunk, each chunk let go (emptied in ``chunks``) once inflated, so
    the compressed message is never joined into one more copy. More than ``max_bytes``
    inflated raises :class:`InflateError` ``too_large`` (inflation stops there, so a
    gzip bomb costs at most that much); broken or truncated data, or data after the end
    of the compressed stream, ``bad_gzip``.
    """
    name = encoding.decode("latin-1")
    room = max_bytes + 1
    inflater = deflate.inflater(ENCODINGS[encoding])
    out: list[bytes] = []
    for index in range(len(chunks)):
        data = memoryview(chunks[index])[PREFIX_BYTES:] if index == 0 else chunks[index]
        chunks[index] = b""
        try:
            piece = inflater.decompress(data, room)
        except deflate.inflate_errors() as exc:
            raise InflateError("bad_gzip", f"message is not valid {name}: {exc}") from None
        room -= len(piece)
        if room <= 0:
            raise InflateError("too_large", "message inflated")
        if piece:
            out.append(piece)
    if not inflater.eof or inflater.unused_data:
        what = "truncated" if not inflater.eof else "followed by data past its end"
        raise InflateError("bad_gzip", f"message is {what} ({name})")
    return out[0] if len(out) == 1 else b"".join(out)


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` in seconds; None when it is not 1-8 ASCII digits and a unit
    (grpc core ignores such a value, and so does the receiver)."""
    digits, unit = value[:-1], value[-1:]
    if not 1 <= len(digits) <= 8 or not digits.isdigit() or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


def format_timeout(seconds: float) -> str:
    """``grpc-timeout`` for ``seconds``, in milliseconds (capped at 8 digits)."""
    return f"{min(int(seconds * 1000), _MAX_TIMEOUT_DIGITS)}m"
