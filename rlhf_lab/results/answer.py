"""A campaign's answer: the question, the verdict with its 95% interval, whether the budget was
adequate, and one figure — what the top of a campaign's report says (the ``## Answer`` block).
Torch-free; pure functions of metric rows, except :func:`draw_change_figure`, which writes a PNG.

The answer of a comparison whose runs start from one model (each run's held-out evaluation at
step 0 is the starting model on the same prompts) is the *change from the start*, per arm:

* per run, Δ = (last held-out evaluation) − (step-0 evaluation) of each answer metric (the
  family's headline first, e.g. greedy held-out correctness, then its companions such as the tag
  format rate);
* per arm, with ≥ 2 seeds whose Δ differ: the mean Δ with a Student-t 95% interval over seeds
  (the seeds' spread carries both the training noise and the held-out sampling noise); with one
  seed, or seeds that all moved by the same amount, Newcombe's 95% interval for the difference
  of the pooled final and pooled starting shares (items = held-out prompts × runs; it ignores
  the pairing of before and after on the same prompts, so it is conservative);
* the arm *raised* the metric when the interval lies above 0, *lowered* it when below, else
  *no change beyond noise* (and the interval says how large a change the budget could have
  missed).

Adequacy (a null result is a result only when the budget was adequate): the training signal must
have moved — groups with reward contrast (1 − frac_reward_zero_std > 0) on most steps, and the
training reward's last quarter differing from its first — else the answer says the budget was
not adequate and why. Other analyses (gold against KL, best-of-n) make an :class:`Answer` of
their own; the ledger stores and renders whichever was recorded last.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_lab.results.stats import Interval, mean_interval, newcombe_difference

__all__ = [
    "Answer",
    "ArmChange",
    "arm_change",
    "change_answer",
    "change_verdict",
    "draw_change_figure",
    "signal_moved",
    "start_and_last",
    "training_trend",
]

CHANGE_RULE = (
    "Per run, Δ = last held-out evaluation − step-0 evaluation (the starting model on the same "
    "prompts). Per arm: the mean Δ with a Student-t 95% interval over seeds; with one seed, or "
    "seeds that all moved alike, Newcombe's 95% interval for pooled final − pooled start "
    "(conservative: it ignores the pairing). Raised / lowered when the interval excludes 0, "
    "else no change beyond noise."
)

# what the training rows of a policy-gradient run call the reward, the contrast and the length
TRAIN_REWARD = "avg_correctness"
ZERO_STD = "frac_reward_zero_std"
TRAIN_LENGTH = "response_length/mean"


@dataclass(frozen=True)
class Answer:
    """What the ``## Answer`` block shows. ``figure`` is relative to the campaign's asset folder."""

    verdict: str
    details: list[str] = field(default_factory=list)
    rule: str = ""
    budget: str = ""
    figure: str | None = None
    source: str = ""
    run_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ArmChange:
    """One arm's change of one held-out metric from the start."""

    arm: str
    metric: str
    starts: list[float]
    lasts: list[float]
    items: int | None  # held-out prompts per run
    change: Interval
    basis: str

    @property
    def start(self) -> float:
        return sum(self.starts) / len(self.starts)

    @property
    def last(self) -> float:
        return sum(self.lasts) / len(self.lasts)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _eval_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted((r for r in rows if r.get("phase") == "eval"), key=lambda r: r.get("step", 0))


def start_and_last(
    rows: Sequence[Mapping[str, Any]], metric: str
) -> tuple[float, float, int | None] | None:
    """(step-0 value, last value, held-out prompts) of an eval ``metric``; None without a step-0
    evaluation and a later one."""
    points = [(r.get("step"), _finite(r.get(metric)), r) for r in _eval_rows(rows)]
    points = [(s, v, r) for s, v, r in points if v is not None]
    if len(points) < 2 or points[0][0] != 0:
        return None
    n = _finite(points[-1][2].get("eval/num_prompts"))
    return points[0][1], points[-1][1], int(n) if n else None


def _is_share(values: Sequence[float]) -> bool:
    return all(0.0 <= v <= 1.0 for v in values)


