"""The on-disk queue's file format and its blocking I/O (run in worker threads).

A queue directory holds segment files ``<seq>.seg`` (``seq`` a zero-padded, increasing
number) and a ``LOCK`` file. A segment starts with the 8-byte magic ``GYMQSEG1`` and
then holds records, each framed as::

    length  u32 big-endian   payload length in bytes
    crc     u32 big-endian   zlib.crc32 of (signal, items, payload)
    signal  u8               0 traces, 1 metrics, 2 logs
    items   u32 big-endian   spans / data points / log records in the payload
    payload length bytes     one serialized OTLP Export*ServiceRequest

Records are only ever appended. :class:`SegmentWriter` appends groups of records and
fsyncs once per group (policy ``always``) or on demand; a failed write is truncated
away so a segment never holds a half record written by a live process. :func:`scan`
reads a segment back at start and reports valid records and damage: a wrong magic, a
record whose checksum does not match (skipped, the scan goes on after it), and a
truncated tail (the scan stops there). :class:`SegmentReader` reads single records by
offset and checks them again.

Nothing here touches the event loop; every method blocks and is meant for
``asyncio.to_thread``. ``SegmentWriter`` and ``SegmentReader`` are each thread-safe.
"""

from __future__ import annotations

import enum
import fcntl
import os
import struct
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gym_sidecar.core.stage import Signal

MAGIC = b"GYMQSEG1"
HEADER = struct.Struct(">IIBI")
HEADER_BYTES = HEADER.size
SUFFIX = ".seg"
LOCK_NAME = "LOCK"
MAX_RECORD_BYTES = 1 << 31
"""Lengths above this are treated as a damaged header (no real request is this big)."""

SIGNAL_CODES: dict[Signal, int] = {Signal.TRACES: 0, Signal.METRICS: 1, Signal.LOGS: 2}
CODE_SIGNALS: dict[int, Signal] = {v: k for k, v in SIGNAL_CODES.items()}


class Damage(enum.Enum):
    """Kinds of damage a scan or read reports (label values of the corrupt counter)."""

    BAD_MAGIC = "bad_magic"
    """The segment does not start with the magic: the whole file is skipped."""
    CHECKSUM = "checksum"
    """A record's crc32 does not match (or its signal code is unknown): skipped."""
    TRUNCATED = "truncated"
    """The file ends inside a record (a crash mid-write, or a cut file)."""
    UNREADABLE = "unreadable"
    """Reading failed (the file vanished or an I/O error)."""


def segment_path(directory: Path, seq: int) -> Path:
    return directory / f"{seq:020d}{SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """Segment files in ``directory`` by increasing sequence number."""
    out: list[tuple[int, Path]] = []
    for path in directory.iterdir():
        if path.suffix == SUFFIX and path.stem.isdigit():
            out.append((int(path.stem), path))
    out.sort()
    return out


def _crc(signal_code: int, items: int, payload: bytes | memoryview) -> int:
    head = struct.pack(">BI", signal_code, items)
    return zlib.crc32(payload, zlib.crc32(head))


def encode(signal: Signal, items: int, payload: bytes) -> bytes:
    """One framed record."""
    code = SIGNAL_CODES[signal]
    return HEADER.pack(len(payload), _crc(code, items, payload), code, items) + payload


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record was written: segment, offset of its header, payload length."""

    seq: int
    offset: int
    length: int


@dataclass(slots=True)
class ScannedRecord:
    offset: int
    length: int
    signal: Signal
    items: int


@dataclass(slots=True)
class ScanResult:
    """Valid records of one segment, and the damage found (kind, byte offset)."""

    records: list[ScannedRecord] = field(default_factory=list)
    damage: list[tuple[Damage, int]] = field(default_factory=list)


