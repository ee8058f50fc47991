"""The run index's database: where it lives, its tables, and what happens when it is missing,
from an older version or damaged (it is dropped and rebuilt from the run folders, with a
warning). Standard-library ``sqlite3`` only; torch-free.

The database is a cache of the run folders, never a source of truth: deleting it loses nothing.
It lives beside ``experiments/``, at ``<lab root>/.rlhf-lab/index.sqlite`` (ignored by git).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from rlhf_lab.index.hook import index_path

__all__ = ["SCHEMA_VERSION", "connect", "drop_index", "index_path", "with_index"]

# Bump when a table or the meaning of a column changes: an index of another version is rebuilt.
SCHEMA_VERSION = "4"  # 4: a headline 0 at every evaluation is passed over (headline.py)

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS campaign_dirs(name TEXT PRIMARY KEY, sig TEXT);
CREATE TABLE IF NOT EXISTS runs(
    id TEXT PRIMARY KEY,
    campaign TEXT NOT NULL,
    slug TEXT,
    family TEXT,
    algorithm TEXT,
    state TEXT NOT NULL,
    created_at TEXT,
    started_at TEXT,
    ended_at TEXT,
    model TEXT,
    seed INTEGER,
    device TEXT,
    wandb_url TEXT,
    step INTEGER,
    total_steps INTEGER,
    outcome TEXT,
    error TEXT,
    headline TEXT,
    higher_is_better INTEGER,
    final REAL,
    final_step INTEGER,
    best REAL,
    best_step INTEGER,
    record_sig TEXT,
    files_sig TEXT,
    scan TEXT
);
CREATE INDEX IF NOT EXISTS runs_created ON runs(created_at, id);
CREATE INDEX IF NOT EXISTS runs_campaign ON runs(campaign, created_at);
CREATE INDEX IF NOT EXISTS runs_slug ON runs(slug, created_at);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state, created_at);
CREATE INDEX IF NOT EXISTS runs_family ON runs(family, algorithm);
CREATE INDEX IF NOT EXISTS runs_unsigned ON runs(id) WHERE record_sig IS NULL;
CREATE TABLE IF NOT EXISTS metrics(
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    phase TEXT,
    value REAL,
    step INTEGER,
    PRIMARY KEY(run_id, name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS metrics_name ON metrics(name, value);
CREATE TABLE IF NOT EXISTS campaigns(name TEXT PRIMARY KEY, sig TEXT, data TEXT);
CREATE TABLE IF NOT EXISTS ledger_pieces(
    campaign TEXT NOT NULL,
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY(campaign, run_id)
) WITHOUT ROWID;
"""


def _open(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def _version(conn: sqlite3.Connection) -> str | None:
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='version'").fetchone()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return None
        raise
    return row[0] if row else None


def _create(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_SCHEMA)
    conn.execute("INSERT OR REPLACE INTO meta VALUES('version', ?)", (SCHEMA_VERSION,))


def drop_index() -> None:
    """Remove the database and its journal files (the next call builds a new one)."""
    path = index_path()
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            os.unlink(f"{path}{suffix}")
        except FileNotFoundError:
            pass


def _is_damage(err: sqlite3.Error) -> bool:
    """A damaged or foreign file (or an older schema), as opposed to a busy database."""
    if isinstance(err, sqlite3.OperationalError):
        text = str(err)
        return "no such table" in text or "no such column" in text or "malformed" in text
    return isinstance(err, sqlite3.DatabaseError)


@contextmanager
def connect(warnings: list[str]) -> Iterator[sqlite3.Connection]:
    """A connection to a usable index: created when missing, rebuilt (emptied, to be filled from
    the run folders by the caller's sync) when it is from another version or damaged. Each such
    event appends a warning to ``warnings``."""
    path = index_path()
    existed = path.is_file()
    conn: sqlite3.Connection | None = None
    try:
        conn = _open(path)
        version = _version(conn)
        if version != SCHEMA_VERSION:
            if version is not None:
                conn.close()
                drop_index()
                conn = _open(path)
                warnings.append(
                    f"the run index was written by another version ({version}); rebuilt from "
                    "the run folders"
                )
            elif existed and path.stat().st_size > 0:
                warnings.append("the run index had no tables; rebuilt from the run folders")
            _create(conn)
    except sqlite3.DatabaseError as err:
        if not _is_damage(err):
            raise
        if conn is not None:
            conn.close()
        drop_index()
        warnings.append(f"the run index was damaged ({err}); rebuilt from the run folders")
        conn = _open(path)
        _create(conn)
    try:
        yield conn
    finally:
        conn.close()


def with_index(work: Callable[[sqlite3.Connection], T], warnings: list[str]) -> T:
    """``work(conn)`` on a usable index; when the database turns out damaged part way (a page
    that cannot be read), it is dropped, rebuilt and ``work`` runs once more."""
    try:
        with connect(warnings) as conn:
            return work(conn)
    except sqlite3.DatabaseError as err:
        if not _is_damage(err):
            raise
        drop_index()
        warnings.append(f"the run index was damaged ({err}); rebuilt from the run folders")
        with connect(warnings) as conn:
            return work(conn)
