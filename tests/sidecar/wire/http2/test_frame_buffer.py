"""``ViewFrameBuffer`` against ``h2``'s own ``FrameBuffer`` as the oracle: the same bytes,
cut into reads anywhere, give the same frames (type, stream, flags, body) and the same
errors; DATA bodies that arrived whole come as views of their read; and the gRPC
server's bound on what a call's views keep alive."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from gym_sidecar.wire.http2.frame_buffer import ViewFrameBuffer
from h2.exceptions import FrameTooLargeError, ProtocolError
from h2.frame_buffer import FrameBuffer
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def data_frame(stream_id: int, body: bytes, *, end: bool = False, pad: int | None = None) -> bytes:
    f = DataFrame(stream_id, body)
    if end:
        f.flags.add("END_STREAM")
    if pad is not None:
        f.flags.add("PADDED")
        f.pad_length = pad
    return f.serialize()


def headers_in_pieces(stream_id: int, block: bytes, pieces: int) -> bytes:
    """A header block in one HEADERS frame and ``pieces - 1`` CONTINUATIONs."""
    size = max(1, len(block) // pieces)
    chunks = [block[i : i + size] for i in range(0, len(block), size)] or [b""]
    out = []
    for i, chunk in enumerate(chunks):
        f: HeadersFrame | ContinuationFrame = (
            HeadersFrame(stream_id, chunk) if i == 0 else ContinuationFrame(stream_id, chunk)
        )
        if i == len(chunks) - 1:
            f.flags.add("END_HEADERS")
        out.append(f.serialize())
    return b"".join(out)


frames = st.one_of(
    st.builds(
        data_frame,
        st.integers(1, 99).map(lambda n: 2 * n + 1),
        st.binary(max_size=3000),
        end=st.booleans(),
        pad=st.one_of(st.none(), st.integers(0, 40)),
    ),
    st.builds(
        headers_in_pieces,
        st.integers(1, 99).map(lambda n: 2 * n + 1),
        st.binary(min_size=1, max_size=300),
        st.integers(1, 4),
    ),
    st.builds(lambda d: PingFrame(0, d).serialize(), st.binary(min_size=8, max_size=8)),
    st.builds(lambda n: WindowUpdateFrame(0, n).serialize(), st.integers(1, 2**20)),
    st.builds(lambda: SettingsFrame(0).serialize()),
)


def shape(frame: Frame) -> tuple[Any, ...]:
    body = bytes(frame.data) if isinstance(frame, DataFrame | HeadersFrame) else frame.serialize()
    return (type(frame).__name__, frame.stream_id, sorted(frame.flags), body)


def read_all(buffer: FrameBuffer, stream: bytes, cuts: list[int]) -> list[tuple[Any, ...]] | str:
    """Feed ``stream`` cut at ``cuts``; the frames' shapes, or the error's type name."""
    buffer.max_frame_size = 16384
    out: list[tuple[Any, ...]] = []
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(stream)), len(stream)]
    try:
        for a, b in itertools.pairwise(bounds):
            buffer.add_data(stream[a:b])
            out += [shape(f) for f in buffer]
    except ProtocolError as exc:
        return type(exc).__name__
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(frames, max_size=12),
    st.lists(st.integers(0, 40_000), max_size=8),
    st.booleans(),
)
def test_same_frames_as_h2s_buffer_however_the_reads_are_cut(
    wire: list[bytes], cuts: list[int], server: bool
) -> None:
    stream = (PREFACE if server else b"") + b"".join(wire)
    expected = read_all(FrameBuffer(server=server), stream, cuts)
    assert read_all(ViewFrameBuffer(server=server), stream, cuts) == expected


def test_cut_at_every_byte() -> None:
    stream = b"".join(
        [
            data_frame(1, b"a" * 100),
            headers_in_pieces(3, b"h" * 50, 3),
            data_frame(3, b"b" * 37, end=True, pad=5),
            PingFrame(0, b"12345678").serialize(),
        ]
    )
    expected = read_all(FrameBuffer(), stream, [])
    for cut in range(len(stream) + 1):
        for second in (cut + 1, cut + 9, cut + 120):
            got = read_all(ViewFrameBuffer(), stream, [cut, second])
            assert got == expected, (cut, second)


def test_a_data_body_that_arrived_whole_is_a_view_of_its_read() -> None:
    read = data_frame(1, b"x" * 5000) + data_frame(1, b"y" * 10, pad=3)
    buffer = ViewFrameBuffer()
    buffer.max_frame_size = 16384
    buffer.add_data(read)
    whole, padded = list(buffer)
    assert isinstance(whole.data, memoryview) and whole.data.obj is read
    assert bytes(whole.data) == b"x" * 5000
    assert padded.data == b"y" * 10  # padded: parsed as h2 parses it


def test_a_frame_cut_by_its_read_is_buffered_then_parsed_whole() -> None:
    frame = data_frame(5, b"z" * 3000)
    buffer = ViewFrameBuffer()
    buffer.max_frame_size = 16384
    buffer.add_data(frame[:1000])
    assert list(buffer) == []
    buffer.add_data(frame[1000:] + data_frame(5, b"w" * 2000))
    first, second = list(buffer)
    assert bytes(first.data) == b"z" * 3000 and bytes(second.data) == b"w" * 2000
    assert isinstance(second.data, memoryview)  # the next frame, whole in its read


def test_a_frame_over_the_size_limit_is_refused_as_h2_refuses_it() -> None:
    for buffer_type in (FrameBuffer, ViewFrameBuffer):
        buffer = buffer_type()
        buffer.max_frame_size = 1000
        buffer.add_data(data_frame(1, b"q" * 1001))
        with pytest.raises(FrameTooLargeError):
            list(buffer)


def test_a_call_keeps_views_only_while_their_reads_stay_within_the_bound() -> None:
    from gym_sidecar.core.signals import SPECS
    from gym_sidecar.core.stage import Signal
    from gym_sidecar.wire.http2.grpc_server import PIN_FACTOR, PIN_SLACK_BYTES, _Call, retained

    def receive(call: _Call, data: bytes | memoryview) -> bytes | memoryview:
        kept = retained(call, data)
        call.received += len(kept)
        return kept

    # A body that fills its read is kept as a view, read after read.
    call = _Call(1, SPECS[Signal.TRACES], None)
    for _ in range(20):
        read = bytes(200_000)
        assert isinstance(receive(call, memoryview(read)[9:]), memoryview)
    # One byte per 256 KiB read (the rest of each read another stream's): the first
    # view fits the slack, the following ones are copied, and what the views keep
    # alive stays within the bound.
    call = _Call(3, SPECS[Signal.TRACES], None)
    kinds = []
    for _ in range(50):
        read = bytes(256 * 1024)
        kinds.append(type(receive(call, memoryview(read)[100:101])))
    assert kinds[0] is memoryview and set(kinds[1:]) == {bytes}
    assert call.pinned <= PIN_FACTOR * call.received + PIN_SLACK_BYTES
    # Several bodies of one read count that read once.
    call = _Call(5, SPECS[Signal.TRACES], None)
    read = bytes(256 * 1024)
    views = [receive(call, memoryview(read)[i * 16384 : (i + 1) * 16384]) for i in range(16)]
    assert all(isinstance(v, memoryview) for v in views)
    assert call.pinned == len(read)