def arm_change(
    arm: str, metric: str, per_run: Sequence[tuple[float, float, int | None]]
) -> ArmChange | None:
    """The arm's change of ``metric`` from the start by the module's rule; None without runs, or
    when one seed (or seeds that moved alike) leaves no noise estimate (not a share)."""
    if not per_run:
        return None
    starts = [p[0] for p in per_run]
    lasts = [p[1] for p in per_run]
    deltas = [b - a for a, b, _ in per_run]
    counts = {p[2] for p in per_run}
    items = counts.pop() if len(counts) == 1 else None
    spread = max(deltas) - min(deltas)
    if len(per_run) >= 2 and spread > 1e-12:
        iv = mean_interval(deltas)
        basis = f"t over {len(per_run)} seeds"
    elif items and _is_share(starts + lasts):
        total = items * len(per_run)
        last, start = sum(lasts) / len(lasts), sum(starts) / len(starts)
        iv = newcombe_difference(last, total, start, total)
        basis = f"Newcombe, {total} prompt evaluations"
    else:
        return None
    return ArmChange(arm, metric, starts, lasts, items, iv, basis)


def change_verdict(change: ArmChange, higher_is_better: bool = True) -> str:
    """'raised', 'lowered' or 'no change beyond noise' (direction-free words: whether a rise is
    good is the reader's metric, and the label says which metric it is)."""
    if change.change.low > 0:
        return "raised"
    if change.change.high < 0:
        return "lowered"
    return "no change beyond noise"


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "−") + _num(abs(x))


def change_text(change: ArmChange, label: str) -> str:
    """'**grpo**, held-out correctness: 0.31 → 0.45, Δ +0.14 (95% +0.05 … +0.23; t over 3
    seeds) — **raised**'."""
    iv = change.change
    return (
        f"**{change.arm}**, {label}: {_num(change.start)} → {_num(change.last)}, "
        f"Δ {_signed(iv.estimate)} (95% {_signed(iv.low)} … {_signed(iv.high)}; {change.basis})"
        f" — **{change_verdict(change)}**"
    )


