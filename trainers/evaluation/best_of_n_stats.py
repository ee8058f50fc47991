"""Best-of-n selection statistics, as pure functions of per-sample numbers (stdlib only: the lab
imports this module to analyse a ``best_of_n`` evaluation offline).

Every prompt has ``N`` samples (``n_max``), each with the verifier's verdict (``correct``), its
extracted answer (or None), an ORM score and a PRM score. For a subset size ``n`` (1, 2, 4, …,
N) and a selector, the per-prompt value is the **expected correctness of the sample the selector
picks from a uniformly random n-subset** of the N samples — computed once from all N samples,
instead of drawing N/n disjoint groups, which wastes samples (Lightman et al. 2023, appendix):

* ``random``: any sample of the subset → the prompt's mean correctness (exact).
* ``orm`` / ``prm``: the subset's highest-scored sample. Sorting the N scores from best to
  worst, the k-th best (1-based) is the best of a random n-subset with probability
  ``C(N − k, n − 1) / C(N, n)`` (it is in the subset and the n − 1 others are all worse):
  exact (:func:`argmax_weights`). Tied scores are broken uniformly at random, so within a tied
  block the weights of its ranks fall on the block's mean correctness.
* ``majority``: the most frequent extracted answer of the subset (samples without an answer do
  not vote; if none votes, a random sample of the subset is taken, which is counted by its own
  verdict); a tie between answers is broken uniformly at random, and the picked answer's
  correctness is that of a sample holding it. Exact by enumerating every subset when there are
  at most ``exact_limit`` of them, else the mean over ``draws`` random subsets from
  ``random.Random(seed)`` (:func:`majority_value`).

Intervals: the prompt is the resampled unit (its samples travel together). An accuracy takes
:func:`trainers.evaluation.statistics.proportion_estimate` (Wilson when every per-prompt value is
0 or 1, else the prompt bootstrap); a paired difference between selectors at the same n, and the
growth of a lead from the smallest n > 1 to N, take the bootstrap of the per-prompt differences
(:func:`trainers.evaluation.statistics.mean_estimate`).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainers.evaluation import statistics as st

__all__ = [
    "SELECTORS",
    "BestOfNTable",
    "PromptSamples",
    "argmax_value",
    "argmax_weights",
    "best_of_n_table",
    "majority_value",
    "prompt_values",
    "subset_sizes",
]

SELECTORS: tuple[str, ...] = ("orm", "prm", "majority", "random")
COMPARED: tuple[tuple[str, str], ...] = (("prm", "orm"), ("prm", "majority"))
EXACT_LIMIT = 5000
DRAWS = 2000


@dataclass(frozen=True)
class PromptSamples:
    """One prompt's N samples: verdicts, extracted answers and the two reward models' scores."""

    correct: Sequence[bool]
    answers: Sequence[str | None]
    orm: Sequence[float]
    prm: Sequence[float]

    def __post_init__(self) -> None:
        sizes = {len(self.correct), len(self.answers), len(self.orm), len(self.prm)}
        if len(sizes) != 1 or not self.correct:
            raise ValueError(
                f"a prompt needs the same positive number of verdicts, answers, ORM and PRM "
                f"scores, got {len(self.correct)}, {len(self.answers)}, {len(self.orm)}, "
                f"{len(self.prm)}"
            )

    @property
    def n_max(self) -> int:
        return len(self.correct)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> PromptSamples:
        """From a ``best_of_n.jsonl`` row (``samples``: dicts with ``correct``, ``answer``,
        ``orm``, ``prm``)."""
        samples = row["samples"]
        return cls(
            correct=[bool(s["correct"]) for s in samples],
            answers=[s.get("answer") for s in samples],
            orm=[float(s["orm"]) for s in samples],
            prm=[float(s["prm"]) for s in samples],
        )


def subset_sizes(n_max: int) -> list[int]:
    """1, 2, 4, … up to ``n_max``, with ``n_max`` itself last when it is no power of two."""
    if n_max < 1:
        raise ValueError(f"n_max must be >= 1, got {n_max}")
    sizes = [1 << k for k in range(n_max.bit_length()) if (1 << k) <= n_max]
    return sizes if sizes[-1] == n_max else [*sizes, n_max]


def argmax_weights(n_max: int, n: int) -> list[float]:
    """P(the k-th best of ``n_max`` samples is the best of a uniformly random ``n``-subset), for
    k = 1 … n_max: ``C(n_max − k, n − 1) / C(n_max, n)``; they sum to 1."""
    if not 1 <= n <= n_max:
        raise ValueError(f"subset size {n} must be between 1 and n_max ({n_max})")
    total = math.comb(n_max, n)
    return [math.comb(n_max - k, n - 1) / total for k in range(1, n_max + 1)]


def argmax_value(scores: Sequence[float], correct: Sequence[bool], n: int) -> float:
    """Expected correctness of the highest-scored sample of a random ``n``-subset, ties between
    equal scores broken uniformly at random (exact)."""
    if len(scores) != len(correct):
        raise ValueError("scores and verdicts differ in length")
    weights = argmax_weights(len(scores), n)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    value, start = 0.0, 0
    while start < len(order):  # one block of equal scores at a time
        end = start
        while end < len(order) and scores[order[end]] == scores[order[start]]:
            end += 1
        block_mean = sum(bool(correct[i]) for i in order[start:end]) / (end - start)
        value += sum(weights[start:end]) * block_mean
        start = end
    return value


def _majority_of(subset: Sequence[int], answers, correct) -> float:
    """Expected correctness of the majority vote over ``subset`` (indices), ties at random."""
    votes = Counter(answers[i] for i in subset if answers[i] is not None)
    if not votes:  # nobody answered: a random sample of the subset
        return sum(bool(correct[i]) for i in subset) / len(subset)
    top = max(votes.values())
    winners = [a for a, c in votes.items() if c == top]
    verdict = {answers[i]: bool(correct[i]) for i in subset if answers[i] is not None}
    return sum(verdict[a] for a in winners) / len(winners)


def majority_value(
    p: PromptSamples, n: int, *, exact_limit: int = EXACT_LIMIT, draws: int = DRAWS, seed: int = 0
) -> float:
    """Expected correctness of the majority vote of a random ``n``-subset (module doc): every
    subset when ``C(N, n) <= exact_limit``, else ``draws`` random subsets (``Random(seed)``)."""
    N = p.n_max
    if not 1 <= n <= N:
        raise ValueError(f"subset size {n} must be between 1 and n_max ({N})")
    if math.comb(N, n) <= exact_limit:
        subsets: Any = itertools.combinations(range(N), n)
        count = math.comb(N, n)
    else:
        rng = random.Random(seed)
        subsets = (rng.sample(range(N), n) for _ in range(draws))
        count = draws
    return sum(_majority_of(s, p.answers, p.correct) for s in subsets) / count


def prompt_values(
    p: PromptSamples, sizes: Sequence[int], *, seed: int = 0, draws: int = DRAWS
) -> dict[str, dict[int, float]]:
    """Per selector, per subset size: this prompt's expected correctness."""
    mean = sum(bool(c) for c in p.correct) / p.n_max
    return {
        "orm": {n: argmax_value(p.orm, p.correct, n) for n in sizes},
        "prm": {n: argmax_value(p.prm, p.correct, n) for n in sizes},
        "majority": {n: majority_value(p, n, seed=seed + n, draws=draws) for n in sizes},
        "random": dict.fromkeys(sizes, mean),
    }


