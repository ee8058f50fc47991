"""The run index: one SQLite row per run (ids, family, algorithm, campaign, state, timestamps,
model, seed, the run's own headline metric final and best, W&B link) plus each run's final
metrics, and the campaigns' summaries, so that listing, status overviews and queries cost the
same at 10,000 runs as at 10. Standard-library ``sqlite3``; torch-free.

The run folders stay the source of truth. The index lives at ``<lab root>/.rlhf-lab/
index.sqlite`` (ignored by git); it is checked against the folders on every use with a few
``stat`` calls (:mod:`~rlhf_lab.index.sync`), updated when the lab rewrites a run.json
(:mod:`~rlhf_lab.index_hook`) and when a run is recorded, and rebuilt from the folders on
demand (:func:`rebuild_index`) or automatically when it is missing, stale or damaged, with a
warning (:mod:`~rlhf_lab.index.store`).

By job: :mod:`~rlhf_lab.index.store` (the database), :mod:`~rlhf_lab.index.extract` (a run
folder as a row), :mod:`~rlhf_lab.index.sync` (staleness), :mod:`~rlhf_lab.index.query`
(pages, unfinished runs, the query tool), :mod:`~rlhf_lab.index.campaigns` (campaign
summaries).
"""

from __future__ import annotations

from rlhf_lab.index.query import (
    QUERY_FIELDS,
    IndexPage,
    QueryOutcome,
    page_runs,
    query_index,
    rebuild_index,
    unfinished_run_ids,
)
from rlhf_lab.index.store import index_path

__all__ = [
    "QUERY_FIELDS",
    "IndexPage",
    "QueryOutcome",
    "index_path",
    "page_runs",
    "query_index",
    "rebuild_index",
    "unfinished_run_ids",
]
