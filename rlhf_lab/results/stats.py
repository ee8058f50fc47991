"""The few statistics the lab's verdicts rest on, as pure functions of numbers (stdlib only, no
scipy): Student t quantiles, the t interval of a mean over seeds, Welch's interval for a
difference of two means, the Wilson score interval of a proportion, and Newcombe's interval for
a difference of two proportions. Every interval is two-sided at ``level`` (default 95 %).

The rules that use them (which interval when, and the verdict) are stated in
:data:`VERDICT_RULE`, which the comparison prints beside its verdicts. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "VERDICT_RULE",
    "Interval",
    "mean_interval",
    "newcombe_difference",
    "normal_quantile",
    "pooled_share_interval",
    "regularized_incomplete_beta",
    "t_quantile",
    "verdict_of",
    "welch_difference",
    "wilson_interval",
]

LEVEL = 0.95

VERDICT_RULE = (
    "Each arm is one algorithm (or setting) with everything else matched; its value is the final "
    "held-out headline metric of each run. With ≥2 seeds per arm: the arm's mean with a 95% "
    "Student-t interval over seeds, and two arms are compared by Welch's 95% interval of the "
    "difference of their means; a share whose seeds show no spread (all 0, say) takes the Wilson "
    "interval of the pooled items instead of a zero-width t interval, and two such arms "
    "Newcombe's interval on the pooled items. With a single seed: the run is labelled single-seed and its noise "
    "is the sampling noise of the held-out metric — a Wilson 95% interval for an accuracy on n "
    "held-out items — and two arms are compared by Newcombe's 95% interval for a difference of "
    "two proportions (a loss has no single-run noise estimate: undecided). Verdict: 'better' or "
    "'worse' when the 95% interval of the difference excludes 0 (in the metric's good direction), "
    "'tie within noise' when it contains 0, 'not comparable' when the families, headline "
    "metrics or held-out sets differ, or when arms of different algorithms differ in a setting "
    "other than the seed and the algorithm's own knobs, 'undecided' when no noise estimate "
    "exists. Pairs: each reward-selected rejection-sampling arm against its matched random "
    "control; in the other families the leading arm (best mean) against each other arm."
)


@dataclass(frozen=True)
class Interval:
    """An estimate with its two-sided interval; ``df`` where a t quantile was used."""

    estimate: float
    low: float
    high: float
    df: float | None = None

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


# ---------------------------------------------------------------------------------------------
# Quantiles
# ---------------------------------------------------------------------------------------------


def normal_quantile(p: float) -> float:
    """The standard normal quantile Φ⁻¹(p), by bisection on ``math.erf`` (to ~1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz evaluation)."""
    floor = 1e-300
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > floor else floor)
    result = d
    for m in range(1, 500):
        two_m = 2 * m
        # even step
        num = m * (b - m) * x / ((a - 1.0 + two_m) * (a + two_m))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > floor else floor)
        c = 1.0 + num / c
        c = c if abs(c) > floor else floor
        result *= d * c
        # odd step
        num = -(a + m) * (a + b + m) * x / ((a + two_m) * (a + 1.0 + two_m))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > floor else floor)
        c = 1.0 + num / c
        c = c if abs(c) > floor else floor
        step = d * c
        result *= step
        if abs(step - 1.0) < 1e-15:
            break
    return result


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function (a, b > 0, 0 ≤ x ≤ 1)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def _t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom, t ≥ 0."""
    return 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided critical value t* with P(|T| ≤ t*) = ``level`` for Student's t with ``df``
    degrees of freedom (fractional df allowed, as Welch's are); the normal one for infinite df."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if df is None or math.isinf(df) or df > 1e7:
        return normal_quantile(0.5 + level / 2)
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    tail = (1.0 - level) / 2
    lo, hi = 0.0, 1.0
    while _t_upper_tail(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_upper_tail(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# ---------------------------------------------------------------------------------------------
# Intervals
# ---------------------------------------------------------------------------------------------


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def mean_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean of ``values`` (one per seed) with its Student-t interval: mean ± t*(n−1)·s/√n.
    Needs at least two values."""
    xs = _finite(values)
    n = len(xs)
    if n < 2:
        raise ValueError("a t interval needs at least two values")
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile(n - 1, level) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, df=float(n - 1))


def welch_difference(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Interval:
    """mean(a) − mean(b) with Welch's interval (unequal variances, Welch–Satterthwaite df).
    Needs at least two values on each side. Zero spread on both sides: a zero-width interval."""
    xa, xb = _finite(a), _finite(b)
    if len(xa) < 2 or len(xb) < 2:
        raise ValueError("Welch's interval needs at least two values per arm")
    na, nb = len(xa), len(xb)
    ma, mb = sum(xa) / na, sum(xb) / nb
    va = sum((x - ma) ** 2 for x in xa) / (na - 1)
    vb = sum((x - mb) ** 2 for x in xb) / (nb - 1)
    se2 = va / na + vb / nb
    diff = ma - mb
    if se2 == 0:
        return Interval(diff, diff, diff, df=None)
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    half = t_quantile(df, level) * math.sqrt(se2)
    return Interval(diff, diff - half, diff + half, df=df)


def wilson_interval(p: float, n: int, level: float = LEVEL) -> Interval:
    """The Wilson score interval of a proportion ``p`` observed on ``n`` items."""
    if n <= 0:
        raise ValueError("n must be positive")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"a proportion must be in [0, 1], got {p}")
    z = normal_quantile(0.5 + level / 2)
    z2n = z * z / n
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def pooled_share_interval(values: Sequence[float], n: int | None, level: float = LEVEL):
    """The Wilson interval of the shares ``values`` (one per seed, each on ``n`` held-out items)
    pooled: sum(share·n) successes of len(values)·n items. What an arm whose seeds all score the
    same share reports instead of the zero-width t interval (a proportion's interval is never a
    point). None without a share or an item count."""
    xs = _finite(values)
    if not xs or n is None or n <= 0 or not all(0.0 <= x <= 1.0 for x in xs):
        return None
    mean = sum(xs) / len(xs)
    iv = wilson_interval(mean, n * len(xs), level)
    return Interval(mean, iv.low, iv.high)


def newcombe_difference(p1: float, n1: int, p2: float, n2: int, level: float = LEVEL) -> Interval:
    """p1 − p2 with Newcombe's hybrid score interval (built from the two Wilson intervals; it
    stays inside [−1, 1] and behaves near 0 and 1, unlike the Wald interval)."""
    w1, w2 = wilson_interval(p1, n1, level), wilson_interval(p2, n2, level)
    diff = p1 - p2
    low = diff - math.sqrt((p1 - w1.low) ** 2 + (w2.high - p2) ** 2)
    high = diff + math.sqrt((w1.high - p1) ** 2 + (p2 - w2.low) ** 2)
    return Interval(diff, low, high)


def verdict_of(interval: Interval, higher_is_better: bool) -> str:
    """'better' / 'worse' (for the first arm of ``interval``'s difference) when the interval
    excludes 0, 'tie within noise' otherwise."""
    low, high = interval.low, interval.high
    if not higher_is_better:
        low, high = -high, -low
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "tie within noise"
