"""The statistics behind the lab's verdicts, against values computed by hand (and the textbook
tables of Student's t)."""

from __future__ import annotations

import math

import pytest

from rlhf_lab.results.stats import (
    Interval,
    mean_interval,
    newcombe_difference,
    normal_quantile,
    regularized_incomplete_beta,
    t_quantile,
    verdict_of,
    welch_difference,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281), (30, 2.0423)],
)
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(df) == pytest.approx(expected, abs=1e-4)


def test_t_quantile_limits_and_fractional_df():
    assert t_quantile(math.inf) == pytest.approx(1.959964, abs=1e-6)
    assert normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
    # fractional df (Welch) lies between its integer neighbours
    assert t_quantile(3) < t_quantile(2.5) < t_quantile(2)
    # df = 1 is the Cauchy distribution: t* = tan(π · 0.475)
    assert t_quantile(1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)


def test_incomplete_beta_by_hand():
    # I_x(2, 3) = Σ_{j=2..4} C(4, j) x^j (1 − x)^(4 − j); at x = 0.3: 0.2646 + 0.0756 + 0.0081
    assert regularized_incomplete_beta(0.3, 2, 3) == pytest.approx(0.3483, abs=1e-12)
    assert regularized_incomplete_beta(0.0, 2, 3) == 0.0
    assert regularized_incomplete_beta(1.0, 2, 3) == 1.0


def test_t_interval_of_three_seeds():
    # mean 0.85, s = 0.05, s/√3 = 0.0288675, t*(2) = 4.302653 -> half width 0.124207
    iv = mean_interval([0.8, 0.85, 0.9])
    assert iv.estimate == pytest.approx(0.85)
    assert iv.low == pytest.approx(0.725793, abs=1e-6)
    assert iv.high == pytest.approx(0.974207, abs=1e-6)
    assert iv.df == 2
    with pytest.raises(ValueError):
        mean_interval([0.8])


def test_wilson_interval_of_111_out_of_128():
    # p = 0.8671875, z = 1.959964: centre (p + z²/2n)/(1 + z²/n) = 0.856489, half width
    # z/(1 + z²/n)·√(p(1−p)/n + z²/4n²) = 0.058909
    iv = wilson_interval(111 / 128, 128)
    assert iv.low == pytest.approx(0.79758, abs=1e-5)
    assert iv.high == pytest.approx(0.91540, abs=1e-5)
    # never outside [0, 1], even at the edges
    edge = wilson_interval(1.0, 10)
    assert edge.high == 1.0 and 0.6 < edge.low < 0.75
    with pytest.raises(ValueError):
        wilson_interval(0.5, 0)


def test_welch_difference_by_hand():
    # means 0.85 and 0.69, variances 0.0025 and 0.0004 (n = 3 each): se² = 0.000966667,
    # df = se⁴ / ((0.0025/3)²/2 + (0.0004/3)²/2) = 9.3444e-7 / 3.5611e-7 = 2.6240
    iv = welch_difference([0.8, 0.85, 0.9], [0.67, 0.69, 0.71])
    assert iv.estimate == pytest.approx(0.16)
    assert iv.df == pytest.approx(2.6240, abs=1e-3)
    half = t_quantile(iv.df) * math.sqrt(0.0025 / 3 + 0.0004 / 3)
    assert iv.high - iv.estimate == pytest.approx(half)
    assert iv.low > 0  # the difference is real
    same = welch_difference([0.5, 0.5], [0.4, 0.4])
    assert same.low == same.high == pytest.approx(0.1)


def test_newcombe_difference_uses_the_two_wilson_intervals():
    w1, w2 = wilson_interval(0.28, 64), wilson_interval(0.5, 64)
    iv = newcombe_difference(0.28, 64, 0.5, 64)
    assert iv.estimate == pytest.approx(-0.22)
    assert iv.low == pytest.approx(-0.22 - math.hypot(0.28 - w1.low, w2.high - 0.5))
    assert iv.high == pytest.approx(-0.22 + math.hypot(w1.high - 0.28, 0.5 - w2.low))
    assert iv.high < 0  # 0.50 -> 0.28 on 64 items is beyond the sampling noise
    tie = newcombe_difference(111 / 128, 128, 108 / 128, 128)
    assert tie.low < 0 < tie.high


def test_verdict_follows_the_sign_and_the_direction():
    assert verdict_of(Interval(0.1, 0.02, 0.18), higher_is_better=True) == "better"
    assert verdict_of(Interval(0.1, 0.02, 0.18), higher_is_better=False) == "worse"
    assert verdict_of(Interval(-0.1, -0.18, -0.02), higher_is_better=True) == "worse"
    assert verdict_of(Interval(0.02, -0.06, 0.11), higher_is_better=True) == "tie within noise"
