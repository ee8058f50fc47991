"""Metric curves for the ledger: one PNG per run with a panel per key metric (train and eval).

matplotlib is imported lazily, inside the function, and only through its object-oriented API with
the Agg canvas: no pyplot global state, so several threads can draw their own figures at once and
nothing ever needs a display. The PNG is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

EVAL_PREFIX = "eval/"


class Series(BaseModel):
    """One curve: (step, value) points of one metric in one phase."""

    metric: str
    phase: str
    steps: list[float] = Field(default_factory=list)
    values: list[float] = Field(default_factory=list)


class PlotResult(BaseModel):
    path: str | None = Field(description="the PNG written, or None when there was nothing to draw")
    panels: list[str] = Field(default_factory=list, description="metric shown in each panel")
    series: int = Field(default=0, description="number of curves drawn")
    skipped_points: int = Field(default=0, description="non-finite or non-numeric values left out")


def as_float(value: Any) -> float | None:
    """A metric value as a float: numbers, and the strings 'nan'/'inf' the run writer uses.
    Booleans and anything else give None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def collect_series(rows: Iterable[dict[str, Any]], metrics: Sequence[str]) -> tuple[dict, int]:
    """Curves for ``metrics`` (base names, e.g. 'accuracy') from metrics.jsonl rows.

    For each base name the train curve is the unprefixed key in train/rollout rows and the eval
    curve is ``eval/<name>`` (eval rows, or any row carrying it). A metric given with the prefix
    ('eval/auroc') only has an eval curve. Returns ({panel: [Series...]}, skipped points).
    """
    panels: dict[str, list[Series]] = {}
    skipped = 0
    wanted: list[tuple[str, str, str]] = []  # (panel, key, phase label)
    for name in metrics:
        base = name[len(EVAL_PREFIX) :] if name.startswith(EVAL_PREFIX) else name
        if not name.startswith(EVAL_PREFIX):
            wanted.append((base, base, "train"))
        wanted.append((base, EVAL_PREFIX + base, "eval"))
    curves: dict[tuple[str, str], Series] = {}
    for row in rows:
        if not isinstance(row, dict):
            continue
        step = as_float(row.get("step"))
        if step is None:
            continue
        phase = str(row.get("phase", "train"))
        for panel, key, label in wanted:
            if key not in row:
                continue
            if label == "train" and phase == "eval":
                continue  # an eval row that happens to repeat an unprefixed name
            value = as_float(row[key])
            if value is None or not math.isfinite(value):
                skipped += 1
                continue
            series = curves.get((panel, label))
            if series is None:
                series = curves[(panel, label)] = Series(metric=key, phase=label)
                panels.setdefault(panel, []).append(series)
            series.steps.append(step)
            series.values.append(value)
    return {p: s for p, s in panels.items() if s}, skipped


def plot_run_metrics(
    rows: Iterable[dict[str, Any]],
    metrics: Sequence[str],
    out_path: str | Path,
    title: str = "",
) -> PlotResult:
    """Draw ``metrics`` over steps (train and eval curves per panel) into ``out_path`` (PNG).

    Writes nothing and returns ``path=None`` when none of the metrics has a finite value.
    """
    panels, skipped = collect_series(rows, metrics)
    order = [m[len(EVAL_PREFIX) :] if m.startswith(EVAL_PREFIX) else m for m in metrics]
    names = [p for p in dict.fromkeys(order) if p in panels]
    if not names:
        return PlotResult(path=None, skipped_points=skipped)

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 2 if len(names) == 4 else min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * nrows + (0.4 if title else 0.0)), dpi=100)
    FigureCanvasAgg(fig)
    styles = {"train": {"color": "tab:blue", "lw": 1.2}, "eval": {"color": "tab:orange", "lw": 1.6}}
    count = 0
    for i, name in enumerate(names):
        ax = fig.add_subplot(nrows, cols, i + 1)
        for series in panels[name]:
            style = styles.get(series.phase, {})
            marker = "o" if len(series.steps) <= 30 else None
            ax.plot(
                series.steps,
                series.values,
                label=series.phase,
                marker=marker,
                markersize=3,
                **style,
            )
            count += 1
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    # Fixed margins instead of tight_layout, which would draw the figure a second time.
    height = fig.get_figheight()
    top = 1.0 - (0.75 if title else 0.35) / height
    fig.subplots_adjust(
        left=0.1 / cols + 0.03,
        right=0.98,
        bottom=0.5 / height,
        top=top,
        wspace=0.3,
        hspace=0.9 / nrows,
    )
    if title:
        fig.suptitle(title, fontsize=10)

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp.png", dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return PlotResult(path=str(out), panels=names, series=count, skipped_points=skipped)
