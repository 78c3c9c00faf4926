"""wire.deflate: which library deflates and inflates, standard gzip from each, the
fallbacks when a library cannot be imported, and broken streams raising what the
receivers catch."""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Iterator

import pytest
from gym_sidecar.wire import deflate

PAYLOAD = b"".join(b"span %d of rollout %d; " % (i, i % 7) for i in range(4000))


@pytest.fixture
def fresh_imports() -> Iterator[None]:
    """The libraries chosen again on first use, before and after the test."""
    deflate._isal.cache_clear()
    deflate._zlib_ng.cache_clear()
    yield
    deflate._isal.cache_clear()
    deflate._zlib_ng.cache_clear()


def compress(level: int, data: bytes = PAYLOAD) -> bytes:
    deflater = deflate.gzip_compressor(level)
    return deflater.compress(data) + deflater.flush()


def test_isal_deflates_levels_1_to_3_and_zlib_ng_the_rest_and_inflates() -> None:
    # Both are dependencies of the sidecar with wheels for 3.11-3.13 on this platform.
    assert [deflate.deflate_library(level) for level in range(1, 10)] == ["isal"] * 3 + [
        "zlib-ng"
    ] * 6
    assert deflate.inflate_library() == "zlib-ng"


@pytest.mark.parametrize("level", range(1, 10))
def test_every_level_writes_one_standard_gzip_member(level: int) -> None:
    body = compress(level)
    assert body[:2] == b"\x1f\x8b"
    assert gzip.decompress(body) == PAYLOAD
    assert len(body) < len(PAYLOAD) // 4


@pytest.mark.parametrize("wbits", [deflate.GZIP_WBITS, deflate.DEFLATE_WBITS])
def test_the_inflater_reads_what_zlib_writes_within_max_length(wbits: int) -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    packed = packer.compress(PAYLOAD) + packer.flush()
    inflater = deflate.inflater(wbits)
    head = inflater.decompress(packed, 1000)
    assert head == PAYLOAD[:1000] and inflater.unconsumed_tail and not inflater.eof
    rest = inflater.decompress(inflater.unconsumed_tail)
    assert head + rest == PAYLOAD and inflater.eof and inflater.unused_data == b""


def test_a_broken_stream_raises_one_of_the_inflate_errors() -> None:
    body = bytearray(compress(6))
    body[20:40] = b"\xff" * 20
    with pytest.raises(deflate.inflate_errors()):
        deflate.inflater(deflate.GZIP_WBITS).decompress(bytes(body))


@pytest.mark.usefixtures("fresh_imports")
def test_without_isal_low_levels_fall_back_to_zlib_ng_and_warn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "isal", None)  # import fails
    with caplog.at_level("WARNING", logger=deflate.__name__):
        assert deflate.deflate_library(2) == "zlib-ng"
    assert "isal is not importable" in caplog.text
    assert gzip.decompress(compress(2)) == PAYLOAD


@pytest.mark.usefixtures("fresh_imports")
def test_without_zlib_ng_everything_falls_back_to_zlib_and_warns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "isal", None)
    monkeypatch.setitem(sys.modules, "zlib_ng", None)
    with caplog.at_level("WARNING", logger=deflate.__name__):
        assert [deflate.deflate_library(1), deflate.deflate_library(5)] == ["zlib", "zlib"]
        assert deflate.inflate_library() == "zlib"
    assert "zlib-ng is not importable" in caplog.text
    for level in (1, 5):
        assert gzip.decompress(compress(level)) == PAYLOAD
    inflater = deflate.inflater(deflate.GZIP_WBITS)
    assert inflater.decompress(gzip.compress(PAYLOAD)) == PAYLOAD
    with pytest.raises(deflate.inflate_errors()):
        deflate.inflater(deflate.GZIP_WBITS).decompress(b"\x1f\x8b\x08\x00" + b"\xff" * 40)
