"""The reading operations behind `runs`, a bare `status` and `campaign list` as plain data
(dicts shaped like the result models' JSON), without pydantic, the run modules or the ledger:
what the typed functions (:func:`rlhf_lab.api.watching.run_list`,
:func:`rlhf_lab.api.records.list_campaigns`) build their models from, and what the CLI's fast
path prints (:mod:`rlhf_lab.cli.fast`), so that a cold `rlhf-lab runs` costs the interpreter, the
standard library and one SQLite query. Torch-free.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = [
    "LIST_DETAIL_LIMIT",
    "LIST_LIMIT",
    "RUN_STATES",
    "RunQuery",
    "cached_campaigns",
    "check_list_arguments",
    "run_page",
    "unfinished_runs",
]

LIST_LIMIT = 50  # rows of a run list by default
LIST_DETAIL_LIMIT = 10  # rows with their full status by default
# trainers.core.runfolder.RUN_STATES, spelled out here because that module costs pydantic
# (tests/lab/test_cli_fast.py keeps the two equal)
RUN_STATES: tuple[str, ...] = (
    "queued",
    "starting",
    "running",
    "succeeded",
    "failed",
    "stopped",
    "killed",
    "died",
    "cancelled",
)


def check_list_arguments(
    campaign: str | None, state: str | None, limit: int | None, offset: int
) -> None:
    """The checks of a run list's arguments (before anything is read)."""
    from rlhf_lab.paths import check_slug

    if limit is not None and limit < 1:
        raise InvalidArgument("limit must be at least 1")
    if offset < 0:
        raise InvalidArgument("offset must be 0 or more")
    if state is not None and state not in RUN_STATES:
        raise InvalidArgument(
            f"unknown state {state!r}; states: {', '.join(RUN_STATES)}",
            next=NextStep("list_runs", {"state": None}, note="every state"),
        )
    if campaign is not None:
        check_slug(campaign)


def _note(page_total: int, shown: int, rows: int, offset: int, filtered: bool) -> str | None:
    if not page_total:
        return "no runs match" + ("" if filtered else " (none launched yet: launch_run)")
    if offset:
        return (
            f"runs {offset + 1}-{offset + rows} counted from the newest, of "
            f"{page_total}; a larger offset pages further back"
        )
    if rows < page_total:
        return (
            f"the newest {shown} of {page_total} runs; narrow by campaign or state, or raise "
            "limit (offset pages back)"
        )
    return None


class RunQuery(NamedTuple):
    """Which runs a list shows: the filters (None: any), how many rows (None: the default,
    smaller with ``detail``) and how many of the newest to skip."""

    campaign: str | None = None
    state: str | None = None
    limit: int | None = None
    detail: bool = False
    offset: int = 0
    family: str | None = None
    algorithm: str | None = None


def run_page(query: RunQuery) -> dict[str, Any]:
    """A page of the run list as ``RunList`` JSON without the full statuses (``detail`` only
    picks the default limit): the newest ``limit`` matching runs after the newest ``offset``,
    oldest first, each with its own headline metric final and best; their total; a note when
    empty or cut; the index's warnings. Raises InvalidArgument before reading anything."""
    from rlhf_lab.index import page_runs

    campaign, state, limit, detail, offset, family, algorithm = query
    check_list_arguments(campaign, state, limit, offset)
    shown = limit or (LIST_DETAIL_LIMIT if detail else LIST_LIMIT)
    page = page_runs(campaign, state, family, algorithm, limit=shown, offset=offset)
    filtered = bool(campaign or state or family or algorithm)
    rows = [
        {
            "id": r["id"],
            "campaign": r["campaign"],
            "state": r["state"],
            "step": r["step"],
            "total_steps": r["total_steps"],
            "metric": r["headline"],
            "value": r["final"],
            "best": r["best"],
            "status": None,
        }
        for r in page.rows
    ]
    return {
        "runs": rows,
        "total": page.total,
        "note": _note(page.total, shown, len(rows), offset, filtered),
        "warnings": page.warnings,
    }


def unfinished_runs() -> list[str]:
    """Ids of the queued, starting and running runs, oldest first (from the run index)."""
    from rlhf_lab.index import unfinished_run_ids

    return unfinished_run_ids()[0]


class _NotCached(Exception):
    """A campaign whose summary only the ledger's own reader can give."""


def _read_plainly(name: str) -> tuple[str, bool]:
    from rlhf_lab.index.campaign_summary import plain_summary

    text = plain_summary(name)
    if text is None:
        raise _NotCached(name)
    return text, True


def cached_campaigns(warnings: list[str]) -> list[dict[str, Any]] | None:
    """Every campaign's summary (``Campaign`` JSON), newest first: from the run index while a
    campaign's files are unchanged, else read from its ledger.json without pydantic and stored;
    None when one needs the ledger's own reader (the caller then reads them through
    :func:`rlhf_lab.api.records.list_campaigns`). ``warnings`` gets the index's own."""
    from rlhf_lab.index.campaigns import cached_summaries, campaign_files, campaign_names

    names = list(reversed(campaign_names()))
    try:
        texts = cached_summaries(names, campaign_files, _read_plainly, warnings)
    except _NotCached:
        return None
    return [json.loads(t) for t in texts]
