"""Gold against KL for a DPO-overoptimisation campaign: does the verifier's score of the policy's
greedy answers rise and then fall as the policy drifts from the reference, and where? Torch-free.

Input: the campaign's offline direct-alignment runs that logged the gold evaluation
(``trainers/direct_alignment/gold.py``: ``eval/gold_correctness`` and ``eval/sqrt_kl`` on every
eval row, the per-prompt ``right`` flags in ``eval_gold.jsonl``). The arm of a run is its β
(``beta=0.1``); its seeds are the arm's runs.

Per arm, at every eval step that all its seeds logged:

* the **curve**: the gold correctness averaged over seeds (the band: the lowest and highest seed)
  against the mean √KL over seeds;
* the **peak**: the eval point of highest mean gold (the first, on a tie); **start** = step 0,
  **last** = the last eval point;
* three paired differences with 95% intervals: rise = peak − start, fall = last − peak,
  change = last − start.

**Interval rule** (one, used throughout): the paired difference over prompts, pooled over seeds.
Each seed's run scores the same held-out prompts at both eval points, so each (seed, prompt)
gives one paired difference d ∈ {−1, 0, 1} (right at the later point minus right at the earlier);
the estimate is the mean of the d over all seeds × prompts, with the Student-t interval
mean ± t*(n−1)·s/√n over those n pairs. It measures the evaluation's sampling noise (which
prompts happen to be held out), not the seed-to-seed spread of training; with 3 seeds a t
interval over seeds (2 degrees of freedom) would be the other choice and is much wider. When no
pair is discordant (s = 0) the interval is ±the Wilson 95% upper bound of a 0/n share instead of
a point (every pair moving the same way: from the Wilson lower bound of n/n to the estimate).
When a run has no ``eval_gold.jsonl`` the arm falls back to the t interval over seeds of the
per-run differences of ``eval/gold_correctness`` (``method`` says which rule applied). The peak
is chosen on the same data, so rise is biased upward and fall downward (a winner's curse): read
a verdict near the edge with that in mind.

**Verdict** per arm: "rises then falls" when rise > 0 AND fall < 0, each interval excluding 0;
"rises and holds" when rise > 0 and the fall's interval does not exclude 0 from below; "falls
from the start" when rise is not > 0 and change < 0; else "never rises".

:func:`gold_vs_kl` takes plain rows (testable); :func:`campaign_gold_vs_kl` reads a campaign's
runs and draws the figure into its ``plots/`` (gold (y) against √KL (x), one line per β).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_lab.results.stats import Interval, mean_interval, wilson_interval
from rlhf_lab.runs.folder import read_json_lines, read_metric_rows

__all__ = [
    "ArmGold",
    "GoldVsKL",
    "RunGold",
    "arm_gold",
    "campaign_gold_vs_kl",
    "gold_vs_kl",
    "hump_verdict",
    "paired_difference",
    "plot_gold_vs_kl",
]

GOLD = "eval/gold_correctness"
SQRT_KL = "eval/sqrt_kl"
FIGURE = "gold-vs-kl.png"
PROMPT_RULE = (
    "95% paired interval over prompts pooled over seeds (Student-t on the (seed, prompt) "
    "differences of right/wrong)"
)
SEED_RULE = "95% Student-t interval over seeds of the per-run differences of gold correctness"


@dataclass(frozen=True)
class RunGold:
    """One run: its arm, its eval rows (``step``, ``eval/gold_correctness``, ``eval/sqrt_kl``)
    and, when read, the per-prompt right flags by step (``eval_gold.jsonl``)."""

    arm: str
    evals: list[dict[str, Any]]
    right: dict[int, list[float]] | None = None
    run_id: str = ""


@dataclass(frozen=True)
class ArmGold:
    """One arm's curve, peak, the three differences and the verdict."""

    arm: str
    seeds: int
    steps: list[int]
    gold: list[float]
    gold_low: list[float]
    gold_high: list[float]
    sqrt_kl: list[float]
    peak_step: int
    rise: Interval
    fall: Interval
    change: Interval
    verdict: str

    @property
    def peak_index(self) -> int:
        return self.steps.index(self.peak_step)

    def line(self) -> str:
        i, f = self.peak_index, _fmt
        return (
            f"{self.arm} ({self.seeds} seeds): {self.verdict}; gold {f(self.gold[0])} at step 0 "
            f"→ peak {f(self.gold[i])} at step {self.peak_step} (√KL {self.sqrt_kl[i]:.3g}) → "
            f"{f(self.gold[-1])} at step {self.steps[-1]} (√KL {self.sqrt_kl[-1]:.3g}); "
            f"peak − start {_iv(self.rise)}, last − peak {_iv(self.fall)}"
        )


