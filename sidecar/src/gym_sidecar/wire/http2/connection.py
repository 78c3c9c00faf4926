"""The ``h2`` library as both gRPC ends use it (the receiver and the exporter).

``h2`` (with ``hyperframe`` for frames and ``hpack`` for headers) carries every gRPC call
the sidecar receives or sends. :class:`H2Connection`, the connection both ends subclass,
changes two of its behaviours, and :func:`quiet_frame_reprs` a third:

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
- **frame reprs**: ``h2`` evaluates ``repr(frame)`` for its trace log on every frame it
  receives, whatever the logger (the argument is built before the call), and
  hyperframe's reprs hex-encode frame bodies (a DATA frame's whole body, a header
  block, an unknown frame's payload) to show 20 characters of them: 22 % of the
  sidecar's instructions per span under callgrind (docs/benchmarks.md).

Depends on ``h2`` and ``hyperframe`` only; a leaf of the sidecar's layers.
"""

from __future__ import annotations

import h2.connection
import h2.errors
import h2.events
from hyperframe.frame import Frame, GoAwayFrame

MAX_CLOSED_STREAMS = 1024
"""Closed streams ``h2`` remembers per connection (its default: 65,536)."""


class H2Connection(h2.connection.H2Connection):
    """``h2``'s connection with the closed-streams bound and a GOAWAY that lets the
    streams it spares finish (module doc). The owner must not open a stream after the
    ``ConnectionTerminated`` event."""

    MAX_CLOSED_STREAMS = MAX_CLOSED_STREAMS

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


def _frame_repr(frame: Frame) -> str:
    return f"<{type(frame).__name__} stream {frame.stream_id}>"


def quiet_frame_reprs() -> None:
    """Make ``repr`` of every hyperframe frame constant-time: its type and stream id.

    Process-wide (hyperframe's ``Frame.__repr__`` is replaced) and idempotent. Nothing in
    the sidecar reads these reprs; ``Frame.explain`` and the frames' fields still show
    everything to whoever debugs.
    """
    Frame.__repr__ = _frame_repr  # type: ignore[method-assign]
