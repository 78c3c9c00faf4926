"""The SQLite file: schema, connection settings, inserts and pruning.

One writer (the store's thread) and any number of readers (the inspection commands,
other processes): WAL mode lets readers see committed data while the writer writes.
Span rows are keyed by (trace_id, span_id) and metric points by (name, service,
attributes, start, time), and inserts replace, so writing the same export twice (a
retried fan-out) stores it once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gym_sidecar.store.rows import PointRow, SpanRow

SCHEMA_VERSION: Final = 1

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL,
    status_message TEXT NOT NULL,
    service TEXT NOT NULL,
    scope TEXT NOT NULL,
    rollout_id TEXT,
    attributes TEXT NOT NULL,
    resource TEXT NOT NULL,
    stored_ns INTEGER NOT NULL,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_stored ON spans (stored_ns);
CREATE INDEX IF NOT EXISTS spans_rollout ON spans (rollout_id) WHERE rollout_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS spans_name_start ON spans (name, start_ns);
CREATE TABLE IF NOT EXISTS metric_points (
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    service TEXT NOT NULL,
    start_ns INTEGER NOT NULL,
    time_ns INTEGER NOT NULL,
    attributes TEXT NOT NULL,
    value TEXT NOT NULL,
    stored_ns INTEGER NOT NULL,
    PRIMARY KEY (name, service, attributes, start_ns, time_ns)
);
CREATE INDEX IF NOT EXISTS points_stored ON metric_points (stored_ns);
CREATE INDEX IF NOT EXISTS points_name_time ON metric_points (name, time_ns);
"""

_INSERT_SPAN: Final = "INSERT OR REPLACE INTO spans VALUES (" + ",".join("?" * 15) + ")"
_INSERT_POINT: Final = "INSERT OR REPLACE INTO metric_points VALUES (" + ",".join("?" * 8) + ")"


class StoreVersionError(Exception):
    """The file was written by a newer, incompatible version of the store."""


def connect(path: Path, *, readonly: bool = False, timeout_s: float = 10.0) -> sqlite3.Connection:
    """Open (and for writers create) the store at ``path``.

    Readers open ``mode=ro`` and raise ``FileNotFoundError`` when the file is missing.
    ``check_same_thread`` stays on: one connection belongs to one thread.
    """
    if readonly:
        if not path.exists():
            raise FileNotFoundError(f"no local store at {path}")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s)
        conn.row_factory = sqlite3.Row
        return conn
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL: a commit survives a process crash; only a power loss can lose the
    # last transactions, never corrupt the file.
    conn.execute("PRAGMA synchronous=NORMAL")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        conn.close()
        raise StoreVersionError(f"{path}: schema version {version} > {SCHEMA_VERSION}")
    conn.executescript(_SCHEMA)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    conn.row_factory = sqlite3.Row
    return conn


def insert(conn: sqlite3.Connection, spans: Sequence[SpanRow], points: Sequence[PointRow]) -> None:
    """Insert rows in one transaction."""
    conn.execute("BEGIN")
    try:
        if spans:
            conn.executemany(_INSERT_SPAN, spans)
        if points:
            conn.executemany(_INSERT_POINT, points)
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


def prune_age(conn: sqlite3.Connection, cutoff_ns: int) -> tuple[int, int]:
    """Delete what was stored before ``cutoff_ns``; returns (spans, points) deleted."""
    conn.execute("BEGIN")
    spans = conn.execute("DELETE FROM spans WHERE stored_ns < ?", (cutoff_ns,)).rowcount
    points = conn.execute("DELETE FROM metric_points WHERE stored_ns < ?", (cutoff_ns,)).rowcount
    conn.execute("COMMIT")
    return spans, points


def prune_size(conn: sqlite3.Connection, max_bytes: int, headroom: float = 0.1) -> tuple[int, int]:
    """While the used pages exceed ``max_bytes``, delete the oldest stored rows.

    Deletes the oldest fraction of rows the excess calls for plus ``headroom`` (so the
    next writes do not prune again at once). Returns (spans, points) deleted.
    """
    total_spans = total_points = 0
    for _ in range(20):  # each round deletes at least one row; 20 rounds is plenty
        used = used_bytes(conn)
        if used <= max_bytes:
            break
        fraction = min(1.0, (used - max_bytes) / used + headroom)
        n_spans = int(conn.execute("SELECT count(*) FROM spans").fetchone()[0])
        n_points = int(conn.execute("SELECT count(*) FROM metric_points").fetchone()[0])
        if n_spans + n_points == 0:
            break
        conn.execute("BEGIN")
        spans = conn.execute(
            "DELETE FROM spans WHERE rowid IN (SELECT rowid FROM spans ORDER BY stored_ns LIMIT ?)",
            (max(1, int(n_spans * fraction)) if n_spans else 0,),
        ).rowcount
        points = conn.execute(
            "DELETE FROM metric_points WHERE rowid IN "
            "(SELECT rowid FROM metric_points ORDER BY stored_ns LIMIT ?)",
            (max(1, int(n_points * fraction)) if n_points else 0,),
        ).rowcount
        conn.execute("COMMIT")
        total_spans += spans
        total_points += points
    return total_spans, total_points