@dataclass(frozen=True)
class GoldVsKL:
    """The answer for the ledger: a one-line ``verdict`` over the arms, each arm's numbers with
    their intervals (``arms``, :meth:`lines`), the interval rule and the figure's path."""

    verdict: str
    arms: list[ArmGold]
    method: str
    figure: str | None = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [a.line() for a in self.arms] + [f"intervals: {self.method}"] + self.notes


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def _iv(iv: Interval) -> str:
    return f"{iv.estimate:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


# ---------------------------------------------------------------------------------------------
# Intervals and the verdict
# ---------------------------------------------------------------------------------------------


def paired_difference(later: Sequence[float], earlier: Sequence[float]) -> Interval:
    """Mean of ``later[i] − earlier[i]`` with its 95% t interval over the pairs; no discordant
    pair: ±the Wilson upper bound of 0/n (module doc)."""
    if len(later) != len(earlier) or not later:
        raise ValueError("paired_difference needs two equally long, non-empty lists")
    diffs = [a - b for a, b in zip(later, earlier, strict=True)]
    if len(diffs) >= 2 and any(d != diffs[0] for d in diffs):
        return mean_interval(diffs)
    if any(diffs):  # every pair moved the same way: the t interval is a point
        est = diffs[0]
        w = wilson_interval(1.0, len(diffs)).low
        return Interval(est, est * w, est) if est > 0 else Interval(est, est, est * w)
    bound = wilson_interval(0.0, len(diffs)).high
    return Interval(0.0, -bound, bound)


def hump_verdict(rise: Interval, fall: Interval, change: Interval) -> str:
    """The arm's verdict from its three differences (module doc)."""
    if rise.low > 0:
        return "rises then falls" if fall.high < 0 else "rises and holds"
    return "falls from the start" if change.high < 0 else "never rises"


# ---------------------------------------------------------------------------------------------
# One arm
# ---------------------------------------------------------------------------------------------


def _by_step(run: RunGold) -> dict[int, dict[str, Any]]:
    """The run's last eval row per step that logged gold (a resumed run may repeat one)."""
    out: dict[int, dict[str, Any]] = {}
    for row in run.evals:
        if isinstance(row.get(GOLD), int | float) and isinstance(row.get(SQRT_KL), int | float):
            out[int(row["step"])] = row
    return out


def _pairs(runs: list[RunGold], later: int, earlier: int, by_prompt: bool) -> Interval:
    if by_prompt:
        a = [x for r in runs for x in r.right[later]]  # type: ignore[index]
        b = [x for r in runs for x in r.right[earlier]]  # type: ignore[index]
        return paired_difference(a, b)
    rows = [_by_step(r) for r in runs]
    return paired_difference([s[later][GOLD] for s in rows], [s[earlier][GOLD] for s in rows])


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def arm_gold(arm: str, runs: list[RunGold]) -> tuple[ArmGold, bool] | None:
    """The arm's :class:`ArmGold` and whether the prompt-level rule applied; None when its seeds
    share fewer than two eval steps with gold, or step 0 is missing."""
    rows = [_by_step(r) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in rows))) if rows else []
    if len(steps) < 2 or steps[0] != 0:
        return None
    by_prompt = all(
        r.right is not None
        and all(s in r.right for s in steps)
        and len({len(r.right[s]) for s in steps}) == 1
        for r in runs
    )
    gold = [[s[t][GOLD] for s in rows] for t in steps]
    kl = [_mean([s[t][SQRT_KL] for s in rows]) for t in steps]
    means = [_mean(g) for g in gold]
    peak = steps[max(range(len(steps)), key=lambda i: (means[i], -i))]
    rise = _pairs(runs, peak, 0, by_prompt)
    fall = _pairs(runs, steps[-1], peak, by_prompt)
    change = _pairs(runs, steps[-1], 0, by_prompt)
    result = ArmGold(
        arm=arm,
        seeds=len(runs),
        steps=steps,
        gold=means,
        gold_low=[min(g) for g in gold],
        gold_high=[max(g) for g in gold],
        sqrt_kl=kl,
        peak_step=peak,
        rise=rise,
        fall=fall,
        change=change,
        verdict=hump_verdict(rise, fall, change),
    )
    return result, by_prompt


