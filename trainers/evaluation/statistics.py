"""The statistics of the evaluation suites, as pure functions of numbers and texts.

Stdlib only (no torch, no numpy): the lab may import this module to compare cached evaluations.
Means and paired differences take a percentile bootstrap with a seeded generator, so an
evaluation written twice with the same seed reports the same interval. A proportion whose items
are each 0 or 1 (one sample per prompt, or a prompt's samples all agree) takes the Wilson score
interval instead: a bootstrap of 0/128 correct resamples nothing but zeros and reports the point
[0, 0], while Wilson's 95 % upper bound for 0/128 is ~0.029.

* :func:`pass_at_k` — the unbiased pass@k estimator of one prompt (n samples, c correct).
* :func:`bootstrap` / :func:`mean_estimate` — a statistic of resampled items, its 95 % interval.
* :func:`wilson` / :func:`proportion_estimate` — a share of 0/1 items and its Wilson interval.
* :func:`win_tie_loss` — win, tie and loss shares and the win rate (a tie counts half).
* :func:`length_controlled_win_rate` — the win rate within buckets of the length difference,
  averaged with the target-longer and target-shorter halves of each bucket weighted equally.
* :func:`distinct_n`, :func:`repetition_rate`, :func:`never_ending_share` — generation health.

The formulas and their caveats are in ``trainers/evaluation/README.md``.
"""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, TypeVar

T = TypeVar("T")

LEVEL = 0.95
RESAMPLES = 1000

__all__ = [
    "LEVEL",
    "RESAMPLES",
    "Estimate",
    "bootstrap",
    "distinct_n",
    "length_buckets",
    "length_controlled_win_rate",
    "mean_estimate",
    "never_ending_share",
    "pass_at_k",
    "percentile",
    "proportion_estimate",
    "repetition_rate",
    "wilson",
    "win_tie_loss",
    "words",
]


