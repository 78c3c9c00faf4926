"""What both gRPC ends (the receiver and the exporter) change about the ``h2`` library.

``h2`` (with ``hyperframe`` for frames and ``hpack`` for headers) carries every gRPC call
the sidecar receives or sends. Two of its defaults cost the sidecar for nothing:

- :func:`quiet_frame_reprs`: ``h2`` evaluates ``repr(frame)`` for its trace log on every
  frame it receives, whatever the logger (the argument is built before the call), and
  hyperframe's reprs hex-encode frame bodies (a DATA frame's whole body, a header
  block, an unknown frame's payload) to show 20 characters of them. That was 22 % of the
  sidecar's instructions per span under callgrind (docs/benchmarks.md). After the call,
  every frame's repr is its type and stream id, in constant time.
- :data:`MAX_CLOSED_STREAMS`: ``h2`` remembers how each closed stream of a connection
  ended, in an OrderedDict of up to 65,536 entries, to tell a late frame on a reset
  stream from a protocol error. A stream is one call and a connection lives for days:
  ~7 MiB per connection once full. Frames on a stream 1,024 calls old do not happen.

Standard library and hyperframe only; a leaf of the sidecar's layers.
"""

from __future__ import annotations

from hyperframe.frame import Frame

MAX_CLOSED_STREAMS = 1024
"""Closed streams ``h2`` remembers per connection (its default: 65,536)."""


def _frame_repr(frame: Frame) -> str:
    return f"<{type(frame).__name__} stream {frame.stream_id}>"


def quiet_frame_reprs() -> None:
    """Make ``repr`` of every hyperframe frame constant-time: its type and stream id.

    Process-wide (hyperframe's ``Frame.__repr__`` is replaced) and idempotent. Nothing in
    the sidecar reads these reprs; ``Frame.explain`` and the frames' fields still show
    everything to whoever debugs.
    """
    Frame.__repr__ = _frame_repr  # type: ignore[method-assign]
