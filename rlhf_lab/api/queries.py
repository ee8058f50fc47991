"""Querying the run index: ``query_runs`` (filters and sorting on indexed fields and final
metric values, the best run per group) and ``rebuild_run_index``. Torch-free.

A condition is ``FIELD OP VALUE``: OP one of ``=`` (a comma list means any of them), ``!=``,
``>``, ``>=``, ``<``, ``<=``, ``~`` (contains); FIELD an indexed field
(:data:`rlhf_lab.index.QUERY_FIELDS`) or a metric as the run logged it (its final value);
times take ISO dates or an age (``ended_at>=-7d``). "The best held-out accuracy per DPO-family
loss on model tiny": ``where=["family=direct_alignment", "model=tiny"], group_by="algorithm",
best="eval/accuracy"``. "Every run that died last week": ``where=["state=died",
"ended_at>=-7d"]``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.errors import InvalidArgument

QUERY_LIMIT = 50  # rows by default
QUERY_MAX_LIMIT = 500


class QueryRow(BaseModel):
    """One run (one group's best run, when grouped)."""

    id: str
    campaign: str
    family: str | None = None
    algorithm: str | None = None
    state: str
    model: str | None = None
    seed: int | None = None
    ended_at: str | None = None
    headline: str | None = Field(default=None, description="the run's own headline metric")
    final: float | None = Field(default=None, description="its final value")
    best: float | None = Field(default=None, description="its best value")
    metrics: dict[str, float | None] = Field(
        default_factory=dict, description="final values of the metrics the query named"
    )
    group: Any = Field(default=None, description="the group_by value (grouped queries)")


class QueryResult(BaseModel):
    rows: list[QueryRow]
    total: int = Field(description="matching runs (groups, when grouped) before the limit")
    note: str | None = None
    warnings: list[str] = Field(default_factory=list)


class IndexRebuild(BaseModel):
    runs: int = Field(description="runs indexed")
    path: str = Field(description="the index database")
    warnings: list[str] = Field(default_factory=list)


@operation
def query_runs(
    where: list[str] | None = None,
    sort: str | None = None,
    group_by: str | None = None,
    best: str | None = None,
    limit: int = QUERY_LIMIT,
) -> QueryResult:
    """Runs of the whole lab matching every condition in ``where``, ordered by ``sort``
    (``-field`` descending; default newest first); with ``group_by``, each group's best run by
    ``best`` (a field or metric, ``max:``/``min:`` to force the direction; default the run's
    headline best value in its good direction)."""
    from rlhf_lab.index import query_index

    if not 1 <= limit <= QUERY_MAX_LIMIT:
        raise InvalidArgument(f"limit must be from 1 to {QUERY_MAX_LIMIT}")
    if best is not None and group_by is None:
        raise InvalidArgument("best picks one run per group: give group_by too")
    found = query_index(where or [], sort, group_by, best, limit)
    note = None
    if not found.total:
        note = "no runs match"
    elif len(found.rows) < found.total:
        note = f"the first {len(found.rows)} of {found.total}; raise limit or narrow where"
    rows = [QueryRow.model_validate({k: v for k, v in r.items()}) for r in found.rows]
    return QueryResult(rows=rows, total=found.total, note=note, warnings=found.warnings)


@operation
def rebuild_run_index() -> IndexRebuild:
    """Drop the run index and build it again from every run folder."""
    from rlhf_lab.index import index_path, rebuild_index

    count, warnings = rebuild_index()
    return IndexRebuild(runs=count, path=str(index_path()), warnings=warnings)
