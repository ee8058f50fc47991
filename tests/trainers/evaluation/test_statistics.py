"""The evaluation statistics against hand values, closed forms and simulations."""

from __future__ import annotations

import math
import random
from itertools import combinations

import pytest

from trainers.evaluation import statistics as st

# ---------------------------------------------------------------------------------------------
# pass@k
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k"),
    [(1, 0, 1), (1, 1, 1), (4, 1, 1), (4, 1, 2), (8, 3, 4), (10, 0, 5), (10, 7, 5), (20, 2, 19)],
)
def test_pass_at_k_matches_the_binomial_closed_form(n, c, k):
    closed = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert st.pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)


def test_pass_at_k_is_the_share_of_k_subsets_holding_a_correct_sample():
    """By enumeration: of all k-subsets of n samples (c correct), the share with a hit."""
    n, c, k = 7, 2, 3
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    hit = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert st.pass_at_k(n, c, k) == pytest.approx(hit)
    assert st.pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # pass@1 = c/n
    assert st.pass_at_k(5, 3, 3) == 1.0  # n - c < k: always a hit


def test_pass_at_k_stays_finite_where_binomials_overflow_a_float():
    n, c, k = 2000, 3, 1000
    value = st.pass_at_k(n, c, k)
    assert 0.87 < value < 0.88  # 1 - (1/2)^3 roughly: three independent halves
    with pytest.raises(ValueError, match="k <= n"):
        st.pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="c <= n"):
        st.pass_at_k(4, 5, 2)


# ---------------------------------------------------------------------------------------------
# Bootstrap
# ---------------------------------------------------------------------------------------------


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    values = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    a = st.mean_estimate(values, seed=3)
    b = st.mean_estimate(values, seed=3)
    assert a == b and a.value == pytest.approx(0.7) and a.n == 10
    assert a.low < 0.7 < a.high and 0.3 <= a.low and a.high <= 1.0
    assert st.mean_estimate(values, seed=4) != a  # another seed, other resamples
    assert st.mean_estimate([]).value is None
    one = st.mean_estimate([0.4])
    assert one.value == 0.4 and one.low is None and one.high is None


def test_percentile_interpolates_between_order_statistics():
    xs = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert st.percentile(xs, 0.0) == 0.0 and st.percentile(xs, 1.0) == 4.0
    assert st.percentile(xs, 0.5) == 2.0 and st.percentile(xs, 0.125) == pytest.approx(0.5)


def test_bootstrap_interval_covers_the_true_rate_at_about_its_nominal_level():
    """200 simulated judges, each rating 60 items with true rate 0.3: the 95 % interval covers
    0.3 in about 95 % of them (percentile bootstrap runs a little under at this n)."""
    rng = random.Random(12345)
    true_rate, n, sims = 0.3, 60, 200
    covered = 0
    for sim in range(sims):
        values = [1 if rng.random() < true_rate else 0 for _ in range(n)]
        est = st.mean_estimate(values, resamples=400, seed=sim)
        covered += est.covers(true_rate)
    rate = covered / sims
    assert 0.89 <= rate <= 0.99, rate


def test_win_tie_loss_shares_and_win_rate():
    outcomes = [1] * 5 + [0] * 3 + [-1] * 2
    r = st.win_tie_loss(outcomes, seed=1)
    assert r["win"].value == pytest.approx(0.5)
    assert r["tie"].value == pytest.approx(0.3)
    assert r["loss"].value == pytest.approx(0.2)
    assert r["win_rate"].value == pytest.approx(0.5 + 0.15)
    assert all(r[k].low <= r[k].value <= r[k].high for k in r)
    with pytest.raises(ValueError, match="outcomes"):
        st.win_tie_loss([2])


def test_win_tie_loss_resamples_prompts_with_their_samples():
    """Clustered outcomes: the value is over all pairs, n counts prompts, and the interval of
    perfectly correlated samples is as wide as that of one sample per prompt."""
    rng = random.Random(0)
    single = [rng.choice([1, -1]) for _ in range(40)]
    clustered = [[o] * 4 for o in single]
    a = st.win_tie_loss(single, seed=2)["win_rate"]
    b = st.win_tie_loss(clustered, seed=2)["win_rate"]
    assert a.value == pytest.approx(b.value) and b.n == 40
    assert (b.low, b.high) == pytest.approx((a.low, a.high))


def test_a_model_against_itself_is_all_ties_and_a_half():
    r = st.win_tie_loss([0] * 30, seed=0)
    assert r["win_rate"].value == 0.5 and r["win_rate"].covers(0.5)
    assert r["tie"].value == 1.0


# ---------------------------------------------------------------------------------------------
# Length-controlled win rate
# ---------------------------------------------------------------------------------------------


def _length_judge_pairs(rng: random.Random, n: int, longer_share: float):
    """Pairs whose target is longer with probability ``longer_share``, judged by length alone
    (the longer response wins)."""
    outcomes, diffs = [], []
    for _ in range(n):
        d = rng.randint(1, 60) * (1 if rng.random() < longer_share else -1)
        diffs.append(d)
        outcomes.append(1 if d > 0 else -1)
    return outcomes, diffs


