"""The overoptimisation rule: a policy rewarded by a learned reward model (the proxy) keeps
raising it while an independent gold signal (a verifier, or a held-out gold reward model) falls,
and what to change then. Pure functions over metric rows; the diagnosis (:mod:`rlhf_lab.results.diagnosis`)
turns a finding into an alert, the ledger's Next section into commands. Torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlhf_lab.results.headline import _as_float as _float

# The overoptimisation rule (stated in words in docs/architecture.md and the skills): over the
# last half of the run's rollout rows that log both the proxy reward (the learned reward model
# being optimised) and the gold reward (a verifier or a held-out gold model), at least
# OVEROPT_MIN_ROWS of them, fit a least-squares line of each against the step. The alert fires
# when the proxy's fitted change over that window is positive and the gold's negative, each
# beyond OVEROPT_T standard errors of its fit (the rows' own scatter is the noise), and the
# gold's fall is at least OVEROPT_MIN_FALL_SHARE of the gold's whole range over the run. Runs
# without per-rollout gold are judged the same way on their eval rows (eval/proxy_reward,
# eval/gold_reward). A second test catches a gold that collapses early and stays down (the trend
# of the last half is then flat): the last quarter of the rows (at least 3) against the window
# of the same width where the gold was highest before it — the gold's drop and the proxy's rise
# between them each beyond OVEROPT_T standard errors of the difference of the two windows'
# means, and the drop again at least OVEROPT_MIN_FALL_SHARE of the gold's range. A third test
# covers short runs whose held-out gold is a proportion (a verifier's correctness rate, every
# value in [0, 1]) over a known number of prompts (``eval/num_prompts``): too few evaluations for
# a trend, but the gold's fall from its best earlier evaluation to the last one is judged on the
# prompts themselves — the Newcombe 95% interval of (last − best) lies below 0 — while the
# held-out proxy at the last evaluation is above its value at that best one.
OVEROPT_MIN_ROWS = 8
OVEROPT_T = 3.0
OVEROPT_MIN_FALL_SHARE = 0.25
OVEROPT_DEFAULT_KL = 0.04  # the KL strength proposed when the run had none (GRPO's usual β)
_OVEROPT_SOURCES = (
    ("rollout", "proxy_reward", "gold_reward"),
    ("eval", "eval/proxy_reward", "eval/gold_reward"),
)


@dataclass(frozen=True)
class Overoptimisation:
    """The proxy reward rose while the gold reward fell (see the rule above)."""

    source: str  # "rollout" or "eval"
    proxy_key: str
    gold_key: str
    first_step: Any
    last_step: Any
    proxy_change: float
    proxy_noise: float
    gold_change: float
    gold_noise: float
    gold_peak_step: int | None
    gold_peak: float
    kl_ref: float | None = None

    @property
    def message(self) -> str:
        kl = "" if self.kl_ref is None else f"; KL to the reference is now {self.kl_ref:.4g}"
        proxy_noise = (
            "held-out values"
            if math.isnan(self.proxy_noise)
            else f"fit noise ±{self.proxy_noise:.2g}"
        )
        gold_noise = (
            f"95% interval ±{self.gold_noise:.2g} over the prompts"
            if math.isnan(self.proxy_noise)
            else f"±{self.gold_noise:.2g}"
        )
        return (
            f"overoptimisation: over {self.source} steps {self.first_step}–{self.last_step} "
            f"{self.proxy_key} rose by {self.proxy_change:+.4g} ({proxy_noise})"
            f" while {self.gold_key} fell by {self.gold_change:+.4g} ({gold_noise}); "
            f"the gold reward peaked at step {self.gold_peak_step} ({self.gold_peak:.4g}){kl}: "
            "the policy is exploiting the reward model, not getting better"
        )


def _trend(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line of value on step: (fitted change over the span, its standard error);
    the error is infinite when it cannot be estimated."""
    n = len(points)
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 3 or sxx <= 0:
        return 0.0, math.inf
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    resid = sum((y - (my + slope * (x - mx))) ** 2 for x, y in points)
    se = math.sqrt(resid / (n - 2) / sxx)
    span = xs[-1] - xs[0]
    return slope * span, se * span


