"""The HTTP/2 abuse bounds of the gRPC receiver, checked on frame headers before ``h2``.

``h2`` is a correct HTTP/2 state machine but bounds nothing about how a peer uses it: it
answers every PING and SETTINGS frame, accepts any number of streams opened and reset at
once, and buffers a header block of up to 64 CONTINUATION frames of the maximum frame
size. grpc core bounded some of this itself; the sidecar's receiver does it here, on
the 9-byte frame headers of the incoming byte stream, before ``h2`` parses a frame (so a
flood costs a few Python steps per frame, not ``h2``'s work and an answer):

- **frame size**: a frame header announcing more than ``max_frame_bytes`` (the
  receiver's SETTINGS_MAX_FRAME_SIZE) is ``frame_too_large`` at once (``h2`` checks only
  once the whole frame is buffered, so 16 MiB could be held per connection first);
- **control frames**: HEADERS, SETTINGS, PING, PRIORITY, RST_STREAM, WINDOW_UPDATE,
  GOAWAY, PUSH_PROMISE, frames of unknown types and DATA frames under
  :data:`SMALL_DATA_BYTES` without END_STREAM take a token each from a per-connection
  bucket holding :data:`CONTROL_BURST` tokens, refilled at :data:`CONTROL_PER_S` per
  second and by :data:`CONTROL_PER_CALL` for every call answered from the pipeline. An
  empty bucket is :class:`Abuse` ``control_frame_flood``: SETTINGS/PING floods, rapid
  reset (HEADERS then RST_STREAM, CVE-2023-44487), streams opened and never finished,
  WINDOW_UPDATE, PRIORITY or tiny-DATA floods. A well-behaved client spends a few per
  call (its HEADERS, WINDOW_UPDATEs, the BDP PING of grpc core) and sends keepalive
  PINGs seconds apart at most;
- **header blocks**: a HEADERS frame and its CONTINUATIONs may carry at most
  ``max_header_block_bytes`` (compressed; the receiver passes 4 x
  ``limits.http_max_header_bytes``); more is ``header_block_too_large`` (the
  CONTINUATION flood). A block left open is timed by the receiver
  (:attr:`FrameGuard.in_header_block`).

Everything else about framing (lengths over SETTINGS_MAX_FRAME_SIZE, bad preface,
frames out of sequence, HPACK errors) is ``h2``'s to refuse.
"""

from __future__ import annotations

from hyperframe.frame import DataFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA = 0x0
HEADERS = 0x1
CONTINUATION = 0x9
END_STREAM = 0x1
END_HEADERS = 0x4

CONTROL_BURST = 256.0
"""Control frames a connection may send at once (the bucket's size)."""
CONTROL_PER_S = 10.0
"""Control frames per second a connection may send in the long run without calls."""
CONTROL_PER_CALL = 8.0
"""Control frames each call answered from the pipeline adds to the allowance."""
SMALL_DATA_BYTES = 1024
"""DATA frames shorter than this, without END_STREAM, count as control frames."""


class Abuse(Exception):
    """The peer broke one of the bounds in the module doc; ``reason`` names which."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class FrameGuard:
    """Walks the frame headers of one connection's incoming bytes (module doc).

    Feed it every chunk read from the socket, in order, before ``h2`` sees it. Not
    thread-safe; one per connection.
    """

    __slots__ = (
        "_at",
        "_block",
        "_head",
        "_skip",
        "_tokens",
        "max_frame_bytes",
        "max_header_block_bytes",
    )

    def __init__(self, max_header_block_bytes: int, max_frame_bytes: int, now: float) -> None:
        self.max_header_block_bytes = max_header_block_bytes
        self.max_frame_bytes = max_frame_bytes
        self._skip = len(PREFACE)  # the preface is h2's to check; frames start after it
        self._head = b""
        self._block = -1  # bytes of the open header block; -1: none open
        self._tokens = CONTROL_BURST
        self._at = now

    @property
    def in_header_block(self) -> bool:
        """A HEADERS frame arrived whose block has not ended yet."""
        return self._block >= 0

    def call_answered(self) -> None:
        self._tokens = min(CONTROL_BURST, self._tokens + CONTROL_PER_CALL)

    def feed(self, data: bytes, now: float) -> None:
        """Account for ``data``; raises :class:`Abuse` when a bound is broken."""
        self._tokens = min(CONTROL_BURST, self._tokens + (now - self._at) * CONTROL_PER_S)
        self._at = now
        pos, size = 0, len(data)
        while True:
            if self._skip:
                step = min(self._skip, size - pos)
                pos += step
                self._skip -= step
                if self._skip:
                    return
            if self._head:
                need = 9 - len(self._head)
                self._head += data[pos : pos + need]
                pos += need
                if len(self._head) < 9:
                    return
                header, self._head = self._head, b""
            elif size - pos >= 9:
                header = data[pos : pos + 9]
                pos += 9
            else:
                self._head = data[pos:]
                return
            length = int.from_bytes(header[:3], "big")
            self._frame(header[3], header[4], length)
            self._skip = length

    def _frame(self, kind: int, flags: int, length: int) -> None:
        if length > self.max_frame_bytes:
            raise Abuse("frame_too_large", f"frame of {length} bytes announced")
        if kind in (HEADERS, CONTINUATION):
            self._block = (0 if kind == HEADERS else max(self._block, 0)) + length
            if self._block > self.max_header_block_bytes:
                raise Abuse(
                    "header_block_too_large",
                    f"header block over {self.max_header_block_bytes} bytes",
                )
            if flags & END_HEADERS:
                self._block = -1
            if kind == CONTINUATION:
                return
        elif kind == DATA and (length >= SMALL_DATA_BYTES or flags & END_STREAM):
            return
        self._tokens -= 1.0
        if self._tokens < 0:
            raise Abuse("control_frame_flood", "too many control frames")


def _short_data_repr(frame: DataFrame) -> str:
    return f"<{len(frame.data)} bytes of data>"


def quiet_data_frame_repr() -> None:
    """Make ``repr`` of a hyperframe DATA frame constant-time (process-wide, idempotent).

    ``h2`` builds ``repr(frame)`` for its trace log on every frame it receives, whatever
    the logger (the argument is evaluated before the call), and hyperframe's repr of a
    DATA frame copies and hex-encodes its whole body to show 20 characters of it: 22 %
    of the sidecar's instructions per span under callgrind (docs/benchmarks.md). The
    repr then shows the body's length instead.
    """
    DataFrame._body_repr = _short_data_repr  # type: ignore[method-assign,assignment]
