"""Keeping the run index true to the run folders, cheaply. Torch-free.

What is checked, and when (every check is a ``stat``, never a read of an unchanged file):

- on every use: the campaign folders under ``experiments/`` and each one's ``runs/`` folder
  (a run folder added or removed changes its modification time; only then is it listed again),
  and each indexed run's ``run.json`` (inode, size, modification time). State, campaign, family,
  algorithm and creation time, which every filter, order and count uses, come from
  ``run.json``; a finished run's state never changes without ``run.json`` changing. Runs still
  queued, starting or running are read again every time (their process may have ended);
- for the rows a caller is about to show or query by value: the other files a row is built from
  (``metrics.jsonl``, ``summary.json``, ``exit.json``, ``progress.json``, ``config.yaml``).

A row whose files changed is read again from its folder (a finished run's metrics from the
start; a running run's from where the last scan stopped); a signature taken within two seconds
of a change is not trusted (the row is read again next time). A damaged or missing database is
rebuilt from the folders with a warning (:mod:`rlhf_lab.index.store`), as is a finished run
whose files changed behind the lab's back.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlhf_lab.index.extract import RACY_NS, extract_run, file_sig, stat_sig
from rlhf_lab.index.hook import index_path
from rlhf_lab.paths import experiments_dir

__all__ = ["refresh_rows", "run_dir_of", "sync_runs"]

_ACTIVE = ("queued", "starting", "running")
_COLUMNS = (
    "id, campaign, slug, family, algorithm, state, created_at, started_at, ended_at, model, seed, "
    "device, wandb_url, step, total_steps, outcome, error, headline, higher_is_better, final, "
    "final_step, best, best_step, record_sig, files_sig, scan"
)
_INSERT = (
    f"INSERT OR REPLACE INTO runs({_COLUMNS}) VALUES ({', '.join('?' * len(_COLUMNS.split(',')))})"
)


def run_dir_of(campaign: str, run_id: str) -> Path:
    return experiments_dir() / campaign / "runs" / run_id


def _campaign_folders(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return []


def _store(conn: sqlite3.Connection, run_dir: Path, scan: str | None, now_ns: int) -> None:
    found = extract_run(run_dir, scan, now_ns)
    columns = [c.strip() for c in _COLUMNS.split(",")]
    conn.execute(_INSERT, [found.row[c] for c in columns])
    conn.execute("DELETE FROM metrics WHERE run_id = ?", (found.row["id"],))
    conn.executemany(
        "INSERT INTO metrics VALUES (?, ?, ?, ?, ?)",
        [(found.row["id"], n, p, v, s) for n, (p, v, s) in found.metrics.items()],
    )


def _forget(conn: sqlite3.Connection, run_id: str) -> None:
    conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    conn.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))


def _sync_folders(conn: sqlite3.Connection, root: Path, now_ns: int) -> int:
    """Add runs whose folder appeared and drop those whose folder went, for every campaign
    whose ``runs/`` folder changed. Returns how many rows were added."""
    known = dict(conn.execute("SELECT name, sig FROM campaign_dirs"))
    added = 0
    folders = _campaign_folders(root)
    for name in set(known) - set(folders):
        conn.execute("DELETE FROM campaign_dirs WHERE name = ?", (name,))
        for (run_id,) in conn.execute("SELECT id FROM runs WHERE campaign = ?", (name,)).fetchall():
            _forget(conn, run_id)
    for name in folders:
        runs = root / name / "runs"
        sig = stat_sig(runs, now_ns, size=False)
        if sig is not None and known.get(name) == sig:
            continue
        indexed = {r for (r,) in conn.execute("SELECT id FROM runs WHERE campaign = ?", (name,))}
        present: set[str] = set()
        complete = True
        try:
            entries = list(os.scandir(runs))
        except OSError:
            entries = []
        for entry in entries:
            if not entry.is_dir():
                continue
            if not os.path.isfile(os.path.join(entry.path, "run.json")):
                complete = False  # a run folder being created: look again next time
                continue
            present.add(entry.name)
            if entry.name not in indexed:
                _store(conn, Path(entry.path), None, now_ns)
                added += 1
        for run_id in indexed - present:
            _forget(conn, run_id)
        conn.execute(
            "INSERT OR REPLACE INTO campaign_dirs VALUES (?, ?)",
            (name, sig if complete else None),
        )
    return added


# A long-lived process (the MCP server, an agent's script) keeps the finished runs' run.json
# paths and signatures between listings while the index file itself is unchanged, so that a
# listing is one stat per run and no read of every row. The key is the database's and its
# write-ahead log's inode, size and modification time, taken only when both are older than the
# racy window: any write to the index after that changes one of them (an empty log counts as
# none: SQLite deletes the log when the last connection closes and creates it again on open).
_SNAPSHOT: dict[str, Any] = {"key": None, "entries": []}


def _index_key(base: str, now_ns: int) -> tuple | None:
    path = str(index_path())
    key: list[Any] = [path, base]
    for name in (path, f"{path}-wal"):
        try:
            st = os.stat(name)
        except FileNotFoundError:
            key.append(None)
            continue
        if name != path and st.st_size == 0:
            key.append(None)  # an empty log holds nothing (SQLite re-creates it on open)
            continue
        if now_ns - st.st_mtime_ns < RACY_NS:
            return None
        key.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(key)


def _parsed_sig(sig: str) -> tuple[int, ...] | None:
    return None if sig == "-" else tuple(int(part) for part in sig.split(":"))


def _finished_records(conn: sqlite3.Connection, base: str) -> list[tuple[str, str, Any]]:
    """(run id, run.json path, its signature as (inode, size, mtime) or None for absent) of
    every indexed run whose signature is trusted."""
    key = _index_key(base, time.time_ns())
    if key is not None and _SNAPSHOT["key"] == key:
        return _SNAPSHOT["entries"]
    query = "SELECT id, campaign, record_sig FROM runs WHERE record_sig IS NOT NULL"
    entries = [
        (run_id, f"{base}/{campaign}/runs/{run_id}/run.json", _parsed_sig(sig))
        for run_id, campaign, sig in conn.execute(query)
    ]
    _SNAPSHOT.update(key=key, entries=entries if key is not None else [])
    return entries


def _changed_records(conn: sqlite3.Connection, root: Path, first_only: bool) -> list[str]:
    """Ids of the finished runs whose ``run.json`` is not the one indexed (another inode, size
    or modification time, or gone): one ``stat`` per run, in a tight loop (at 10,000 runs it is
    most of a listing's cost). A stored signature was trusted when it was taken (not within
    two seconds of a change), so an unchanged file gives the same one."""
    stat = os.stat
    changed = []
    for run_id, path, want in _finished_records(conn, str(root)):
        try:
            st = stat(path)
        except OSError:
            if want is None:
                continue
        else:
            if want is not None and st.st_mtime_ns == want[2] and st.st_size == want[1]:
                if st.st_ino == want[0]:
                    continue
        changed.append(run_id)
        if first_only:
            break
    return changed


def _unsettled(conn: sqlite3.Connection) -> list[str]:
    """Ids of the runs read again on every use: queued, starting or running (their process
    may have ended), or whose run.json changed too recently to trust its signature."""
    # two queries, each on an index (runs_state; the partial runs_unsigned): their OR would
    # scan every row
    active = [r for (r,) in conn.execute("SELECT id FROM runs WHERE state IN (?, ?, ?)", _ACTIVE)]
    unsigned = [r for (r,) in conn.execute("SELECT id FROM runs WHERE record_sig IS NULL")]
    return list(dict.fromkeys(active + unsigned))


def _needs_sync(conn: sqlite3.Connection, root: Path, now_ns: int) -> bool:
    """Whether any campaign's ``runs/`` folder or any run's ``run.json`` changed, or a run is
    active (read-only: a listing with nothing to update takes no write lock)."""
    known = dict(conn.execute("SELECT name, sig FROM campaign_dirs"))
    folders = _campaign_folders(root)
    if set(known) - set(folders):
        return True
    for name in folders:
        sig = stat_sig(root / name / "runs", now_ns, size=False)
        if sig is None or known.get(name) != sig:
            return True
    return bool(_unsettled(conn)) or bool(_changed_records(conn, root, first_only=True))


def sync_runs(conn: sqlite3.Connection, warnings: list[str]) -> None:
    """Bring every row's state, ids and timestamps up to date (the cheap check of the module
    docstring). Commits its changes."""
    now_ns = time.time_ns()
    root = experiments_dir()
    if not _needs_sync(conn, root, now_ns):
        return
    fresh = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        added = _sync_folders(conn, root, now_ns)
        unsettled = set(_unsettled(conn))
        changed = unsettled | set(_changed_records(conn, root, first_only=False))
        rows = []
        ordered = sorted(changed)
        for start in range(0, len(ordered), 500):
            chunk = ordered[start : start + 500]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT id, campaign, state, record_sig, scan FROM runs WHERE id IN ({marks})"
            rows += conn.execute(query, chunk).fetchall()
        behind = 0
        for run_id, campaign, state, sig, scan in rows:
            run_dir = run_dir_of(campaign, run_id)
            if not (run_dir / "run.json").is_file():
                _forget(conn, run_id)
                continue
            if state not in _ACTIVE and sig is not None:
                behind += 1
            _store(conn, run_dir, scan if state in _ACTIVE else None, now_ns)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if fresh and added:
        warnings.append(f"the run index was built from {added} run folders")
    if behind:
        warnings.append(
            f"{behind} finished run(s) changed on disk since they were indexed; read again "
            "from their folders"
        )


def refresh_rows(conn: sqlite3.Connection, run_ids: Iterable[str], warnings: list[str]) -> None:
    """The full check of the module docstring for ``run_ids``: a row whose other files changed
    (or were not trusted) is read again from its folder."""
    now_ns = time.time_ns()
    base = str(experiments_dir())
    ids = list(run_ids)
    stale = []
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        query = f"SELECT id, campaign, state, files_sig, scan FROM runs WHERE id IN ({marks})"
        for run_id, campaign, state, sig, _scan in conn.execute(query, chunk):
            if state in _ACTIVE:
                continue  # read again by sync_runs on every use
            if sig is None or file_sig(f"{base}/{campaign}/runs/{run_id}", now_ns) != sig:
                stale.append((run_id, campaign, sig))
    if not stale:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for run_id, campaign, _sig in stale:
            _store(conn, run_dir_of(campaign, run_id), None, now_ns)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    behind = sum(1 for _, _, sig in stale if sig is not None)
    if behind:
        warnings.append(
            f"{behind} finished run(s) changed on disk since they were indexed; read again "
            "from their folders"
        )
