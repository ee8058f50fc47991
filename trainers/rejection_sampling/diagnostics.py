"""How much a scorer can help selection, measured on the scored pool with verifier correctness.

Inputs: ``scores[i][j]`` (the scorer's value) and ``correct[i][j]`` (the verifier's verdict) for
completion j of prompt i. Outputs (``diagnose``):

* **decidable fraction**: share of prompts with at least one correct and one incorrect
  completion. Only those prompts let a per-prompt choice matter; an all-correct or all-wrong
  prompt gives the same correctness whichever completion is picked.
* **win rate** (decidable prompts only): the chance that the scorer's top pick (argmax, first
  index on ties) beats a uniformly random pick of the same prompt on correctness, ties counted
  half. With t = 1 if the top pick is correct and p = the prompt's share of correct completions:
  win = t(1 − p) + ½(t·p + (1 − t)(1 − p)). It is computed exactly (no sampling); a scorer that
  carries no information about correctness sits at 0.5 on average. ``top_hit_rate`` (share of
  decidable prompts whose top pick is correct) and ``random_hit_rate`` (mean p) are reported
  beside it.
* **best-of-n curve**, n = 1..N: over all prompts, the mean correctness of the argmax among the
  first n completions (``top``), of a uniformly random one of them (``random``, = their mean
  correctness), and whether any of them is correct (``oracle``, the ceiling).
* **score by correctness**: mean score of correct and of incorrect completions.

CLI on a cache file: ``python -m trainers.rejection_sampling.diagnostics --cache FILE
[--out-dir DIR]`` prints a summary and writes ``diagnostics.json`` and the plots.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainers.rejection_sampling.selection import argmax_first

PLOT_FILES = ("decidable.png", "win_rate.png", "best_of_n.png", "score_by_correctness.png")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _check(scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]]) -> None:
    if len(scores) != len(correct):
        raise ValueError(f"{len(scores)} score rows but {len(correct)} correctness rows")
    for i, (s, c) in enumerate(zip(scores, correct, strict=True)):
        if len(s) != len(c):
            raise ValueError(f"prompt {i}: {len(s)} scores but {len(c)} correctness flags")


def decidable_counts(correct: Sequence[Sequence[bool]]) -> dict[str, Any]:
    rows = [list(map(bool, row)) for row in correct if len(row) > 0]
    all_correct = sum(all(r) for r in rows)
    all_wrong = sum(not any(r) for r in rows)
    mixed = len(rows) - all_correct - all_wrong
    return {
        "num_prompts": len(rows),
        "all_correct": all_correct,
        "all_wrong": all_wrong,
        "mixed": mixed,
        "decidable_frac": mixed / len(rows) if rows else None,
    }


def win_rates(
    scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]]
) -> dict[str, Any]:
    """Top pick vs a uniform random pick on the decidable prompts (see the module docstring)."""
    _check(scores, correct)
    wins, tops, randoms, per_prompt = [], [], [], []
    for row_s, row_c in zip(scores, correct, strict=True):
        flags = [bool(c) for c in row_c]
        if not flags or all(flags) or not any(flags):
            continue
        t = 1.0 if flags[argmax_first(row_s)] else 0.0
        p = sum(flags) / len(flags)
        win = t * (1 - p) + 0.5 * (t * p + (1 - t) * (1 - p))
        wins.append(win)
        tops.append(t)
        randoms.append(p)
        per_prompt.append(win)
    return {
        "num_decidable": len(wins),
        "win_rate": _mean(wins),
        "top_hit_rate": _mean(tops),
        "random_hit_rate": _mean(randoms),
        "per_prompt_win": per_prompt,
    }


def best_of_n_curve(
    scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]]
) -> dict[str, list]:
    """Mean correctness of the argmax / a random pick / any, among the first n completions."""
    _check(scores, correct)
    rows = [(s, [bool(c) for c in cs]) for s, cs in zip(scores, correct, strict=True) if len(s)]
    if not rows:
        return {"n": [], "top": [], "random": [], "oracle": []}
    max_n = min(len(s) for s, _ in rows)
    out: dict[str, list] = {"n": [], "top": [], "random": [], "oracle": []}
    for n in range(1, max_n + 1):
        top = [float(c[argmax_first(s[:n])]) for s, c in rows]
        rnd = [sum(c[:n]) / n for _, c in rows]
        oracle = [float(any(c[:n])) for _, c in rows]
        out["n"].append(n)
        out["top"].append(sum(top) / len(rows))
        out["random"].append(sum(rnd) / len(rows))
        out["oracle"].append(sum(oracle) / len(rows))
    return out


def score_by_correctness(
    scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]]
) -> dict[str, Any]:
    _check(scores, correct)
    good, bad = [], []
    for row_s, row_c in zip(scores, correct, strict=True):
        for s, c in zip(row_s, row_c, strict=True):
            if s is None or (isinstance(s, float) and math.isnan(s)):
                continue
            (good if c else bad).append(float(s))
    mg, mb = _mean(good), _mean(bad)
    return {
        "correct_mean": mg,
        "incorrect_mean": mb,
        "gap": None if mg is None or mb is None else mg - mb,
        "correct_scores": good,
        "incorrect_scores": bad,
    }


def diagnose(scores: Sequence[Sequence[float]], correct: Sequence[Sequence[bool]]) -> dict:
    _check(scores, correct)
    flat = [bool(c) for row in correct for c in row]
    return {
        "pool_mean_correctness": _mean([float(c) for c in flat]),
        "pool_size": len(flat),
        "decidable": decidable_counts(correct),
        "win": win_rates(scores, correct),
        "best_of_n": best_of_n_curve(scores, correct),
        "score_by_correctness": score_by_correctness(scores, correct),
    }


def diagnostic_metrics(diag: dict) -> dict[str, float]:
    """The scalar ``diagnostics/…`` metrics of a :func:`diagnose` result (None values left out)."""
    curve = diag["best_of_n"]
    values = {
        "diagnostics/decidable_frac": diag["decidable"]["decidable_frac"],
        "diagnostics/all_correct_frac": _frac(diag, "all_correct"),
        "diagnostics/all_wrong_frac": _frac(diag, "all_wrong"),
        "diagnostics/win_rate": diag["win"]["win_rate"],
        "diagnostics/top_hit_rate": diag["win"]["top_hit_rate"],
        "diagnostics/random_hit_rate": diag["win"]["random_hit_rate"],
        "diagnostics/best_of_n_top": curve["top"][-1] if curve["top"] else None,
        "diagnostics/best_of_n_random": curve["random"][-1] if curve["random"] else None,
        "diagnostics/best_of_n_oracle": curve["oracle"][-1] if curve["oracle"] else None,
        "diagnostics/score_gap": diag["score_by_correctness"]["gap"],
    }
    return {k: float(v) for k, v in values.items() if v is not None}


def _frac(diag: dict, key: str) -> float | None:
    n = diag["decidable"]["num_prompts"]
    return diag["decidable"][key] / n if n else None


def summary_view(diag: dict) -> dict:
    """``diag`` without the long per-item lists (what summary.json / diagnostics.json keep)."""
    out = {k: v for k, v in diag.items() if k not in ("win", "score_by_correctness")}
    out["win"] = {k: v for k, v in diag["win"].items() if k != "per_prompt_win"}
    out["score_by_correctness"] = {
        k: v
        for k, v in diag["score_by_correctness"].items()
        if k not in ("correct_scores", "incorrect_scores")
    }
    return out


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def write_plots(diag: dict, out_dir: str | Path, title: str = "") -> list[Path]:
    """PNG files (matplotlib, Agg backend) in ``out_dir``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = f" — {title}" if title else ""
    written = []

    d = diag["decidable"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    labels = ["all wrong", "mixed (decidable)", "all correct"]
    counts = [d["all_wrong"], d["mixed"], d["all_correct"]]
    ax.bar(labels, counts, color=["#c44e52", "#4c72b0", "#55a868"])
    frac = d["decidable_frac"]
    ax.set_title(f"prompts by outcome (decidable {_pct(frac)}){suffix}", fontsize=9)
    ax.set_ylabel("prompts")
    written.append(_save(fig, out / "decidable.png", plt))

    w = diag["win"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.5))
    ax1.bar(
        ["top pick", "random pick"],
        [w["top_hit_rate"] or 0.0, w["random_hit_rate"] or 0.0],
        color=["#4c72b0", "#999999"],
    )
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("share correct (decidable prompts)")
    ax1.set_title(f"hit rate, {w['num_decidable']} decidable prompts", fontsize=9)
    if w["per_prompt_win"]:
        ax2.hist(w["per_prompt_win"], bins=10, range=(0, 1), color="#4c72b0")
    ax2.axvline(0.5, color="k", linestyle="--", linewidth=1)
    ax2.set_xlabel("P(top pick beats random), ties ½")
    ax2.set_title(f"win rate {_num(w['win_rate'])} (chance 0.5){suffix}", fontsize=9)
    written.append(_save(fig, out / "win_rate.png", plt))

    c = diag["best_of_n"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    if c["n"]:
        ax.plot(c["n"], c["top"], marker="o", label="scorer argmax")
        ax.plot(c["n"], c["random"], marker="s", label="random pick")
        ax.plot(c["n"], c["oracle"], linestyle="--", color="#999999", label="any correct")
    ax.set_xlabel("n (first n completions per prompt)")
    ax.set_ylabel("mean correctness")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(f"best-of-n{suffix}", fontsize=9)
    written.append(_save(fig, out / "best_of_n.png", plt))

    s = diag["score_by_correctness"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for values, label, color in (
        (s["correct_scores"], "correct", "#55a868"),
        (s["incorrect_scores"], "incorrect", "#c44e52"),
    ):
        if values:
            ax.hist(values, bins=20, alpha=0.6, label=f"{label} ({len(values)})", color=color)
    ax.set_xlabel("score")
    ax.set_ylabel("completions")
    ax.legend(fontsize=8)
    ax.set_title(f"score by correctness (gap {_num(s['gap'])}){suffix}", fontsize=9)
    written.append(_save(fig, out / "score_by_correctness.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def markdown_summary(diag: dict) -> str:
    d, w, c = diag["decidable"], diag["win"], diag["best_of_n"]
    s = diag["score_by_correctness"]
    lines = [
        f"- pool: {diag['pool_size']} completions, mean correctness "
        f"{_num(diag['pool_mean_correctness'])}",
        f"- prompts: {d['num_prompts']} — all correct {d['all_correct']}, all wrong "
        f"{d['all_wrong']}, mixed {d['mixed']} (decidable fraction {_num(d['decidable_frac'])})",
        f"- win rate of the top pick vs random on decidable prompts: {_num(w['win_rate'])} "
        f"(top hit {_num(w['top_hit_rate'])}, random hit {_num(w['random_hit_rate'])})",
        f"- mean score: correct {_num(s['correct_mean'])}, incorrect {_num(s['incorrect_mean'])}"
        f" (gap {_num(s['gap'])})",
        "",
        "| n | scorer argmax | random | any correct |",
        "|---|---|---|---|",
    ]
    for n, top, rnd, orc in zip(c["n"], c["top"], c["random"], c["oracle"], strict=True):
        lines.append(f"| {n} | {top:.3f} | {rnd:.3f} | {orc:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Diagnostics of a scored rejection-sampling cache")
    p.add_argument("--cache", required=True, help="a $RLHF_LAB_CACHE/rs_generations/<key>.json")
    p.add_argument("--out-dir", default=None, help="where to write plots + diagnostics.json")
    args = p.parse_args(argv)
    path = Path(args.cache)
    if not path.is_file():
        print(f"error: cache file not found: {path}", file=sys.stderr)
        return 2
    data = json.loads(path.read_text())
    prompts = data.get("prompts")
    if not isinstance(prompts, list) or not all("scores" in r and "correct" in r for r in prompts):
        print(f"error: {path} is not a scored rejection-sampling cache", file=sys.stderr)
        return 2
    diag = diagnose([r["scores"] for r in prompts], [r["correct"] for r in prompts])
    print(markdown_summary(diag))
    if args.out_dir:
        from trainers.core.rundir import atomic_write_json

        out = Path(args.out_dir)
        write_plots(diag, out, title=path.stem)
        atomic_write_json(out / "diagnostics.json", summary_view(diag))
        print(f"\nplots and diagnostics.json written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
