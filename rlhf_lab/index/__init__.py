"""The run index: one SQLite row per run (ids, family, algorithm, campaign, state, timestamps,
model, seed, the run's own headline metric final and best, W&B link) plus each run's final
metrics, and the campaigns' summaries, so that listing, status overviews and queries cost the
same at 10,000 runs as at 10. Standard-library ``sqlite3``; torch-free.

The run folders stay the source of truth. The index lives at ``<lab root>/.rlhf-lab/
index.sqlite`` (ignored by git); it is checked against the folders on every use with a few
``stat`` calls (:mod:`~rlhf_lab.index.sync`), updated when the lab rewrites a run.json
(:mod:`~rlhf_lab.index.hook`) and when a run is recorded, and rebuilt from the folders on
demand (:func:`rebuild_index`) or automatically when it is missing, stale or damaged, with a
warning (:mod:`~rlhf_lab.index.store`).

By job: :mod:`~rlhf_lab.index.store` (the database), :mod:`~rlhf_lab.index.extract` (a run
folder as a row), :mod:`~rlhf_lab.index.sync` (staleness), :mod:`~rlhf_lab.index.query`
(pages, unfinished runs, the query tool), :mod:`~rlhf_lab.index.campaigns` (campaign
summaries), :mod:`~rlhf_lab.index.campaign_summary` (a summary read from ``ledger.json``
without pydantic, for the CLI's fast path).

Names are loaded on first use (PEP 562 ``__getattr__``): :mod:`~rlhf_lab.index.hook`, which the
lab's writers import, does not load the query and store modules.
"""

from __future__ import annotations

from rlhf_lab._lazy import lazy_attributes

# name -> module it is loaded from on first use
_LAZY: dict[str, str] = {
    "QUERY_FIELDS": "rlhf_lab.index.query",
    "IndexPage": "rlhf_lab.index.query",
    "QueryOutcome": "rlhf_lab.index.query",
    "page_runs": "rlhf_lab.index.query",
    "query_index": "rlhf_lab.index.query",
    "rebuild_index": "rlhf_lab.index.query",
    "unfinished_run_ids": "rlhf_lab.index.query",
    "index_path": "rlhf_lab.index.store",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
