"""Where the run index lives, and what the lab's writers tell it, so that it stays current without a re-read of
the folder: a run whose ``run.json`` the lab rewrote (a state change) gets its new state at
once and is read again in full on the next use; no warning follows, because the change is the
lab's own. Never raises and never creates the index. Torch-free."""

from __future__ import annotations

import contextvars
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf_lab.paths import repo_root

__all__ = ["index_path", "indexed_unfinished", "indexing", "run_record_written", "serve_unfinished"]


def index_path() -> Path:
    """``<lab root>/.rlhf-lab/index.sqlite``: beside ``experiments/``, ignored by git. (Here,
    outside :mod:`rlhf_lab.index`, so that the run modules can tell the index about a change
    without importing it: the index reads runs through them.)"""
    return repo_root() / ".rlhf-lab" / "index.sqlite"


# set while the index itself reads run folders (a status read may settle a state and rewrite
# run.json): the row being read is stored by the reader, and a second connection would wait
# for the reader's own write lock
_INDEXING: contextvars.ContextVar[bool] = contextvars.ContextVar("rlhf_lab_indexing", default=False)


class indexing:  # noqa: N801 - used as a context manager
    """Marks the current context as the index reading folders."""

    def __enter__(self) -> None:
        self._token = _INDEXING.set(True)

    def __exit__(self, *exc: object) -> None:
        _INDEXING.reset(self._token)


# The index's reader of the unfinished runs, registered by rlhf_lab.index when it is imported:
# the index reads runs through the run modules, so they reach it only through this seam.
_UNFINISHED: list[Callable[[], list[tuple[str, str, str]]]] = []


def serve_unfinished(reader: Callable[[], list[tuple[str, str, str]]]) -> None:
    """Register the index's reader of (id, campaign, state) of the unfinished runs."""
    _UNFINISHED[:] = [reader]


def indexed_unfinished() -> list[tuple[str, str, str]] | None:
    """(id, campaign, state) of the queued, starting and running runs, oldest first, from the
    index; None when the index is not loaded in this process, or is reading run folders in this
    context (asking it again would wait for its own write lock)."""
    if _INDEXING.get() or not _UNFINISHED:
        return None
    return _UNFINISHED[0]()


def run_record_written(run_dir: Path, record: dict[str, Any]) -> None:
    """run.json of ``run_dir`` was just replaced by the lab with ``record``."""
    if _INDEXING.get():
        return
    path = index_path()
    if not path.is_file():
        return
    try:
        conn = sqlite3.connect(str(path), timeout=2.0, isolation_level=None)
        try:
            conn.execute(
                "UPDATE runs SET state = COALESCE(?, state), ended_at = COALESCE(?, ended_at), "
                "record_sig = NULL, files_sig = NULL WHERE id = ?",
                (record.get("state"), record.get("ended_at"), run_dir.name),
            )
        finally:
            conn.close()
    except sqlite3.Error:
        pass  # the index is a cache: the next use finds run.json changed and reads it again
