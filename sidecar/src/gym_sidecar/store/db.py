"""The SQLite file: schema, connection settings, inserts and retention.

One writer (the store's thread) and any number of readers (the inspection commands,
other processes): WAL mode lets readers see committed data while the writer writes.

Tables (ids only grow: ``AUTOINCREMENT``, so retention deletes id ranges):

- ``batches``: each trace export request as received (OTLP protobuf bytes: spans with
  their resource, scope and attributes), when it was stored and how many spans it held;
- ``traces``: per (trace id, batch) the spans of that trace in the batch and their
  services -- how a trace's batches are found and its spans counted;
- ``gym_spans``: the ``gym.rollout`` / ``gym.verify`` spans (and any other span of those
  scopes) as columns, with attributes as JSON;
- ``metric_points``: the ``gym.*`` points, values as JSON.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gym_sidecar.store.rows import PointRow, TraceRows

SCHEMA_VERSION: Final = 3
CACHE_KIB: Final = 32 * 1024
"""Page cache of the writer's connection (SQLite's default is 2 MiB)."""

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stored_ns INTEGER NOT NULL,
    spans INTEGER NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_stored ON batches (stored_ns);
CREATE TABLE IF NOT EXISTS traces (
    trace_id BLOB NOT NULL,
    batch_id INTEGER NOT NULL,
    spans INTEGER NOT NULL,
    services TEXT NOT NULL,
    PRIMARY KEY (trace_id, batch_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS traces_batch ON traces (batch_id);
CREATE TABLE IF NOT EXISTS gym_spans (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id INTEGER NOT NULL,
    trace_id BLOB NOT NULL,
    span_id BLOB NOT NULL,
    parent_span_id BLOB,
    name TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL,
    status_message TEXT NOT NULL,
    service TEXT NOT NULL,
    rollout_id TEXT,
    attributes TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS gym_spans_name_start ON gym_spans (name, start_ns);
CREATE INDEX IF NOT EXISTS gym_spans_trace ON gym_spans (trace_id);
CREATE INDEX IF NOT EXISTS gym_spans_rollout ON gym_spans (rollout_id)
    WHERE rollout_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS gym_spans_batch ON gym_spans (batch_id);
CREATE TABLE IF NOT EXISTS metric_points (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stored_ns INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    service TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    time_ns INTEGER NOT NULL,
    attributes TEXT NOT NULL,
    value TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS points_name_time ON metric_points (name, time_ns);
CREATE INDEX IF NOT EXISTS points_stored ON metric_points (stored_ns);
"""

_INSERT_GYM_SPAN: Final = (
    "INSERT INTO gym_spans (batch_id, trace_id, span_id, parent_span_id, name, start_ns, "
    "end_ns, status_code, status_message, service, rollout_id, attributes) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_POINT: Final = (
    "INSERT INTO metric_points (stored_ns, name, kind, service, start_ns, time_ns, "
    "attributes, value) VALUES (?,?,?,?,?,?,?,?)"
)


class StoreVersionError(Exception):
    """The file holds another version of the store's schema."""


def connect(path: Path, *, readonly: bool = False, timeout_s: float = 10.0) -> sqlite3.Connection:
    """Open (and for writers create) the store at ``path``.

    Readers open ``mode=ro`` and raise ``FileNotFoundError`` when the file is missing.
    Raises :class:`StoreVersionError` for a file of another schema version. One
    connection belongs to one thread (``check_same_thread`` stays on).
    """
    if readonly:
        if not path.exists():
            raise FileNotFoundError(f"no local store at {path}")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s)
        conn.row_factory = sqlite3.Row
        _check_version(conn, path, readonly=True)
        return conn
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL: a commit survives a process crash; only a power loss can lose the
    # last transactions, never corrupt the file.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    _check_version(conn, path, readonly=False)
    conn.executescript(_SCHEMA)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    conn.row_factory = sqlite3.Row
    return conn


def _check_version(conn: sqlite3.Connection, path: Path, *, readonly: bool) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == SCHEMA_VERSION or (version == 0 and not readonly):
        return
    conn.close()
    raise StoreVersionError(
        f"{path}: schema version {version}, this gym-sidecar reads {SCHEMA_VERSION}; "
        "move the file away (or delete it) to start a new store"
    )