def _late_vs_early(values: Sequence[float]) -> tuple[float, float] | None:
    if len(values) < 4:
        return None
    q = max(1, len(values) // 4)
    return sum(values[:q]) / q, sum(values[-q:]) / q


def signal_moved(rows_by_run: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[bool, str]:
    """Whether the training signal moved in these runs, with the evidence in words: the share of
    steps whose groups had reward contrast, and the training reward's first and last quarter."""
    contrast, early, late = [], [], []
    for rows in rows_by_run.values():
        train = [r for r in rows if r.get("phase") == "rollout"]
        zero = [v for r in train if (v := _finite(r.get(ZERO_STD))) is not None]
        contrast += [1.0 - z for z in zero]
        rewards = [v for r in train if (v := _finite(r.get(TRAIN_REWARD))) is not None]
        moved = _late_vs_early(rewards)
        if moved:
            early.append(moved[0])
            late.append(moved[1])
    if not contrast:
        return False, "no rollout rows: the training signal cannot be judged"
    share = sum(contrast) / len(contrast)
    text = f"groups with reward contrast: {share:.0%} of prompts over all steps"
    if early:
        a, b = sum(early) / len(early), sum(late) / len(late)
        text += f"; training {TRAIN_REWARD} first quarter {_num(a)} → last quarter {_num(b)}"
    adequate = share >= 0.25
    if not adequate:
        text += " — too few groups had contrast for the updates to carry a signal"
    return adequate, text


def training_trend(
    arm: str, rows: Sequence[Sequence[Mapping[str, Any]]], metric: str, label: str
) -> str | None:
    """'grpo, response length over training: first quarter 30.1 → last quarter 35.2, Δ +5.1
    (95% …; t over 3 seeds)': a training-row metric's last quarter of steps against its first,
    per run, then over seeds (a trend of the samples, not a held-out number). None without
    enough rows or with fewer than two runs."""
    diffs, early, late = [], [], []
    for run in rows:
        values = [v for r in run if r.get("phase") == "rollout" and (v := _finite(r.get(metric)))]
        moved = _late_vs_early(values)
        if moved:
            early.append(moved[0])
            late.append(moved[1])
            diffs.append(moved[1] - moved[0])
    if len(diffs) < 2 or max(diffs) - min(diffs) <= 1e-12:
        return None
    iv = mean_interval(diffs)
    word = "rose" if iv.low > 0 else "fell" if iv.high < 0 else "no trend beyond noise"
    return (
        f"**{arm}**, {label}: first quarter {_num(sum(early) / len(early))} → last quarter "
        f"{_num(sum(late) / len(late))}, Δ {_signed(iv.estimate)} (95% {_signed(iv.low)} … "
        f"{_signed(iv.high)}; t over {len(diffs)} seeds) — **{word}**"
    )


def change_answer(
    arms: Mapping[str, Sequence[str]],
    rows_by_run: Mapping[str, Sequence[Mapping[str, Any]]],
    metrics: Sequence[tuple[str, str]],
    trends: Sequence[tuple[str, str]] = (),
) -> Answer | None:
    """The change-from-start answer for ``arms`` ({arm label: run ids}), on ``metrics`` ((eval
    metric, its words), the headline first) and the training-row ``trends`` (e.g. response
    length over training). None when no arm has a start and an end."""
    changes: list[tuple[ArmChange, str]] = []
    for metric, label in metrics:
        for arm, run_ids in arms.items():
            per_run = [p for r in run_ids if (p := start_and_last(rows_by_run.get(r, []), metric))]
            change = arm_change(arm, metric, per_run)
            if change is not None:
                changes.append((change, label))
    if not changes:
        return None
    head_metric, head_label = metrics[0]
    head = [c for c, _ in changes if c.metric == head_metric]
    verdict = "; ".join(change_text(c, head_label) for c in head) if head else ""
    details = [change_text(c, label) for c, label in changes if c.metric != head_metric]
    for metric, label in trends:
        for arm, run_ids in arms.items():
            runs = [rows_by_run.get(r, []) for r in run_ids]
            if line := training_trend(arm, runs, metric, label):
                details.append(line)
    adequate, evidence = signal_moved(rows_by_run)
    budget = ("adequate: " if adequate else "not adequate: ") + evidence
    run_ids = [r for ids in arms.values() for r in ids]
    return Answer(
        verdict=verdict or details[0],
        details=details,
        rule=CHANGE_RULE,
        budget=budget,
        source="change from the start",
        run_ids=run_ids,
    )


def _mean_curve(
    series: Sequence[Sequence[tuple[float, float]]],
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Steps, mean, min and max across runs at the steps every run logged."""
    common = set.intersection(*(set(s for s, _ in run) for run in series)) if series else set()
    steps = sorted(common)
    at = [dict(run) for run in series]
    means = [sum(d[s] for d in at) / len(at) for s in steps]
    lows = [min(d[s] for d in at) for s in steps]
    highs = [max(d[s] for d in at) for s in steps]
    return steps, means, lows, highs


def _points(
    rows: Sequence[Mapping[str, Any]], metric: str, phase: str
) -> list[tuple[float, float]]:
    out = []
    for r in rows:
        if r.get("phase") == phase and (v := _finite(r.get(metric))) is not None:
            out.append((float(r.get("step", 0)), v))
    return out


def draw_change_figure(
    arms: Mapping[str, Sequence[str]],
    rows_by_run: Mapping[str, Sequence[Mapping[str, Any]]],
    panels: Sequence[tuple[str, str, str]],
    out_path: str | Path,
) -> Path | None:
    """One figure, a panel per (metric, phase, title): per arm the mean over its seeds with the
    seeds' range as a band. None (nothing written) when no panel has points."""
    curves: list[tuple[str, str, list]] = []
    for metric, phase, title in panels:
        per_arm = []
        for arm, run_ids in arms.items():
            series = [p for r in run_ids if (p := _points(rows_by_run.get(r, []), metric, phase))]
            if series:
                per_arm.append((arm, _mean_curve(series)))
        if per_arm:
            curves.append((title, phase, per_arm))
    if not curves:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rlhf_lab.results.plots import save_figure

    fig = Figure(figsize=(4.2 * len(curves), 3.4), dpi=100)
    FigureCanvasAgg(fig)
    for i, (title, _phase, per_arm) in enumerate(curves):
        ax = fig.add_subplot(1, len(curves), i + 1)
        for arm, (steps, means, lows, highs) in per_arm:
            (line,) = ax.plot(
                steps, means, marker="o" if len(steps) <= 30 else None, ms=3, label=arm
            )
            ax.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.2, lw=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.15, top=0.88, wspace=0.3)
    return save_figure(fig, out_path)