@dataclass
class BestOfNTable:
    """Accuracy per selector and subset size, the paired leads, and the growth of each lead."""

    sizes: list[int]
    n_prompts: int
    accuracy: dict[str, dict[int, st.Estimate]]
    lead: dict[str, dict[int, st.Estimate]]  # "prm-orm" / "prm-majority" -> n -> difference
    growth: dict[str, st.Estimate]  # lead at n_max minus lead at the smallest n > 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "sizes": self.sizes,
            "n_prompts": self.n_prompts,
            "accuracy": {
                s: {str(n): e.as_dict() for n, e in d.items()} for s, d in self.accuracy.items()
            },
            "lead": {s: {str(n): e.as_dict() for n, e in d.items()} for s, d in self.lead.items()},
            "growth": {s: e.as_dict() for s, e in self.growth.items()},
        }


def pooled_values(per_run: Sequence[Sequence[dict[str, dict[int, float]]]]) -> list[dict]:
    """Per-prompt values of several evaluations of the same prompts (e.g. sampling seeds),
    averaged prompt by prompt: the prompt stays the resampled unit."""
    if not per_run:
        raise ValueError("no evaluation to pool")
    n_prompts = {len(r) for r in per_run}
    if len(n_prompts) != 1:
        raise ValueError(f"the evaluations hold different numbers of prompts: {sorted(n_prompts)}")
    out = []
    for rows in zip(*per_run, strict=True):
        out.append(
            {
                sel: {n: sum(r[sel][n] for r in rows) / len(rows) for n in rows[0][sel]}
                for sel in rows[0]
            }
        )
    return out


def best_of_n_table(
    values: Sequence[dict[str, dict[int, float]]],
    *,
    resamples: int = st.RESAMPLES,
    level: float = st.LEVEL,
    seed: int = 0,
) -> BestOfNTable:
    """The table of per-prompt ``values`` (:func:`prompt_values`, one dict per prompt)."""
    if not values:
        raise ValueError("no prompt to summarise")
    sizes = sorted(values[0]["random"])
    kw = {"resamples": resamples, "level": level, "seed": seed}
    accuracy = {
        sel: {n: st.proportion_estimate([v[sel][n] for v in values], **kw) for n in sizes}
        for sel in SELECTORS
    }
    lead, growth = {}, {}
    first = next((n for n in sizes if n > 1), sizes[0])
    for a, b in COMPARED:
        name = f"{a}-{b}"
        lead[name] = {n: st.mean_estimate([v[a][n] - v[b][n] for v in values], **kw) for n in sizes}
        last = sizes[-1]
        growth[name] = st.mean_estimate(
            [(v[a][last] - v[b][last]) - (v[a][first] - v[b][first]) for v in values], **kw
        )
    return BestOfNTable(sizes, len(values), accuracy, lead, growth)