def insert(
    conn: sqlite3.Connection,
    traces: Sequence[tuple[bytes, TraceRows]],
    points: Sequence[PointRow],
    stored_ns: int,
) -> None:
    """Insert trace requests (payload, index rows) and points in one transaction."""
    conn.execute("BEGIN")
    try:
        for payload, rows in traces:
            cur = conn.execute(
                "INSERT INTO batches (stored_ns, spans, payload) VALUES (?,?,?)",
                (stored_ns, rows.spans, payload),
            )
            batch_id = cur.lastrowid
            conn.executemany(
                "INSERT INTO traces VALUES (?,?,?,?)",
                [(t, batch_id, n, services) for t, n, services in rows.traces],
            )
            if rows.gym_spans:
                conn.executemany(_INSERT_GYM_SPAN, [(batch_id, *row) for row in rows.gym_spans])
        if points:
            conn.executemany(_INSERT_POINT, [(stored_ns, *row) for row in points])
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes of the pages in use (file size minus free pages; WAL not included)."""
    pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return (pages - free) * size


def _delete(
    conn: sqlite3.Connection, last_batch: int | None, last_point: int | None
) -> tuple[int, int]:
    """Delete batches (with their index rows) and points up to the given ids.

    Returns (spans, points) deleted.
    """
    conn.execute("BEGIN")
    try:
        spans = points = 0
        if last_batch is not None:
            spans = int(
                conn.execute(
                    "SELECT coalesce(sum(spans), 0) FROM batches WHERE id <= ?", (last_batch,)
                ).fetchone()[0]
            )
            conn.execute("DELETE FROM batches WHERE id <= ?", (last_batch,))
            conn.execute("DELETE FROM traces WHERE batch_id <= ?", (last_batch,))
            conn.execute("DELETE FROM gym_spans WHERE batch_id <= ?", (last_batch,))
        if last_point is not None:
            points = conn.execute("DELETE FROM metric_points WHERE id <= ?", (last_point,)).rowcount
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return spans, points


def prune_age(conn: sqlite3.Connection, cutoff_ns: int) -> tuple[int, int]:
    """Delete what was stored before ``cutoff_ns``; returns (spans, points) deleted."""
    batch = conn.execute("SELECT max(id) FROM batches WHERE stored_ns < ?", (cutoff_ns,))
    point = conn.execute("SELECT max(id) FROM metric_points WHERE stored_ns < ?", (cutoff_ns,))
    last_batch, last_point = batch.fetchone()[0], point.fetchone()[0]
    if last_batch is None and last_point is None:
        return 0, 0
    return _delete(conn, last_batch, last_point)


def prune_size(conn: sqlite3.Connection, max_bytes: int, headroom: float = 0.1) -> tuple[int, int]:
    """While the used pages exceed ``max_bytes``, delete the oldest batches and points.

    Each round deletes the oldest fraction of batches and of points the excess calls for
    plus ``headroom`` (so the next writes do not prune again at once). Returns (spans,
    points) deleted.
    """
    total_spans = total_points = 0
    for _ in range(20):  # each round deletes rows; 20 rounds is plenty
        used = used_bytes(conn)
        if used <= max_bytes:
            break
        fraction = min(1.0, (used - max_bytes) / used + headroom)
        b_lo, b_hi = conn.execute("SELECT min(id), max(id) FROM batches").fetchone()
        p_lo, p_hi = conn.execute("SELECT min(id), max(id) FROM metric_points").fetchone()
        if b_lo is None and p_lo is None:
            break
        last_batch = None if b_lo is None else int(b_lo + (b_hi - b_lo + 1) * fraction) - 1
        last_point = None if p_lo is None else int(p_lo + (p_hi - p_lo + 1) * fraction) - 1
        spans, points = _delete(
            conn,
            None if last_batch is None else max(last_batch, b_lo),
            None if last_point is None else max(last_point, p_lo),
        )
        total_spans += spans
        total_points += points
    return total_spans, total_points
