"""Metric curves for the ledger: one PNG per run with a panel per key metric (train and eval),
and for a run that optimises a learned reward model the Gao et al. picture (proxy and gold reward
against the square root of the KL to the reference, :func:`plot_reward_vs_kl`).

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

    out = save_figure(fig, out_path)
    return PlotResult(path=str(out), panels=names, series=count, skipped_points=skipped)


def save_figure(fig: Any, out_path: str | Path) -> Path:
    """Write ``fig`` as a PNG under a temporary name, then rename it into place."""
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
    return out


# The RLHF contract of the policy-gradient trainer: rollout rows log these three.
KL_KEY = "kl_ref"
PROXY_KEY = "proxy_reward"
GOLD_KEY = "gold_reward"
KL_AXIS_LABEL = "√KL(π ‖ π_ref) per sequence  (square root of kl_ref, nats; negatives as 0)"


class RewardKLPoints(BaseModel):
    """The points of the reward-against-KL picture (x = √max(kl_ref, 0))."""

    steps: list[float] = Field(default_factory=list)
    x: list[float] = Field(default_factory=list)
    proxy: list[float] = Field(default_factory=list)
    gold: list[float | None] = Field(default_factory=list)
    eval_x: list[float] = Field(default_factory=list, description="KL of each held-out point")
    eval_proxy: list[float | None] = Field(default_factory=list)
    eval_gold: list[float | None] = Field(default_factory=list)


def _finite(value: Any) -> float | None:
    number = as_float(value)
    return number if number is not None and math.isfinite(number) else None


def reward_kl_points(rows: Iterable[dict[str, Any]]) -> RewardKLPoints:
    """Rollout (non-eval) rows with a finite ``kl_ref`` and ``proxy_reward`` (``gold_reward``
    when logged), one point per step, plus the eval rows' ``eval/proxy_reward`` and
    ``eval/gold_reward``: an evaluation at step s is placed at the KL of the rollouts the same
    policy sampled next (the first rollout row after s; the last one when none follows)."""
    points = RewardKLPoints()
    rollout: dict[float, tuple[float, float, float | None]] = {}
    evals: dict[float, tuple[float | None, float | None]] = {}
    for row in rows:
        if not isinstance(row, dict) or (step := _finite(row.get("step"))) is None:
            continue
        if row.get("phase") == "eval":
            p, g = (
                _finite(row.get(EVAL_PREFIX + PROXY_KEY)),
                _finite(row.get(EVAL_PREFIX + GOLD_KEY)),
            )
            if p is not None or g is not None:
                evals[step] = (p, g)
            continue
        kl, proxy = _finite(row.get(KL_KEY)), _finite(row.get(PROXY_KEY))
        if kl is None or proxy is None:
            continue
        rollout[step] = (kl, proxy, _finite(row.get(GOLD_KEY)))
    order = sorted(rollout)
    for step in order:
        kl, proxy, gold = rollout[step]
        points.steps.append(step)
        points.x.append(math.sqrt(max(kl, 0.0)))
        points.proxy.append(proxy)
        points.gold.append(gold)
    for step, (p, g) in sorted(evals.items()):
        after = [s for s in order if s > step]
        at = after[0] if after else (order[-1] if order else None)
        if at is None:
            continue
        points.eval_x.append(math.sqrt(max(rollout[at][0], 0.0)))
        points.eval_proxy.append(p)
        points.eval_gold.append(g)
    return points


def _centred_mean(values: Sequence[float], k: int) -> list[float]:
    """Each value averaged with its neighbours, ``k`` on each side (fewer at the ends)."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - k) : i + k + 1]
        out.append(sum(window) / len(window))
    return out


def plot_reward_vs_kl(
    rows: Iterable[dict[str, Any]], out_path: str | Path, title: str = ""
) -> PlotResult:
    """The Gao et al. (2022) picture of a run that optimises a learned reward model: the proxy
    reward (the model being optimised; left axis) and the gold reward (right axis) against
    √KL to the reference policy, as in the paper (x = √max(kl_ref, 0); kl_ref is the summed
    per-token KL of a sequence, averaged over the rollout batch). Each rollout row is a faint
    point with a centred running mean (n/20 rows each side) through them; held-out evaluations
    are squares; a dotted line marks where the smoothed gold reward peaked. Writes nothing
    (``path=None``) when fewer than 2 rollout rows log both ``kl_ref`` and ``proxy_reward``."""
    pts = reward_kl_points(rows)
    if len(pts.x) < 2:
        return PlotResult(path=None)

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4 + (0.3 if title else 0.0)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    k = len(pts.x) // 20
    colors = {"proxy": "tab:blue", "gold": "tab:orange"}
    square = {"marker": "s", "s": 26, "edgecolors": "black", "linewidths": 0.5, "zorder": 3}
    ax.scatter(pts.x, pts.proxy, s=8, alpha=0.3, color=colors["proxy"])
    (line,) = ax.plot(
        pts.x, _centred_mean(pts.proxy, k), color=colors["proxy"], lw=1.6, label="proxy reward"
    )
    handles = [line]
    panels, count = [PROXY_KEY], 1
    ax.set_xlabel(KL_AXIS_LABEL, fontsize=8)
    ax.set_ylabel("proxy reward (the optimised RM)", fontsize=8, color=colors["proxy"])
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    evals = [(x, p) for x, p in zip(pts.eval_x, pts.eval_proxy, strict=True) if p is not None]
    if evals:
        ex, ey = zip(*evals, strict=True)
        handles.append(ax.scatter(ex, ey, color=colors["proxy"], label="held-out proxy", **square))
        count += 1
    gold = [(x, g) for x, g in zip(pts.x, pts.gold, strict=True) if g is not None]
    eval_gold = [(x, g) for x, g in zip(pts.eval_x, pts.eval_gold, strict=True) if g is not None]
    if gold or eval_gold:
        twin = ax.twinx()
        twin.set_ylabel("gold reward", fontsize=8, color=colors["gold"])
        twin.tick_params(labelsize=8)
        if gold:
            gx, gy = zip(*gold, strict=True)
            smooth = _centred_mean(list(gy), k)
            twin.scatter(gx, gy, s=8, alpha=0.3, color=colors["gold"])
            (line,) = twin.plot(gx, smooth, color=colors["gold"], lw=1.6, label="gold reward")
            handles.append(line)
            count += 1
            peak = gx[max(range(len(smooth)), key=smooth.__getitem__)]
            handles.append(
                ax.axvline(
                    peak, color=colors["gold"], ls=":", lw=1.2, label=f"gold peak (√KL {peak:.3g})"
                )
            )
        if eval_gold:
            ex, ey = zip(*eval_gold, strict=True)
            handles.append(
                twin.scatter(ex, ey, color=colors["gold"], label="held-out gold", **square)
            )
            count += 1
        panels.append(GOLD_KEY)
    height = fig.get_figheight()
    top = 1.0 - ((0.45 if title else 0.1) + 0.45) / height
    fig.subplots_adjust(left=0.11, right=0.89, bottom=0.55 / height, top=top)
    fig.legend(
        handles=handles,
        fontsize=7,
        loc="lower center",
        bbox_to_anchor=(0.5, top + 0.01),
        ncol=min(len(handles), 3),
        frameon=False,
    )
    if title:
        fig.suptitle(title, fontsize=10)
    out = save_figure(fig, out_path)
    return PlotResult(path=str(out), panels=panels, series=count)
