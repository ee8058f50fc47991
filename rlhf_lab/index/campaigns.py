"""Campaign summaries in the run index (what ``list_campaigns`` and the index of campaigns
show): each kept with the signature of its ``ledger.json`` and markdown, read again only when
one of them changed, and replaced by the writer itself after a write (``remember``), so the
index of campaigns is updated, not rebuilt, when one campaign changes. Torch-free."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from rlhf_lab.index.extract import RACY_NS
from rlhf_lab.index.store import with_index
from rlhf_lab.paths import experiments_dir

__all__ = [
    "CAMPAIGN_RE",
    "cached_summaries",
    "campaign_files",
    "campaign_names",
    "campaign_sig",
    "remember",
]

# a campaign's name: YYYY-MM-DD-<slug> (the markdown's stem and its asset folder)
CAMPAIGN_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z0-9]+(?:-[a-z0-9]+)*)$")


def campaign_names() -> list[str]:
    """Every campaign under experiments/ (a markdown ledger or a ledger.json), oldest first."""
    root = experiments_dir()
    if not root.is_dir():
        return []
    names = {p.stem for p in root.glob("*.md") if CAMPAIGN_RE.fullmatch(p.stem)}
    names |= {
        p.parent.name for p in root.glob("*/ledger.json") if CAMPAIGN_RE.fullmatch(p.parent.name)
    }
    return sorted(names)


def campaign_files(name: str) -> tuple[Path, Path]:
    """A campaign's ``ledger.json`` and markdown ledger."""
    root = experiments_dir()
    return root / name / "ledger.json", root / f"{name}.md"


def _one(path: Path, now_ns: int) -> tuple[str, bool]:
    """(``ino:size:mtime`` or "-", whether it changed too recently to trust a read of it)."""
    try:
        st = path.stat()
    except OSError:
        return "-", False
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}", now_ns - st.st_mtime_ns < RACY_NS


def campaign_sig(data_path: Path, md_path: Path, now_ns: int) -> tuple[str, bool]:
    """The signature of a campaign's ``ledger.json`` and markdown, and whether either changed
    too recently for a summary read now to be trusted later (the lab replaces both files
    atomically, so each of its writes gives a new inode; the doubt is about edits in place)."""
    (a, racy_a), (b, racy_b) = _one(data_path, now_ns), _one(md_path, now_ns)
    return f"{a}|{b}", racy_a or racy_b


def cached_summaries(
    names: list[str],
    paths: Callable[[str], tuple[Path, Path]],
    read: Callable[[str], tuple[str, bool]],
    warnings: list[str],
) -> list[str]:
    """The summary (JSON text) of each campaign in ``names``: from the index when its files are
    unchanged, else ``read(name)`` -> (JSON, cacheable) and stored."""
    now_ns = time.time_ns()

    def work(conn: sqlite3.Connection) -> list[str]:
        stored = {n: (s, d) for n, s, d in conn.execute("SELECT name, sig, data FROM campaigns")}
        out, fresh = [], []
        for name in names:
            sig, racy = campaign_sig(*paths(name), now_ns)
            cached = stored.get(name)
            if cached is not None and cached[0] == sig:
                out.append(cached[1])
                continue
            text, cacheable = read(name)
            out.append(text)
            fresh.append((name, sig if cacheable and not racy else None, text))
        gone = set(stored) - set(names)
        if fresh or gone:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT OR REPLACE INTO campaigns VALUES (?, ?, ?)", fresh)
            conn.executemany("DELETE FROM campaigns WHERE name = ?", [(n,) for n in gone])
            conn.execute("COMMIT")
        return out

    return with_index(work, warnings)


def remember(name: str, paths: tuple[Path, Path], text: str) -> None:
    """Store a campaign's summary right after the lab wrote its files, under the campaign's
    lock: its own snapshot of the files is trusted however recent."""
    warnings: list[str] = []

    def work(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO campaigns VALUES (?, ?, ?)",
            (name, campaign_sig(*paths, time.time_ns())[0], text),
        )

    try:
        with_index(work, warnings)
    except sqlite3.Error:
        pass  # a cache: the next listing reads the campaign again