@dataclass(frozen=True)
class Estimate:
    """A value with its two-sided interval at ``level`` over ``n`` items. ``low`` and ``high``
    are None when there is no interval (fewer than two items, or the statistic is undefined on
    every resample); ``value`` is None when the statistic is undefined. ``method``: how the
    interval was made (``bootstrap`` or ``wilson``)."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    level: float = LEVEL
    method: str = "bootstrap"

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "method": self.method,
        }

    def covers(self, x: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= x <= self.high


# ---------------------------------------------------------------------------------------------
# pass@k
# ---------------------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct:
    ``1 − C(n−c, k) / C(n, k)``, computed as ``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` (no large
    binomials). Needs ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


# ---------------------------------------------------------------------------------------------
# The bootstrap
# ---------------------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0 <= q <= 1) of sorted values, linear between order statistics."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap(
    items: Sequence[T],
    statistic: Callable[[Sequence[T]], float | None],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Estimate:
    """``statistic(items)`` with its percentile-bootstrap interval: ``resamples`` draws of
    ``len(items)`` items with replacement (``random.Random(seed)``), the statistic of each,
    and the ``(1−level)/2`` and ``(1+level)/2`` quantiles of those. Resamples on which the
    statistic is undefined (None) are left out."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    items = list(items)
    n = len(items)
    value = statistic(items) if items else None
    if n < 2 or value is None:
        return Estimate(value, None, None, n, level)
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        s = statistic(rng.choices(items, k=n))
        if s is not None:
            stats.append(s)
    if not stats:
        return Estimate(value, None, None, n, level)
    stats.sort()
    tail = (1.0 - level) / 2
    return Estimate(value, percentile(stats, tail), percentile(stats, 1.0 - tail), n, level)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def mean_estimate(
    values: Sequence[float], *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> Estimate:
    """The mean of ``values`` (one per independent item, e.g. per prompt) with its interval."""
    return bootstrap([float(v) for v in values], _mean, resamples=resamples, level=level, seed=seed)


# ---------------------------------------------------------------------------------------------
# Proportions
# ---------------------------------------------------------------------------------------------


def wilson(successes: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n`` (``n`` >= 1): it never collapses
    to a point, also at 0/n and n/n (0/128 at 95 %: [0, 0.0289])."""
    if n < 1:
        raise ValueError(f"a Wilson interval needs n >= 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}")
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def proportion_estimate(
    values: Sequence[float], *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> Estimate:
    """The share behind per-item values in [0, 1] (one per prompt: 0/1, or the mean of the
    prompt's samples) with its interval. Every value 0 or 1: the Wilson interval on the number
    of items (the bootstrap would report a point at 0/n and n/n). Otherwise, several samples per
    prompt that disagree: the prompt bootstrap (:func:`mean_estimate`), which keeps the samples
    of one prompt together."""
    xs = [float(v) for v in values if v is not None]
    if not xs or not _binary(xs):
        return mean_estimate(xs, resamples=resamples, level=level, seed=seed)
    low, high = wilson(sum(xs), len(xs), level)
    return Estimate(sum(xs) / len(xs), low, high, len(xs), level, method="wilson")


# ---------------------------------------------------------------------------------------------
# Win rates
# ---------------------------------------------------------------------------------------------

WIN, TIE, LOSS = 1, 0, -1


def _points(outcome: int) -> float:
    return 1.0 if outcome > 0 else 0.5 if outcome == 0 else 0.0


def _clusters(items: Sequence[Any]) -> list[list[Any]]:
    """Items as clusters: a list or tuple of outcomes is one cluster (the samples of one
    prompt, resampled together), anything else a cluster of one."""
    return [list(x) if isinstance(x, list) else [x] for x in items]


def _flat(clusters: Sequence[Sequence[T]]) -> list[T]:
    return [x for c in clusters for x in c]


def win_tie_loss(
    outcomes: Sequence[int | list[int]],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> dict[str, Estimate]:
    """Outcomes of the target against the baseline (+1 win, 0 tie, −1 loss), one per prompt or
    one list per prompt (its samples; the bootstrap resamples prompts): ``win``, ``tie`` and
    ``loss`` shares and ``win_rate`` = win + tie/2, each with its interval (the same resamples
    for all four). ``n`` counts prompts. A share whose per-prompt values are all 0 or 1 takes
    the Wilson interval instead (:func:`proportion_estimate`)."""
    clusters = _clusters(outcomes)
    if any(o not in (WIN, TIE, LOSS) for o in _flat(clusters)):
        raise ValueError("outcomes must be +1 (win), 0 (tie) or -1 (loss)")

    def share(kind: int) -> Callable[[Sequence[list[int]]], float | None]:
        def fn(cs: Sequence[list[int]]) -> float | None:
            xs = _flat(cs)
            return sum(x == kind for x in xs) / len(xs) if xs else None

        return fn

    statistics = {
        "win_rate": lambda cs: _mean([_points(x) for x in _flat(cs)]),
        "win": share(WIN),
        "tie": share(TIE),
        "loss": share(LOSS),
    }
    out = {
        name: bootstrap(clusters, fn, resamples=resamples, level=level, seed=seed)
        for name, fn in statistics.items()
    }
    for name, fn in statistics.items():
        per_prompt = [fn([c]) for c in clusters if c]
        if per_prompt and _binary([v for v in per_prompt if v is not None]):
            # every prompt wholly a win or not (one sample each, or its samples agree): a
            # share of 0/1 items, whose bootstrap would collapse to a point at 0 or 1
            out[name] = proportion_estimate(per_prompt, level=level)
    return out


def length_buckets(diffs: Sequence[float], n_buckets: int) -> list[float]:
    """Upper edges of ``n_buckets`` buckets of the absolute length difference, at quantiles of
    the non-zero ``|d|`` (repeated edges merged); the last edge is +inf. Zero differences form
    their own bucket (see :func:`length_controlled_win_rate`)."""
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be >= 1, got {n_buckets}")
    magnitudes = sorted(abs(d) for d in diffs if d != 0)
    if not magnitudes:
        return [math.inf]
    edges = [percentile(magnitudes, i / n_buckets) for i in range(1, n_buckets)]
    return sorted(set(edges)) + [math.inf]


def _lc_value(pairs: Sequence[tuple[int, float]], edges: Sequence[float]) -> float | None:
    """Length-controlled win rate of (outcome, length difference) pairs (see below)."""
    if not pairs:
        return None
    zero: list[float] = []
    longer: dict[int, list[float]] = {}
    shorter: dict[int, list[float]] = {}
    for outcome, d in pairs:
        if d == 0:
            zero.append(_points(outcome))
            continue
        bucket = bisect.bisect_left(edges, abs(d))
        (longer if d > 0 else shorter).setdefault(bucket, []).append(_points(outcome))
    total, weight = 0.0, 0
    if zero:
        total += sum(zero)
        weight += len(zero)
    for bucket, pos in longer.items():
        neg = shorter.get(bucket)
        if not neg:
            continue  # one-sided bucket: no same-length contrast, left out
        w = len(pos) + len(neg)
        total += w * (sum(pos) / len(pos) + sum(neg) / len(neg)) / 2
        weight += w
    return total / weight if weight else None


def length_controlled_win_rate(
    outcomes: Sequence[int | list[int]],
    length_diffs: Sequence[float | list[float]],
    *,
    n_buckets: int = 4,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[Estimate, float]:
    """The win rate with the length of the responses held fixed, and the share of pairs it
    rests on.

    ``length_diffs[i]`` = target length − baseline length of pair ``i`` (both arguments may be
    clustered by prompt as in :func:`win_tie_loss`). The pairs are put in buckets of ``|d|``
    (:func:`length_buckets`); each bucket splits into the pairs where the target is longer and
    those where it is shorter, and its value is the mean of the two halves' win rates (ties
    count half), so a judge that rewards length alone scores 1 on one half and 0 on the other:
    0.5. Pairs of equal length form a bucket of their own (their plain win rate). The buckets
    are averaged weighted by their number of pairs. A bucket with only one half (the target is
    always longer there) has no same-length contrast and is left out; the second returned
    number is the share of pairs in the buckets kept (coverage). The value is None when no
    bucket is kept."""
    o_clusters, d_clusters = _clusters(outcomes), _clusters(length_diffs)
    if [len(c) for c in o_clusters] != [len(c) for c in d_clusters]:
        raise ValueError("outcomes and length_diffs must have the same shape")
    clusters = [
        list(zip((int(o) for o in oc), (float(d) for d in dc), strict=True))
        for oc, dc in zip(o_clusters, d_clusters, strict=True)
    ]
    edges = length_buckets([d for _, d in _flat(clusters)], n_buckets)
    estimate = bootstrap(
        clusters,
        lambda cs: _lc_value(_flat(cs), edges),
        resamples=resamples,
        level=level,
        seed=seed,
    )
    return estimate, _lc_coverage(_flat(clusters), edges)


def _lc_coverage(pairs: Sequence[tuple[int, float]], edges: Sequence[float]) -> float:
    if not pairs:
        return 0.0
    sides: dict[int, set[bool]] = {}
    for _, d in pairs:
        if d != 0:
            sides.setdefault(bisect.bisect_left(edges, abs(d)), set()).add(d > 0)
    kept = sum(
        1 for _, d in pairs if d == 0 or len(sides.get(bisect.bisect_left(edges, abs(d)), ())) == 2
    )
    return kept / len(pairs)


# ---------------------------------------------------------------------------------------------
# Generation health
# ---------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks: the units of distinct-n and repetition (the
    same for every tokenizer, so two models compare)."""
    return _WORD.findall(text.lower())


def _ngrams(units: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Distinct n-grams over all texts / all n-grams over all texts (corpus level; None when
    no text has n words)."""
    grams = [g for t in texts for g in _ngrams(words(t), n)]
    return len(set(grams)) / len(grams) if grams else None


def repetition_rate(text: str, n: int = 4) -> float | None:
    """Share of a text's n-grams that repeat an earlier n-gram of the same text:
    ``1 − distinct / total`` (None when the text has fewer than n words)."""
    grams = _ngrams(words(text), n)
    return 1.0 - len(set(grams)) / len(grams) if grams else None


def never_ending_share(truncated: Sequence[bool]) -> float | None:
    """Share of responses cut at the token limit without an end-of-turn token."""
    return sum(bool(t) for t in truncated) / len(truncated) if truncated else None
