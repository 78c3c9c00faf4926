"""The HTTP/2 abuse bounds of the gRPC receiver, checked on frame headers before ``h2``.

``h2`` is a correct HTTP/2 state machine but bounds nothing about how a peer uses it: it
answers every PING and SETTINGS frame, accepts any number of streams opened and reset at
once, and buffers a header block of up to 64 CONTINUATION frames of the maximum frame
size. grpc core bounded some of this itself; the sidecar's receiver does it here, on
the 9-byte frame headers of the incoming byte stream, before ``h2`` parses a frame (so a
flood costs a few Python steps per frame, not ``h2``'s work and an answer):

- **frame size**: a frame header announcing more than ``max_frame_bytes`` (the
  receiver's SETTINGS_MAX_FRAME_SIZE) is ``frame_too_large`` at once, a connection
  error FRAME_SIZE_ERROR as RFC 9113, 4.2 says (``h2`` checks only once the whole frame
  is buffered, so 16 MiB could be held per connection first);
- **control frames**: HEADERS, SETTINGS, PING, PRIORITY, RST_STREAM, WINDOW_UPDATE,
  GOAWAY, PUSH_PROMISE, frames of unknown types and DATA frames under
  :attr:`ControlBudget.small_data_bytes` without END_STREAM take a token each from a
  per-connection bucket holding :attr:`ControlBudget.burst` tokens, refilled at
  :attr:`~ControlBudget.per_s` per second and by :attr:`~ControlBudget.per_call` for
  every call answered from the pipeline. An
  empty bucket is :class:`Abuse` ``control_frame_flood``: SETTINGS/PING floods, rapid
  reset (HEADERS then RST_STREAM, CVE-2023-44487), streams opened and never finished,
  WINDOW_UPDATE, PRIORITY or tiny-DATA floods. A well-behaved client spends a few per
  call (its HEADERS, WINDOW_UPDATEs, the BDP PING of grpc core) and sends keepalive
  PINGs seconds apart at most;
- **header blocks**: a HEADERS frame and its CONTINUATIONs may carry at most
  ``max_header_block_bytes`` (compressed; the receiver passes 4 x
  ``limits.http_max_header_bytes``); more is ``header_block_too_large`` (the
  CONTINUATION flood), naming the block's stream so that the call can be answered
  before the connection closes. A block left open is timed by the receiver
  (:attr:`FrameGuard.in_header_block`).

Every :class:`Abuse` but ``frame_too_large`` is a connection error ENHANCE_YOUR_CALM
(RFC 9113, 10.5: what an endpoint says to a peer that abuses it).

Everything else about framing (lengths over SETTINGS_MAX_FRAME_SIZE, bad preface,
frames out of sequence, HPACK errors) is ``h2``'s to refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA = 0x0
HEADERS = 0x1
CONTINUATION = 0x9
END_STREAM = 0x1
END_HEADERS = 0x4
FRAME_SIZE_ERROR = 0x6
ENHANCE_YOUR_CALM = 0xB


@dataclass(frozen=True, slots=True)
class ControlBudget:
    """The control-frame bucket of one connection (module doc); the defaults are the
    receiver's."""

    burst: float = 256.0
    """Control frames a connection may send at once (the bucket's size)."""
    per_s: float = 10.0
    """Control frames per second a connection may send in the long run without calls."""
    per_call: float = 8.0
    """Control frames each call answered from the pipeline adds to the allowance."""
    small_data_bytes: int = 1024
    """DATA frames shorter than this, without END_STREAM, count as control frames."""


class Abuse(Exception):
    """The peer broke one of the bounds in the module doc; ``reason`` names which,
    ``error_code`` is the HTTP/2 error code of the GOAWAY it calls for, ``stream_id``
    the stream of the header block that broke its bound (0 for other reasons)."""

    def __init__(
        self,
        reason: str,
        message: str,
        error_code: int = ENHANCE_YOUR_CALM,
        stream_id: int = 0,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.error_code = error_code
        self.stream_id = stream_id


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
        "budget",
        "max_frame_bytes",
        "max_header_block_bytes",
    )

    def __init__(
        self,
        max_header_block_bytes: int,
        max_frame_bytes: int,
        now: float,
        budget: ControlBudget | None = None,
    ) -> None:
        self.max_header_block_bytes = max_header_block_bytes
        self.max_frame_bytes = max_frame_bytes
        self.budget = budget or ControlBudget()
        self._skip = len(PREFACE)  # the preface is h2's to check; frames start after it
        self._head = b""
        self._block = -1  # bytes of the open header block; -1: none open
        self._tokens = self.budget.burst
        self._at = now

    @property
    def in_header_block(self) -> bool:
        """A HEADERS frame arrived whose block has not ended yet."""
        return self._block >= 0

    def call_answered(self) -> None:
        self._tokens = min(self.budget.burst, self._tokens + self.budget.per_call)

    def feed(self, data: bytes, now: float) -> None:
        """Account for ``data``; raises :class:`Abuse` when a bound is broken."""
        budget = self.budget
        self._tokens = min(budget.burst, self._tokens + (now - self._at) * budget.per_s)
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
            stream_id = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
            self._frame(header[3], header[4], length, stream_id)
            self._skip = length

    def _frame(self, kind: int, flags: int, length: int, stream_id: int) -> None:
        if length > self.max_frame_bytes:
            raise Abuse("frame_too_large", f"frame of {length} bytes announced", FRAME_SIZE_ERROR)
        if kind in (HEADERS, CONTINUATION):
            self._block = (0 if kind == HEADERS else max(self._block, 0)) + length
            if self._block > self.max_header_block_bytes:
                raise Abuse(
                    "header_block_too_large",
                    f"header block over {self.max_header_block_bytes} bytes",
                    stream_id=stream_id,
                )
            if flags & END_HEADERS:
                self._block = -1
            if kind == CONTINUATION:
                return
        elif kind == DATA and (length >= self.budget.small_data_bytes or flags & END_STREAM):
            return
        self._tokens -= 1.0
        if self._tokens < 0:
            raise Abuse("control_frame_flood", "too many control frames")


@dataclass(frozen=True, slots=True)
class Http2Bounds:
    """The receiver's fixed HTTP/2 settings and bounds (not configuration: they protect
    the process whatever the limits; a refusal by one is ``http2_refusals{reason}``)."""

    window_bytes: int = 4 * 1024 * 1024
    """Initial stream and connection flow-control windows advertised (what grpc core
    advertises): a batch of spans arrives without waiting for a WINDOW_UPDATE. Data is
    acknowledged as soon as a call has taken it (or it was for no call), so this bounds
    nothing; the message limits bound what a call buffers."""
    max_frame_bytes: int = 1024 * 1024
    """SETTINGS_MAX_FRAME_SIZE: clients send a message in few large DATA frames rather
    than 16 KiB ones (fewer frames and events per message). A frame header announcing
    more is ``frame_too_large`` at once, before its body is buffered; so it also bounds
    the one partial frame ``h2`` buffers per connection."""
    hpack_factor: int = 4
    """A header block may be this many times ``limits.http_max_header_bytes``, on the
    wire (else ``header_block_too_large``) and decoded (else ``header_list_too_large``:
    an HPACK bomb); between the limit and this, the call is answered
    RESOURCE_EXHAUSTED and the connection kept."""
    max_write_buffer: int = 1024 * 1024
    """Bytes waiting to be written to a client that does not read, beyond which the
    connection is closed (``not_reading``)."""
    control: ControlBudget = field(default_factory=ControlBudget)
    """The control-frame budget (``control_frame_flood``; the module doc)."""