def scan(path: Path, chunk_bytes: int = 1 << 20) -> ScanResult:
    """Read a whole segment, verify every record, report what is usable.

    Reads one record at a time (memory: the largest record). Never raises for bad
    content; an OSError while opening or reading is reported as UNREADABLE.
    """
    result = ScanResult()
    try:
        with path.open("rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                result.damage.append((Damage.BAD_MAGIC, 0))
                return result
            size = os.fstat(f.fileno()).st_size
            offset = len(MAGIC)
            while offset < size:
                head = f.read(HEADER_BYTES)
                if len(head) < HEADER_BYTES:
                    result.damage.append((Damage.TRUNCATED, offset))
                    break
                length, crc, code, items = HEADER.unpack(head)
                end = offset + HEADER_BYTES + length
                if length > MAX_RECORD_BYTES or end > size:
                    # Either the tail was cut or the length field itself is damaged;
                    # framing is lost from here on, so the rest of the file is skipped.
                    result.damage.append((Damage.TRUNCATED, offset))
                    break
                crc_now = zlib.crc32(struct.pack(">BI", code, items))
                remaining = length
                while remaining:
                    chunk = f.read(min(chunk_bytes, remaining))
                    if not chunk:
                        break
                    crc_now = zlib.crc32(chunk, crc_now)
                    remaining -= len(chunk)
                if remaining:
                    result.damage.append((Damage.TRUNCATED, offset))
                    break
                if crc_now != crc or code not in CODE_SIGNALS:
                    result.damage.append((Damage.CHECKSUM, offset))
                else:
                    result.records.append(ScannedRecord(offset, length, CODE_SIGNALS[code], items))
                offset = end
    except OSError:
        result.damage.append((Damage.UNREADABLE, 0))
    return result


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class SegmentWriter:
    """Appends records to the active segment, rolling over past ``segment_max_bytes``."""

    def __init__(self, directory: Path, next_seq: int, segment_max_bytes: int) -> None:
        self.directory = directory
        self.segment_max_bytes = segment_max_bytes
        self._lock = threading.Lock()
        self._next_seq = next_seq
        self._fd: int | None = None
        self._size = 0
        self._dirty = False
        self.active_seq: int | None = None
        """The segment being appended to (None between segments). Read from the loop
        only while no append runs (the queue's writer task serializes them)."""

    def _open_next(self, fsync: bool) -> None:
        seq = self._next_seq
        path = segment_path(self.directory, seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        try:
            _write_all(fd, MAGIC)
            if fsync:
                os.fsync(fd)
                _fsync_dir(self.directory)  # the new file's name must survive too
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._next_seq = seq + 1
        self._fd, self._size, self.active_seq = fd, len(MAGIC), seq

    def _close_active(self) -> None:
        if self._fd is not None:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            os.close(self._fd)
        self._fd, self.active_seq = None, None

    def append(self, records: Sequence[bytes], fsync: bool) -> list[Position]:
        """Write framed records in order; fsync the touched segments if ``fsync``.

        All or nothing: on an OSError (disk full ...) every segment this call created is
        removed and the one it extended is truncated back, then the error is raised, so
        the caller can refuse every record of the group and no half record remains.
        """
        with self._lock:
            positions: list[Position] = []
            start_seq, start_size = self.active_seq, self._size
            created: list[int] = []
            try:
                buf: list[bytes] = []
                for data in records:
                    if self._fd is None or (
                        self._size > len(MAGIC) and self._size + len(data) > self.segment_max_bytes
                    ):
                        self._flush(buf, fsync)
                        buf = []
                        self._close_active()
                        self._open_next(fsync)
                        assert self.active_seq is not None
                        created.append(self.active_seq)
                    assert self.active_seq is not None
                    positions.append(
                        Position(self.active_seq, self._size, len(data) - HEADER_BYTES)
                    )
                    buf.append(data)
                    self._size += len(data)
                self._flush(buf, fsync)
            except OSError:
                self._rollback(start_seq, start_size, created)
                raise
            return positions

    def _flush(self, buf: list[bytes], fsync: bool) -> None:
        if not buf:
            return
        assert self._fd is not None
        _write_all(self._fd, b"".join(buf))
        if fsync:
            os.fsync(self._fd)
        else:
            self._dirty = True

    def _rollback(self, start_seq: int | None, start_size: int, created: list[int]) -> None:
        """Undo a failed append: drop segments it created, cut the one it extended."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self.active_seq = None, None
        for seq in created:
            segment_path(self.directory, seq).unlink(missing_ok=True)
        if start_seq is not None:
            path = segment_path(self.directory, start_seq)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                os.ftruncate(fd, start_size)
            except OSError:
                return  # the next append starts a fresh segment
            self._fd, self._size, self.active_seq = fd, start_size, start_seq

    def sync(self) -> None:
        """fsync the active segment if anything was written since the last fsync."""
        with self._lock:
            if self._fd is not None and self._dirty:
                os.fsync(self._fd)
                self._dirty = False

    def seal(self, seq: int) -> bool:
        """Close the active segment if it is ``seq`` (so it can be deleted); True if so."""
        with self._lock:
            if self.active_seq != seq:
                return False
            self._close_active()
            return True

    def close(self) -> None:
        with self._lock:
            self._close_active()


class SegmentReader:
    """Reads records by position, keeping one descriptor per open segment."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}

    def _fd(self, seq: int) -> int:
        fd = self._fds.get(seq)
        if fd is None:
            fd = os.open(segment_path(self.directory, seq), os.O_RDONLY)
            self._fds[seq] = fd
        return fd

    def read(self, positions: Sequence[Position]) -> list[bytes | Damage]:
        """The payload of each record, or why it cannot be had (checked again)."""
        out: list[bytes | Damage] = []
        with self._lock:
            for pos in positions:
                try:
                    data = os.pread(self._fd(pos.seq), HEADER_BYTES + pos.length, pos.offset)
                except OSError:
                    out.append(Damage.UNREADABLE)
                    continue
                if len(data) < HEADER_BYTES + pos.length:
                    out.append(Damage.TRUNCATED)
                    continue
                length, crc, code, items = HEADER.unpack_from(data)
                payload = data[HEADER_BYTES:]
                if length != pos.length or _crc(code, items, payload) != crc:
                    out.append(Damage.CHECKSUM)
                    continue
                out.append(payload)
        return out

    def forget(self, seq: int) -> None:
        """Close the descriptor of a segment about to be deleted."""
        with self._lock:
            fd = self._fds.pop(seq, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


def lock_directory(directory: Path) -> int:
    """Take the directory's exclusive lock (held by the returned descriptor until it is
    closed, or the process dies); OSError if another process holds it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(f"on-disk queue directory {directory} is in use by another process") from None
    return fd


def delete_segment(directory: Path, seq: int) -> None:
    segment_path(directory, seq).unlink(missing_ok=True)
