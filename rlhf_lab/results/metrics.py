"""A run's metric series as the API returns them: metrics.jsonl rows filtered by key and
phase, down-sampled evenly per phase (first and last row kept). Torch-free."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.paths import find_run
from rlhf_lab.runs.folder import (
    read_metric_rows,
)


class MetricSeries(BaseModel):
    run_id: str
    phase: str | None = None
    keys: list[str] = Field(description="metric names in the returned rows")
    rows: list[dict[str, Any]] = Field(
        description="step, phase, time_s and the metrics; non-finite values stay as 'nan'/'inf'"
    )
    total_rows: int = Field(description="matching rows before down-sampling")
    downsampled: bool = False


META_KEYS = ("step", "phase", "time_s")  # what a row holds besides its metrics


def even_indices(n: int, k: int) -> list[int]:
    """k indices spread evenly over range(n), always including the first and the last."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def phase_indices(rows: list[dict[str, Any]]) -> dict[Any, list[int]]:
    """The indices of ``rows`` by phase, in order."""
    by_phase: dict[Any, list[int]] = {}
    for i, r in enumerate(rows):
        by_phase.setdefault(r.get("phase"), []).append(i)
    return by_phase


def evenly_per_phase(rows: list[dict[str, Any]], points: int) -> list[dict[str, Any]]:
    """At most ``points`` rows of each phase, spread evenly over it (its last row always kept),
    in their order."""
    keep: list[int] = []
    for idx in phase_indices(rows).values():
        keep.extend(idx[j] for j in even_indices(len(idx), points))
    return [rows[i] for i in sorted(keep)]


def metric_names(rows: list[dict[str, Any]]) -> list[str]:
    """The metric names the rows hold, in the order they first appear."""
    seen: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in META_KEYS:
                seen.setdefault(k, None)
    return list(seen)


def read_metrics(
    run_id: str,
    keys: list[str] | None = None,
    phase: str | None = None,
    max_points: int | None = None,
) -> MetricSeries:
    """metrics.jsonl rows of a run. ``keys`` keeps only those metrics (rows holding none of them
    are dropped); ``phase`` keeps one phase (train / eval / rollout); ``max_points`` down-samples
    each phase evenly, always keeping its last row."""
    if max_points is not None and max_points < 1:
        raise InvalidArgument("max_points must be at least 1")
    rows = read_metric_rows(find_run(run_id) / "metrics.jsonl").rows
    if phase is not None:
        rows = [r for r in rows if r.get("phase") == phase]
    if keys:
        wanted = list(dict.fromkeys(keys))
        rows = [
            {**{m: r[m] for m in META_KEYS if m in r}, **{k: r[k] for k in wanted if k in r}}
            for r in rows
            if any(k in r for k in wanted)
        ]
    total = len(rows)
    downsampled = False
    if max_points is not None:
        kept = evenly_per_phase(rows, max_points)
        downsampled, rows = len(kept) < len(rows), kept
    return MetricSeries(
        run_id=run_id,
        phase=phase,
        keys=metric_names(rows),
        rows=rows,
        total_rows=total,
        downsampled=downsampled,
    )
