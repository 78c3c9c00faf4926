"""The ``h2`` connection both gRPC ends use (the receiver's server connection and the
exporter's client connection).

``h2`` (with ``hyperframe`` for frames and ``hpack`` for headers) carries every gRPC call
the sidecar receives or sends. :class:`H2Connection`, the connection both ends build
with :meth:`H2Connection.for_grpc`, changes four of its behaviours, and
:func:`quiet_frame_reprs` a fifth:

- **GOAWAY**: ``h2`` moves the whole connection to CLOSED when it receives a GOAWAY and
  then refuses every frame (python-hyper/h2#1181, open), although streams up to the
  GOAWAY's last stream id may still complete (RFC 9113, 6.8: that is how a server
  drains). An exporter then lost the answers to the calls a draining backend was still
  serving (the next frame raised ProtocolError: the calls failed as INTERNAL, a
  permanent error, and their data was dropped), and the receiver could not answer the
  calls of a client that said GOAWAY first. Here a GOAWAY only becomes the
  ``ConnectionTerminated`` event: the connection stays open for the streams already
  there, and the owner opens no new one (both do so once they see the event).
- **closed streams**: ``h2`` remembers how each closed stream ended, in an OrderedDict
  of up to 65,536 entries, to tell a late frame on a reset stream from a protocol
  error. A stream is one call and a connection lives for days: ~7 MiB per connection
  once full. :data:`MAX_CLOSED_STREAMS` (frames on a stream 1,024 calls old do not
  happen).
- **the DATA path**: ``h2`` copies a DATA frame's body six times on its way out
  (``tobytes``, the body's join, the frame's join, the join of the frames, its output
  buffer, ``data_to_send``), in frames of the peer's SETTINGS_MAX_FRAME_SIZE. Here
  :meth:`H2Connection.send_data_unsplit` lets ``h2`` account for (flow control, stream
  state) as much of a body as the windows allow in one DATA frame, and every frame
  ``h2`` emits passes through ``_prepare_for_sending``, which cuts such a frame into
  frames of the peer's size itself: a 9-byte header and a memoryview of the body per
  frame. :meth:`H2Connection.take` hands over what to write, in order. ``h2`` has no
  public way to do this: ``data_to_send`` returns one flat buffer by design
  (python-hyper/h2#236, open since 2016), so the override of its private
  ``_prepare_for_sending`` stays, with ``h2``'s version range pinned in the sidecar's
  dependencies and the path exercised by the tests; the cost of the public path is in
  the wire package's README.
- **the incoming DATA path**: ``h2``'s frame buffer copies every received byte three
  times before the body reaches the owner; :class:`~.frame_buffer.ViewFrameBuffer`
  (its ``incoming_buffer`` here) hands a DATA body that arrived whole in one read over
  as a view of that read, so a DATA event's ``data`` may be a ``memoryview``.
- **frame reprs**: ``h2`` evaluates ``repr(frame)`` for its trace log on every frame it
  receives, whatever the logger (the argument is built before the call), and
  hyperframe's reprs hex-encode frame bodies (a DATA frame's whole body, a header
  block, an unknown frame's payload) to show 20 characters of them: 22 % of the
  sidecar's instructions per span under callgrind (docs/benchmarks.md).

Depends on ``h2`` and ``hyperframe`` only (and :mod:`.frame_buffer`, on them).
"""

from __future__ import annotations

import struct

import h2.config
import h2.connection
import h2.errors
import h2.events
from hyperframe.frame import DataFrame, Frame, GoAwayFrame

from gym_sidecar.wire.http2.frame_buffer import ViewFrameBuffer

MAX_CLOSED_STREAMS = 1024
"""Closed streams ``h2`` remembers per connection (its default: 65,536)."""

DIRECT_BYTES = 4096
"""DATA frames at least this long go out as a header and a memoryview of the body."""

_ANY_FRAME_SIZE = 2**31 - 1
_END_STREAM = 0x1
_DATA_HEADER = struct.Struct(">BHBBL")