def test_a_judge_that_only_prefers_length_shows_no_length_controlled_gain():
    rng = random.Random(7)
    outcomes, diffs = _length_judge_pairs(rng, 400, longer_share=0.8)
    plain = st.win_tie_loss(outcomes, seed=0)["win_rate"]
    lc, coverage = st.length_controlled_win_rate(outcomes, diffs, n_buckets=4, seed=0)
    assert plain.value > 0.75  # the raw win rate rewards the longer model
    assert lc.value == pytest.approx(0.5)
    assert lc.covers(0.5) and coverage == 1.0


def test_length_controlled_win_rate_keeps_a_gain_that_is_not_about_length():
    """A judge blind to length that prefers the target 75 % of the time: LC ≈ 0.75."""
    rng = random.Random(11)
    outcomes, diffs = [], []
    for _ in range(600):
        diffs.append(rng.randint(-50, 50))
        outcomes.append(1 if rng.random() < 0.75 else -1)
    lc, coverage = st.length_controlled_win_rate(outcomes, diffs, seed=0)
    assert 0.68 < lc.value < 0.82 and lc.covers(0.75)
    assert coverage > 0.95


def test_length_controlled_win_rate_by_hand():
    # equal length: one tie (0.5); bucket |d| <= 2: longer half wins 1/1, shorter half 0/1;
    # bucket |d| > 2: target always longer -> left out (coverage 3/5)
    outcomes = [0, 1, -1, 1, 1]
    diffs = [0, 2, -1, 10, 12]
    lc, coverage = st.length_controlled_win_rate(outcomes, diffs, n_buckets=2)
    edges = st.length_buckets(diffs, 2)
    assert edges[0] == pytest.approx(st.percentile([1, 2, 10, 12], 0.5))
    # zero bucket: 1 pair worth 0.5; small bucket: 2 pairs worth (1 + 0)/2 each
    assert lc.value == pytest.approx((0.5 + 2 * 0.5) / 3)
    assert coverage == pytest.approx(3 / 5)
    none, cov = st.length_controlled_win_rate([1, 1], [3, 4])
    assert none.value is None and cov == 0.0


# ---------------------------------------------------------------------------------------------
# Generation health
# ---------------------------------------------------------------------------------------------


def test_distinct_n_repetition_and_never_ending():
    assert st.distinct_n(["a b a b"], 1) == pytest.approx(2 / 4)
    assert st.distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)  # ab, ba, ab
    assert st.distinct_n(["a b", "a b"], 2) == pytest.approx(1 / 2)  # across texts
    assert st.distinct_n(["a"], 2) is None
    assert st.words("Hello, World!") == ["hello", ",", "world", "!"]
    assert st.repetition_rate("x y z x y z", n=3) == pytest.approx(1 - 3 / 4)
    assert st.repetition_rate("one two three four five", n=4) == 0.0
    assert st.repetition_rate("too short", n=4) is None
    assert st.never_ending_share([True, False, False, True]) == 0.5
    assert st.never_ending_share([]) is None


# ---------------------------------------------------------------------------------------------
# Proportions: Wilson, never a point interval
# ---------------------------------------------------------------------------------------------


def test_wilson_by_hand_at_zero_and_all_of_n():
    """0/128: the upper bound is z²/(n+z²) = 3.8415/131.84 = 0.02914 (z = 1.95996); n/n
    mirrors it."""
    low, high = st.wilson(0, 128)
    assert low == 0.0 and high == pytest.approx(0.029137, abs=1e-6)
    low, high = st.wilson(128, 128)
    assert high == 1.0 and low == pytest.approx(1 - 0.029137, abs=1e-6)
    # 5/10 by hand: centre 0.5, half-width z/(1+z²/n)·sqrt(0.025 + z²/400) = 0.26340
    low, high = st.wilson(5, 10)
    assert (low, high) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    with pytest.raises(ValueError):
        st.wilson(0, 0)


def test_an_accuracy_of_zero_on_128_prompts_is_not_the_point_zero():
    """The bug of issue #25: `eval tiny` reported accuracy 0.0 [0.0, 0.0] on n = 128 (a
    bootstrap of zeros)."""
    e = st.proportion_estimate([0.0] * 128)
    assert e.method == "wilson" and e.n == 128
    assert (e.value, e.low) == (0.0, 0.0) and e.high == pytest.approx(0.029137, abs=1e-6)
    assert st.mean_estimate([0.0] * 128).high == 0.0  # what the bootstrap alone gives


def test_a_share_over_several_disagreeing_samples_keeps_the_prompt_bootstrap():
    values = [0.25, 0.5, 0.0, 1.0, 0.75]
    e = st.proportion_estimate(values, seed=3)
    assert e.method == "bootstrap" and e == st.mean_estimate(values, seed=3)


def test_win_shares_that_never_happen_get_a_wilson_interval():
    r = st.win_tie_loss([1] * 10 + [-1] * 5, seed=0)
    assert r["tie"].value == 0.0 and r["tie"].method == "wilson"
    assert r["tie"].high == pytest.approx(st.wilson(0, 15)[1])
    assert (r["win"].low, r["win"].high) == pytest.approx(st.wilson(10, 15))
    # a prompt whose samples disagree is not a 0/1 item: the bootstrap stays
    assert st.win_tie_loss([[1, -1], [1, 1]], seed=0)["win"].method == "bootstrap"