def _gold_peak(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(step, value) where a trailing mean of the gold reward (width max(3, n/8)) is highest;
    the step is the middle of that window."""
    k = max(3, len(points) // 8) if len(points) >= 3 else len(points)
    best = None
    for end in range(k, len(points) + 1):
        window = points[end - k : end]
        mean = sum(v for _, v in window) / k
        if best is None or mean > best[1]:
            best = (window[k // 2][0], mean)
    assert best is not None
    return best


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and squared standard error of a window's values."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.inf
    return mean, var / n


def _fires(
    proxy_change: float,
    proxy_noise: float,
    gold_change: float,
    gold_noise: float,
    gold_range: float,
) -> bool:
    """Both tests' condition: the proxy up and the gold down, each beyond OVEROPT_T standard
    errors, the gold's fall at least OVEROPT_MIN_FALL_SHARE of its range."""
    return (
        proxy_change > 0
        and proxy_change > OVEROPT_T * proxy_noise
        and gold_change < 0
        and -gold_change > OVEROPT_T * gold_noise
        and -gold_change >= OVEROPT_MIN_FALL_SHARE * gold_range
    )


def _fall_from_peak(
    points: list[tuple[float, tuple[float, float, float | None]]],
) -> tuple[float, float, float, float, int] | None:
    """The second test of the rule: (proxy rise, its se, gold drop, its se, index of the last
    window's first row) between the gold's best earlier window and the last window, or None."""
    k = max(3, len(points) // 4)
    if len(points) < 2 * k:
        return None
    last = points[-k:]
    best = None
    for start in range(0, len(points) - 2 * k + 1):
        window = points[start : start + k]
        gold = sum(v[1] for _, v in window) / k
        if best is None or gold > best[0]:
            best = (gold, window)
    assert best is not None
    peak = best[1]
    gold_peak, se_gp = _mean_se([v[1] for _, v in peak])
    gold_last, se_gl = _mean_se([v[1] for _, v in last])
    proxy_peak, se_pp = _mean_se([v[0] for _, v in peak])
    proxy_last, se_pl = _mean_se([v[0] for _, v in last])
    return (
        proxy_last - proxy_peak,
        math.sqrt(se_pp + se_pl),
        gold_last - gold_peak,
        math.sqrt(se_gp + se_gl),
        len(points) - k,
    )


def _held_out_fall(rows: list[dict]) -> Overoptimisation | None:
    """The third test of the rule (held-out endpoints of a proportion gold), or None."""
    from rlhf_lab.results.stats import newcombe_difference

    points = []
    for r in rows:
        if r.get("phase") != "eval":
            continue
        step, proxy, gold = (
            _float(r.get("step")),
            _float(r.get("eval/proxy_reward")),
            _float(r.get("eval/gold_reward")),
        )
        n = _float(r.get("eval/num_prompts"))
        if None in (step, proxy, gold, n) or not all(map(math.isfinite, (step, proxy, gold, n))):
            continue
        points.append((step, proxy, gold, int(n)))
    points.sort()
    if len(points) < 2 or not all(0.0 <= g <= 1.0 and n > 0 for _, _, g, n in points):
        return None
    last = points[-1]
    best = max(points[:-1], key=lambda p: p[2])
    drop = newcombe_difference(last[2], last[3], best[2], best[3])
    if not (drop.high < 0 and last[1] > best[1]):
        return None
    return Overoptimisation(
        source="eval",
        proxy_key="eval/proxy_reward",
        gold_key="eval/gold_reward",
        first_step=_step_text(best[0]),
        last_step=_step_text(last[0]),
        proxy_change=last[1] - best[1],
        proxy_noise=math.nan,  # one value per evaluation: no scatter to estimate it from
        gold_change=drop.estimate,
        gold_noise=(drop.high - drop.low) / 2,
        gold_peak_step=int(best[0]),
        gold_peak=best[2],
        kl_ref=_last_kl(rows),
    )


def _last_kl(rows: list[dict]) -> float | None:
    kls = [_float(r.get("kl_ref")) for r in rows]
    kls = [k for k in kls if k is not None and math.isfinite(k)]
    return kls[-1] if kls else None


def overoptimisation(rows: list[dict]) -> Overoptimisation | None:
    """The proxy reward still rising while the gold reward falls (rule above), or None."""
    found = _trend_or_peak(rows)
    return found if found is not None else _held_out_fall(rows)


def _trend_or_peak(rows: list[dict]) -> Overoptimisation | None:
    """The first two tests of the rule (the trend of the last half, the fall from the peak)."""
    for source, proxy_key, gold_key in _OVEROPT_SOURCES:
        by_step: dict[float, tuple[float, float, float | None]] = {}
        for r in rows:
            if (r.get("phase") == "eval") != (source == "eval"):
                continue
            step, proxy, gold = (
                _float(r.get("step")),
                _float(r.get(proxy_key)),
                _float(r.get(gold_key)),
            )
            if step is None or proxy is None or gold is None:
                continue
            if not (math.isfinite(step) and math.isfinite(proxy) and math.isfinite(gold)):
                continue
            kl = _float(r.get("kl_ref"))
            by_step[step] = (proxy, gold, kl if kl is not None and math.isfinite(kl) else None)
        points = sorted(by_step.items())
        if len(points) < OVEROPT_MIN_ROWS:
            continue
        golds = [v[1] for _, v in points]
        gold_range = max(golds) - min(golds)

        window = points[-max(OVEROPT_MIN_ROWS, math.ceil(len(points) / 2)) :]
        proxy_change, proxy_noise = _trend([(s, v[0]) for s, v in window])
        gold_change, gold_noise = _trend([(s, v[1]) for s, v in window])
        if not _fires(proxy_change, proxy_noise, gold_change, gold_noise, gold_range):
            fall = _fall_from_peak(points)
            if fall is None or not _fires(*fall[:4], gold_range):
                continue
            proxy_change, proxy_noise, gold_change, gold_noise, first = fall
            window = points[first:]
        peak_step, peak = _gold_peak([(s, v[1]) for s, v in points])
        kls = [v[2] for _, v in points if v[2] is not None]
        return Overoptimisation(
            source=source,
            proxy_key=proxy_key,
            gold_key=gold_key,
            first_step=_step_text(window[0][0]),
            last_step=_step_text(window[-1][0]),
            proxy_change=proxy_change,
            proxy_noise=proxy_noise,
            gold_change=gold_change,
            gold_noise=gold_noise,
            gold_peak_step=int(peak_step),
            gold_peak=peak,
            kl_ref=kls[-1] if kls else None,
        )
    return None


def _step_text(step: float) -> int | float:
    return int(step) if float(step).is_integer() else step


@dataclass(frozen=True)
class Advice:
    """One config change that answers a finding: ``key=value`` and why."""

    key: str
    value: Any
    why: str

    @property
    def override(self) -> str:
        value = f"{self.value:.3g}" if isinstance(self.value, float) else str(self.value)
        return f"{self.key}={value}"


def overoptimisation_advice(
    family: str | None, algorithm: str | None, kl_now: Any, peak_step: int | None, steps: Any
) -> list[Advice]:
    """What to change after overoptimisation, one alternative per item: stop where the gold
    reward peaked (the family's steps key; half the steps when the peak is unknown), and a
    tighter KL leash (the family's ``kl_key`` doubled, or ``OVEROPT_DEFAULT_KL`` when it was 0)
    for an algorithm that has a KL term. The alert and the ledger's Next section both use it."""
    from trainers.core.spec import FAMILY_NAMES, family_spec, spec_for

    if family not in FAMILY_NAMES:
        return []
    spec = family_spec(family)
    out: list[Advice] = []
    stop = peak_step if isinstance(peak_step, int) and peak_step > 0 else None
    why = "stop where the gold reward peaked"
    if stop is None and isinstance(steps, int) and steps > 1:
        stop, why = steps // 2, "half the steps"
    if stop is not None:
        out.append(Advice(spec.steps_key, stop, why))
    try:
        algo = spec_for(algorithm) if algorithm else None
    except KeyError:
        algo = None
    if spec.kl_key and (algo is None or algo.kl != "none"):
        now = (
            float(kl_now)
            if isinstance(kl_now, int | float) and not isinstance(kl_now, bool)
            else 0.0
        )
        stronger = 2 * now if now > 0 else OVEROPT_DEFAULT_KL
        out.append(
            Advice(spec.kl_key, stronger, f"a tighter KL leash to the reference, now {now:g}")
        )
    return out
