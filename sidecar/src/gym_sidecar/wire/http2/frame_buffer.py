"""``h2``'s incoming frame buffer without its copies of DATA bodies.

``h2`` (4.x) reads frames through ``FrameBuffer``: every read is appended to one
``bytearray`` (a copy), each frame is sliced out of it (a second copy, a new
``bytearray``) and hyperframe turns a DATA frame's body into ``bytes`` (a third), before
the receiver joins the bodies into the message (a fourth). Under callgrind these were
three of the five copies of every byte from the socket to the pipeline, ~1,100
instructions per span (docs/benchmarks.md, "Performance round 4"), and each a transient
buffer the size of a message at the sidecar's peak under load.

:class:`ViewFrameBuffer` parses the frames of a read from the read itself: a DATA
frame that arrived whole in one read, unpadded, gets a ``memoryview`` of the read as its
body (no copy), every other frame is parsed as ``h2`` parses it, and only a frame cut
by the end of a read is buffered (and parsed from the buffer once complete, as
before). So the receiver's join is the one copy left. A body's view keeps its read
(at most asyncio's 256 KiB) alive: the receiver bounds what its calls pin that way
(:mod:`.grpc_server`).

It replaces ``H2Connection.incoming_buffer``, which ``receive_data`` feeds
(``add_data``) and iterates; ``h2``'s own checks (frame size, CONTINUATION sequence)
are its methods, reused. ``h2`` has no public hook for this; its version range is
pinned in the sidecar's dependencies, and the tests hold the frames this buffer yields
to those ``h2``'s yields for the same bytes cut at every boundary
(``tests/sidecar/wire/http2/test_frame_buffer.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from h2.exceptions import FrameDataMissingError, ProtocolError
from h2.frame_buffer import FrameBuffer
from hyperframe.exceptions import InvalidDataError, InvalidFrameError
from hyperframe.frame import DataFrame, Frame

if TYPE_CHECKING:
    from h2._typing import Buffer

_HEADER_BYTES = 9


class ViewFrameBuffer(FrameBuffer):
    """``h2``'s ``FrameBuffer`` (same contract), DATA bodies as views of the read they
    arrived in when whole (module doc)."""

    def __init__(self, server: bool = False) -> None:
        super().__init__(server=server)
        self._view: memoryview | None = None
        self._pos = 0

    def add_data(self, data: Buffer) -> None:
        if self._preamble_len:  # a server connection's first bytes: h2's own way
            super().add_data(data)
            return
        view = memoryview(data)
        pending = self._data
        if pending:
            # Complete the frame a previous read cut, from the front of this one; the
            # rest of this read is parsed in place.
            if len(pending) < _HEADER_BYTES:
                take = min(_HEADER_BYTES - len(pending), len(view))
                pending += view[:take]
                view = view[take:]
                if len(pending) < _HEADER_BYTES:
                    return
            need = _HEADER_BYTES + int.from_bytes(pending[:3], "big") - len(pending)
            take = min(need, len(view))
            pending += view[:take]
            view = view[take:]
            if take < need:
                return
        self._view, self._pos = view, 0

    def __next__(self) -> Frame:
        if self._data:  # a frame that arrived in pieces, complete or not: h2's way
            return super().__next__()
        view = self._view
        if view is None:
            raise StopIteration
        pos = self._pos
        left = len(view) - pos
        if left >= _HEADER_BYTES:
            try:
                frame, length = Frame.parse_frame_header(view[pos : pos + _HEADER_BYTES])
            except (InvalidDataError, InvalidFrameError) as err:  # pragma: no cover
                raise ProtocolError(f"Received frame with invalid header: {err!s}") from err
            if left >= _HEADER_BYTES + length:
                self._validate_frame_length(length)
                body = view[pos + _HEADER_BYTES : pos + _HEADER_BYTES + length]
                self._pos = pos + _HEADER_BYTES + length
                if type(frame) is DataFrame and "PADDED" not in frame.flags:
                    frame.data = body  # type: ignore[assignment]  # a view, not bytes
                    frame.body_len = length
                else:
                    try:
                        frame.parse_body(body)
                    except InvalidDataError as err:
                        raise ProtocolError("Received frame with non-compliant data") from err
                    except InvalidFrameError as err:
                        raise FrameDataMissingError("Frame data missing or invalid") from err
                new = self._update_header_buffer(frame)
                return new if new is not None else self.__next__()
        # The rest is a frame this read cut: buffered until the next read completes it.
        self._view = None
        if left:
            self._data += view[pos:]
        raise StopIteration
