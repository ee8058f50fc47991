"""The four selection strategies: pure functions of a score matrix (and a seed).

``scores[i][j]`` is the score of completion j of prompt i (rows may differ in length). Every
strategy returns a list of picks ``(prompt index, completion index)``:

* ``top_per_prompt``: the highest-scoring completion of each prompt (ties -> the lowest index);
  one pick per prompt.
* ``top_k_overall``: the k highest-scoring completions of the flattened pool (a stable sort, so
  ties keep pool order: prompt-major, then completion index); a prompt may appear several times
  or not at all.
* ``random_per_prompt``: one uniformly random completion per prompt (``random.Random(seed)``);
  the matched control of ``top_per_prompt`` (same size, same prompts).
* ``random_k_overall``: k completions drawn uniformly without replacement from the flattened pool
  (seeded); the matched control of ``top_k_overall`` (same size).

NaN scores rank below every number. ``python -m trainers.rejection_sampling.selection`` prints a
worked example.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from trainers.rejection_sampling.spec import FAMILY as RS_FAMILY

Pick = tuple[int, int]


def _rank_value(score: float) -> float:
    score = float(score)
    return -math.inf if math.isnan(score) else score


def argmax_first(row: Sequence[float]) -> int:
    """Index of the largest score in ``row``; the first one on ties (NaN counts as lowest)."""
    if len(row) == 0:
        raise ValueError("argmax of an empty row")
    best = 0
    for j in range(1, len(row)):
        if _rank_value(row[j]) > _rank_value(row[best]):
            best = j
    return best


def _flat(scores: Sequence[Sequence[float]]) -> list[Pick]:
    return [(i, j) for i, row in enumerate(scores) for j in range(len(row))]


def top_per_prompt(scores: Sequence[Sequence[float]]) -> list[Pick]:
    return [(i, argmax_first(row)) for i, row in enumerate(scores) if len(row) > 0]


def top_k_overall(scores: Sequence[Sequence[float]], k: int) -> list[Pick]:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    pool = _flat(scores)
    ranked = sorted(pool, key=lambda p: -_rank_value(scores[p[0]][p[1]]))  # stable
    return ranked[:k]


def random_per_prompt(scores: Sequence[Sequence[float]], seed: int) -> list[Pick]:
    rng = random.Random(seed)
    return [(i, rng.randrange(len(row))) for i, row in enumerate(scores) if len(row) > 0]


def random_k_overall(scores: Sequence[Sequence[float]], k: int, seed: int) -> list[Pick]:
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    pool = _flat(scores)
    return random.Random(seed).sample(pool, min(k, len(pool)))


def _select_top_per_prompt(scores: Sequence[Sequence[float]], top_k: int, seed: int) -> list[Pick]:
    return top_per_prompt(scores)


def _select_top_k_overall(scores: Sequence[Sequence[float]], top_k: int, seed: int) -> list[Pick]:
    return top_k_overall(scores, top_k)


def _select_random_per_prompt(
    scores: Sequence[Sequence[float]], top_k: int, seed: int
) -> list[Pick]:
    return random_per_prompt(scores, seed)


def _select_random_k_overall(
    scores: Sequence[Sequence[float]], top_k: int, seed: int
) -> list[Pick]:
    return random_k_overall(scores, top_k, seed)


SelectionFn = Callable[[Sequence[Sequence[float]], int, int], list[Pick]]

SELECTIONS: dict[str, SelectionFn] = {
    "top_per_prompt": _select_top_per_prompt,
    "top_k_overall": _select_top_k_overall,
    "random_per_prompt": _select_random_per_prompt,
    "random_k_overall": _select_random_k_overall,
}
"""Selection rules by name, with one signature (scores, top_k, seed); a strategy's spec
(``trainers/rejection_sampling/spec.py``) names the one it uses."""


def select(
    strategy: str, scores: Sequence[Sequence[float]], *, top_k: int, seed: int
) -> list[Pick]:
    """Dispatch by the strategy's spec; ``top_k`` is used by the two ``*_k_overall`` strategies
    only."""
    names = RS_FAMILY.algorithm_names
    if strategy not in names:
        raise ValueError(f"unknown strategy {strategy!r}; use {', '.join(names)}")
    rule = RS_FAMILY.algorithm(strategy).selection or strategy
    return SELECTIONS[rule](scores, top_k, seed)


def _demo() -> None:
    scores = [
        [0.2, 0.9, 0.1, 0.9],
        [0.5, 0.4, 0.3, 0.1],
        [0.0, 0.1, 0.8, 0.7],
    ]
    print("scores (3 prompts x 4 completions):")
    for i, row in enumerate(scores):
        print(f"  prompt {i}: {row}")
    for name in ("top_per_prompt", "random_per_prompt", "top_k_overall", "random_k_overall"):
        picks = select(name, scores, top_k=4, seed=42)
        values = [scores[i][j] for i, j in picks]
        print(f"{name:18s} picks {picks}  mean score {sum(values) / len(values):.3f}")
    assert top_per_prompt(scores) == [(0, 1), (1, 0), (2, 2)]  # tie in row 0 -> index 1
    assert top_k_overall(scores, 4) == [(0, 1), (0, 3), (2, 2), (2, 3)]


if __name__ == "__main__":
    _demo()