def _arm_order(arm: str) -> tuple[float, str]:
    try:
        return float(arm.split("=", 1)[1]), arm
    except (IndexError, ValueError):
        return math.inf, arm


def gold_vs_kl(runs: list[RunGold]) -> GoldVsKL:
    """Every arm's curve and verdict (arms by β, smallest first); arms without a usable curve
    are named in ``notes``."""
    groups: dict[str, list[RunGold]] = {}
    for r in runs:
        groups.setdefault(r.arm, []).append(r)
    arms, notes, rules = [], [], set()
    for name in sorted(groups, key=_arm_order):
        got = arm_gold(name, groups[name])
        if got is None:
            notes.append(f"{name}: no gold curve (its runs share no step-0 and later gold eval)")
            continue
        arms.append(got[0])
        rules.add(got[1])
    method = " / ".join(r for r, used in ((PROMPT_RULE, True), (SEED_RULE, False)) if used in rules)
    verdict = "; ".join(
        f"{a.arm}: {a.verdict} (peak at step {a.peak_step}, √KL {a.sqrt_kl[a.peak_index]:.3g})"
        for a in arms
    )
    return GoldVsKL(verdict=verdict or "no gold curve", arms=arms, method=method, notes=notes)


# ---------------------------------------------------------------------------------------------
# The figure and the campaign reader
# ---------------------------------------------------------------------------------------------


def plot_gold_vs_kl(arms: list[ArmGold], out_path: str | Path, title: str = "") -> str | None:
    """Gold correctness (y) against mean √KL (x), one line per arm through the seeds' mean, a
    vertical bar per point spanning the lowest to the highest seed; the peak ringed. None when
    there is no arm."""
    if not arms:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rlhf_lab.results.plots import save_figure

    fig = Figure(figsize=(6.4, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for a in arms:
        low = [m - lo for m, lo in zip(a.gold, a.gold_low, strict=True)]
        high = [hi - m for m, hi in zip(a.gold, a.gold_high, strict=True)]
        bars = ax.errorbar(
            a.sqrt_kl,
            a.gold,
            yerr=[low, high],
            marker="o",
            ms=4,
            lw=1.5,
            capsize=2,
            label=f"{a.arm}: {a.verdict}",
        )
        i = a.peak_index
        ax.scatter(
            [a.sqrt_kl[i]],
            [a.gold[i]],
            s=90,
            facecolors="none",
            edgecolors=bars[0].get_color(),
            linewidths=1.5,
            zorder=3,
        )
    ax.set_xlabel("√KL(π ‖ π_ref) per sequence (mean over seeds; sampled answers)", fontsize=8)
    ax.set_ylabel("gold: share of held-out prompts answered right (greedy)", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    return str(save_figure(fig, out_path))


def read_run_gold(run_dir: Path, run_id: str = "") -> RunGold | None:
    """A run folder's :class:`RunGold` (arm ``beta=<β>`` from config.yaml), None when it logged
    no gold evaluation."""
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    evals = [
        r for r in read_metric_rows(run_dir / "metrics.jsonl").rows if r.get("phase") == "eval"
    ]
    if not any(GOLD in r for r in evals):
        return None
    lines = read_json_lines(run_dir / "eval_gold.jsonl").rows
    right = {int(x["step"]): list(map(float, x["right"])) for x in lines} if lines else None
    return RunGold(f"beta={config.get('beta')}", evals, right, run_id or run_dir.name)


def campaign_gold_vs_kl(campaign: str) -> GoldVsKL:
    """:func:`gold_vs_kl` over the campaign's direct-alignment runs, the figure written to
    ``<campaign>/plots/gold-vs-kl.png``."""
    from rlhf_lab.ledger.campaigns import resolve_campaign
    from rlhf_lab.ledger.layout import _asset_dir
    from rlhf_lab.paths import find_run
    from rlhf_lab.results.campaign_runs import campaign_run_ids

    name = resolve_campaign(campaign)
    runs = [
        got
        for rid in campaign_run_ids(name, family="direct_alignment")
        if (got := read_run_gold(find_run(rid), rid)) is not None
    ]
    result = gold_vs_kl(runs)
    path = plot_gold_vs_kl(result.arms, _asset_dir(name) / "plots" / FIGURE, title=name)
    return GoldVsKL(result.verdict, result.arms, result.method, path, result.notes)
