"""Best-of-n selection statistics against brute-force enumeration and hand examples."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from trainers.evaluation import best_of_n_stats as bs


def brute_argmax(scores, correct, n):
    """Mean over every n-subset of the mean correctness of its top-scored samples (a tie at the
    top is broken uniformly at random)."""
    total = 0.0
    subsets = list(itertools.combinations(range(len(scores)), n))
    for s in subsets:
        top = max(scores[i] for i in s)
        best = [i for i in s if scores[i] == top]
        total += sum(correct[i] for i in best) / len(best)
    return total / len(subsets)


def test_argmax_weights_hand_values():
    # N = 4, n = 2: the best is picked whenever it is drawn (3 of 6 pairs), the 2nd best when
    # drawn with one of the 2 worse (2 of 6), the 3rd with the worst (1 of 6), the worst never.
    assert bs.argmax_weights(4, 2) == pytest.approx([3 / 6, 2 / 6, 1 / 6, 0.0])
    assert bs.argmax_weights(5, 1) == pytest.approx([0.2] * 5)
    assert bs.argmax_weights(5, 5) == pytest.approx([1.0, 0, 0, 0, 0])
    assert sum(bs.argmax_weights(16, 4)) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        bs.argmax_weights(4, 5)


@pytest.mark.parametrize("seed", range(6))
def test_argmax_value_matches_enumeration_of_every_subset(seed):
    rng = random.Random(seed)
    N = 7
    # few distinct scores so that ties happen
    scores = [rng.choice([0.1, 0.5, 0.5, 0.9, 0.3]) for _ in range(N)]
    correct = [rng.random() < 0.4 for _ in range(N)]
    for n in range(1, N + 1):
        assert bs.argmax_value(scores, correct, n) == pytest.approx(
            brute_argmax(scores, correct, n), abs=1e-12
        )


def test_argmax_value_limits():
    correct = [True, False, False, True]
    scores = [0.2, 0.9, 0.1, 0.4]
    assert bs.argmax_value(scores, correct, 1) == pytest.approx(0.5)  # = mean correctness
    assert bs.argmax_value(scores, correct, 4) == 0.0  # the 0.9 sample is wrong


def test_majority_hand_example():
    # answers 5, 5, 7, None; verdicts: 5 is right. Subsets of 2 (6 of them):
    # {5,5} -> 1; {5,7} (twice) -> tie -> 1/2 each; {5,None} (twice) -> 1; {7,None} -> 0.
    p = bs.PromptSamples(
        correct=[True, True, False, False],
        answers=["5", "5", "7", None],
        orm=[0.0] * 4,
        prm=[0.0] * 4,
    )
    assert bs.majority_value(p, 2) == pytest.approx((1 + 0.5 + 0.5 + 1 + 1 + 0) / 6)
    assert bs.majority_value(p, 4) == 1.0  # "5" has two votes
    assert bs.majority_value(p, 1) == pytest.approx(0.5)  # one sample: its own verdict
    nobody = bs.PromptSamples([False, False], [None, None], [0.0, 0.0], [0.0, 0.0])
    assert bs.majority_value(nobody, 2) == 0.0


def test_majority_monte_carlo_close_to_exact_and_seeded():
    rng = random.Random(3)
    N = 12
    answers = [rng.choice(["1", "2", "3", None]) for _ in range(N)]
    p = bs.PromptSamples([a == "2" for a in answers], answers, [0.0] * N, [0.0] * N)
    exact = bs.majority_value(p, 6, exact_limit=math.comb(12, 6))
    mc = bs.majority_value(p, 6, exact_limit=10, draws=4000, seed=1)
    assert mc == pytest.approx(exact, abs=0.03)
    assert mc == bs.majority_value(p, 6, exact_limit=10, draws=4000, seed=1)


def test_subset_sizes():
    assert bs.subset_sizes(16) == [1, 2, 4, 8, 16]
    assert bs.subset_sizes(12) == [1, 2, 4, 8, 12]
    assert bs.subset_sizes(1) == [1]


def test_prompt_values_random_is_mean_and_n1_all_equal():
    p = bs.PromptSamples(
        [True, False, False, True], ["1", "2", "3", "1"], [0.1, 0.2, 0.3, 0.4], [0.9, 0.1, 0.2, 0.3]
    )
    v = bs.prompt_values(p, [1, 2, 4])
    assert {v[s][1] for s in bs.SELECTORS} == {0.5}
    assert v["random"][4] == 0.5
    assert v["prm"][4] == 1.0 and v["orm"][4] == 1.0
    assert v["majority"][4] == 1.0  # "1" twice


def test_table_lead_and_growth_on_a_built_case():
    # PRM always ranks a correct sample first, ORM always a wrong one: lead grows with n.
    rows = []
    for _ in range(30):
        correct = [j % 4 == 0 for j in range(8)]
        prm = [1.0 if c else 0.1 * j for j, c in enumerate(correct)]
        orm = [0.0 if c else 0.1 * j for j, c in enumerate(correct)]
        answers = [str(j % 3) for j in range(8)]
        rows.append(bs.prompt_values(bs.PromptSamples(correct, answers, orm, prm), [1, 2, 4, 8]))
    table = bs.best_of_n_table(rows, resamples=200)
    assert table.sizes == [1, 2, 4, 8]
    assert table.accuracy["prm"][8].value == 1.0
    assert table.accuracy["prm"][8].method == "wilson"  # every value 0 or 1: never a point
    assert table.accuracy["prm"][8].low < 1.0
    assert table.lead["prm-orm"][1].value == pytest.approx(0.0)
    assert table.lead["prm-orm"][8].value == pytest.approx(1.0)
    # at n = 2: prm picks a correct one when one is drawn: 1 - C(6,2)/C(8,2); orm only when
    # both are correct (their scores 0 are the lowest): C(2,2)/C(8,2)
    lead2 = (1 - 15 / 28) - 1 / 28
    assert table.lead["prm-orm"][2].value == pytest.approx(lead2)
    assert table.growth["prm-orm"].value == pytest.approx(1.0 - lead2)


def test_pooled_values_average_prompt_by_prompt():
    a = [{"random": {1: 0.0}}, {"random": {1: 1.0}}]
    b = [{"random": {1: 1.0}}, {"random": {1: 1.0}}]
    assert bs.pooled_values([a, b]) == [{"random": {1: 0.5}}, {"random": {1: 1.0}}]
    with pytest.raises(ValueError):
        bs.pooled_values([a, b[:1]])


def test_prompt_samples_rejects_ragged_rows():
    with pytest.raises(ValueError):
        bs.PromptSamples([True], ["1", "2"], [0.0], [0.0])