class H2Connection(h2.connection.H2Connection):
    """``h2``'s connection with the closed-streams bound, a GOAWAY that lets the streams
    it spares finish and a copy-free DATA path (module doc). The owner must not open a
    stream after the ``ConnectionTerminated`` event, and writes what :meth:`take`
    returns (``data_to_send`` would miss the DATA bodies)."""

    MAX_CLOSED_STREAMS = MAX_CLOSED_STREAMS

    def __init__(self, config: h2.config.H2Configuration) -> None:
        self.frame_limit = 16384
        self._unsplit = False
        self._out: list[bytes | memoryview] = []
        self._small = bytearray()
        super().__init__(config=config)
        self.incoming_buffer = ViewFrameBuffer(server=not config.client_side)

    @classmethod
    def for_grpc(cls, *, client_side: bool) -> H2Connection:
        """A connection as gRPC uses it: header names and values as bytes, and neither
        validated nor normalised on the way out (both ends send headers they built)."""
        config = h2.config.H2Configuration(
            client_side=client_side,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        return cls(config)

    # -- GOAWAY -----------------------------------------------------------------------------
    def _receive_goaway_frame(
        self, frame: GoAwayFrame
    ) -> tuple[list[Frame], list[h2.events.Event]]:
        # h2's own moves the state machine to CLOSED and drops the unsent output; here
        # neither happens (module doc). Same event as h2's.
        event = h2.events.ConnectionTerminated()
        try:
            event.error_code = h2.errors.ErrorCodes(frame.error_code)
        except ValueError:
            event.error_code = frame.error_code
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]

    # -- the DATA path ----------------------------------------------------------------------
    @property
    def max_outbound_frame_size(self) -> int:
        return _ANY_FRAME_SIZE if self._unsplit else self.frame_limit

    @max_outbound_frame_size.setter
    def max_outbound_frame_size(self, value: int) -> None:
        self.frame_limit = value  # h2 sets it from the peer's SETTINGS

    def send_data_unsplit(
        self, stream_id: int, data: bytes | memoryview, *, end_stream: bool
    ) -> None:
        """``send_data`` of ``data`` in one call however long it is (at most the flow
        control windows); it leaves in frames of the peer's size, uncopied when long."""
        self._unsplit = True
        try:
            self.send_data(stream_id, data, end_stream=end_stream)
        finally:
            self._unsplit = False

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        for frame in frames:
            if (
                isinstance(frame, DataFrame)
                and len(frame.data) >= DIRECT_BYTES
                and "PADDED" not in frame.flags
            ):
                self._direct(frame)
            else:
                self._small += frame.serialize()

    def _direct(self, frame: DataFrame) -> None:
        body = memoryview(frame.data)
        size, limit = len(body), self.frame_limit
        end = _END_STREAM if "END_STREAM" in frame.flags else 0
        for start in range(0, size, limit):
            chunk = body[start : start + limit]
            flags = end if start + limit >= size else 0
            self._small += _DATA_HEADER.pack(
                len(chunk) >> 16, len(chunk) & 0xFFFF, 0, flags, frame.stream_id
            )
            self._out.append(bytes(self._small))
            self._small.clear()
            self._out.append(chunk)

    def write_raw(self, data: bytes) -> None:
        """Queue bytes ``h2`` did not produce (a frame written past it), after what it
        has queued so far."""
        self._small += data

    def take(self) -> list[bytes | memoryview]:
        """Everything to write, in order (``h2``'s own buffer holds only the preface)."""
        out = self._out
        if self._data_to_send:
            out.insert(0, bytes(self._data_to_send))
            self._data_to_send.clear()
        if self._small:
            out.append(bytes(self._small))
            self._small.clear()
        self._out = []
        return out


def _frame_repr(frame: Frame) -> str:
    return f"<{type(frame).__name__} stream {frame.stream_id}>"


def quiet_frame_reprs() -> None:
    """Make ``repr`` of every hyperframe frame constant-time: its type and stream id.

    Process-wide (hyperframe's ``Frame.__repr__`` is replaced) and idempotent. Nothing in
    the sidecar reads these reprs; ``Frame.explain`` and the frames' fields still show
    everything to whoever debugs.
    """
    Frame.__repr__ = _frame_repr  # type: ignore[method-assign]
