"""REINFORCE++, REINFORCE++-baseline, ReMax and GMPO (issue #17): their pure functions against
numbers computed by hand, their spec entries, and the config checks they add.

The two-step end-to-end runs are the parametrised ``test_every_algorithm_runs_two_rollout_steps``
in test_pg_train.py (it runs every name the spec declares); ReMax's greedy baseline is checked
end to end below, and the learning runs are in test_pg_new_algorithms_learning.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import torch_threads, trainer_argv
from pydantic import ValidationError

from tests._helpers.paths import configs_of
from tests._helpers.quick_runs import PG_ONE_STEP_ON_TINY
from trainers.core.rundir import read_jsonl
from trainers.core.spec import spec_for
from trainers.policy_gradients import train as pg_train
from trainers.policy_gradients.advantages import (
    TOKEN_REWARD_ADVANTAGES,
    grpo_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
    returns_to_go,
    whiten_over_batch,
)
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossParams,
    aggregate,
    gmpo_loss,
)

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])


def rows(x: torch.Tensor) -> list[list[float]]:
    return [[round(v, 6) for v in row] for row in x.tolist()]


# ---------------------------------------------------------------------------------------------
# Returns-to-go and the batch-wide normalisation
# ---------------------------------------------------------------------------------------------


def test_returns_to_go_sums_each_rows_rewards_backwards_inside_the_mask():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 7.0], [4.0, 5.0, 9.0, 9.0]])  # 7, 9: padding
    assert rows(returns_to_go(rewards, MASK)) == [[6.0, 5.0, 3.0, 0.0], [9.0, 5.0, 0.0, 0.0]]


def test_whiten_over_batch_uses_every_token_and_the_population_std():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 5.0, 100.0, 100.0]])
    # tokens 1..5: mean 3, population variance (4 + 1 + 0 + 1 + 4) / 5 = 2
    s = math.sqrt(2.0)
    want = [[-2 / s, -1 / s, 0.0, 0.0], [1 / s, 2 / s, 0.0, 0.0]]
    assert rows(whiten_over_batch(x, MASK)) == rows(torch.tensor(want))
    constant = torch.full((2, 4), 0.7)
    assert torch.equal(whiten_over_batch(constant, MASK), torch.zeros(2, 4))


# ---------------------------------------------------------------------------------------------
# REINFORCE++ and REINFORCE++-baseline
# ---------------------------------------------------------------------------------------------


def test_reinforce_pp_token_kl_in_the_reward_then_global_normalisation():
    r = torch.tensor([1.0, 0.0])
    penalty = torch.tensor([[0.1, 0.2, 0.0, 9.0], [0.3, 0.0, 9.0, 9.0]])  # β·k_t; 9 = padding
    # row 0 token rewards −0.1, −0.2, 1 − 0 → returns 0.7, 0.8, 1.0
    # row 1 token rewards −0.3, 0 − 0   → returns −0.3, 0.0
    returns = [0.7, 0.8, 1.0, -0.3, 0.0]
    mean = sum(returns) / 5  # 0.44
    std = math.sqrt(sum((g - mean) ** 2 for g in returns) / 5)  # sqrt(0.2504)
    want = [(g - mean) / std for g in returns]
    got = reinforce_pp_advantages(r, penalty, MASK)
    assert got[0, :3].tolist() == pytest.approx(want[:3], abs=1e-6)
    assert got[1, :2].tolist() == pytest.approx(want[3:], abs=1e-6)
    assert got[0, 3] == 0 and got[1, 2:].abs().sum() == 0  # nothing outside the mask
    # without a KL term every token of a row carries the row's reward, normalised over the batch
    no_kl = reinforce_pp_advantages(r, torch.zeros(2, 4), MASK)
    # 3 tokens at 1, 2 tokens at 0: mean 0.6, std sqrt(0.24)
    s = math.sqrt(0.24)
    assert no_kl[0, :3].tolist() == pytest.approx([0.4 / s] * 3, abs=1e-6)
    assert no_kl[1, :2].tolist() == pytest.approx([-0.6 / s] * 2, abs=1e-6)


def test_reinforce_pp_baseline_centres_per_group_then_normalises_over_the_batch():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5])  # G = 2: groups (1, 0) and (0.5, 0.5)
    mask = torch.ones(4, 1)
    got = reinforce_pp_baseline_advantages(r, torch.zeros(4, 1), mask, G=2)
    # centred 0.5, −0.5, 0, 0; batch std sqrt(0.5 / 4) → ±sqrt(2), and the flat group stays 0
    assert got[:, 0].tolist() == pytest.approx([math.sqrt(2), -math.sqrt(2), 0.0, 0.0], abs=1e-6)
    # GRPO divides by each group's own (unbiased) std instead: ±1/sqrt(2)
    grpo = grpo_advantages(r, 2)
    assert grpo.tolist() == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0], abs=1e-6)


def test_reinforce_pp_baseline_subtracts_the_group_mean_before_the_kl():
    r = torch.tensor([2.0, 0.0])  # one group of 2: centred ±1
    mask = torch.ones(2, 2)
    penalty = torch.tensor([[0.5, 0.0], [0.0, 0.0]])
    # row 0: tokens −0.5, 1 → returns 0.5, 1; row 1: tokens 0, −1 → returns −1, −1
    returns = [0.5, 1.0, -1.0, -1.0]
    mean = sum(returns) / 4
    std = math.sqrt(sum((g - mean) ** 2 for g in returns) / 4)
    got = reinforce_pp_baseline_advantages(r, penalty, mask, G=2)
    assert got.reshape(-1).tolist() == pytest.approx([(g - mean) / std for g in returns], abs=1e-6)


# ---------------------------------------------------------------------------------------------
# ReMax
# ---------------------------------------------------------------------------------------------


def test_remax_subtracts_the_greedy_reward_from_the_return_to_go():
    r = torch.tensor([1.0, 0.2])
    greedy = torch.tensor([0.5, 0.2])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    got = remax_advantages(r, greedy, torch.zeros(2, 2), mask)
    assert rows(got) == [[0.5, 0.5], [0.0, 0.0]]  # the sample that ties the greedy one: 0
    penalty = torch.tensor([[0.1, 0.1], [0.2, 5.0]])
    # row 0: returns 1 − 0.2 = 0.8, 1 − 0.1 = 0.9, minus 0.5; row 1: 0.2 − 0.2 − 0.2
    got = remax_advantages(r, greedy, penalty, mask)
    assert rows(got) == [[0.3, 0.4], [-0.2, 0.0]]
    # no normalisation: scaling the rewards scales the advantages
    assert torch.allclose(
        remax_advantages(3 * r, 3 * greedy, torch.zeros(2, 2), mask),
        3 * got.new_tensor([[0.5, 0.5], [0.0, 0.0]]),
    )


def test_remax_needs_the_greedy_reward():
    with pytest.raises(ValueError, match="greedy"):
        TOKEN_REWARD_ADVANTAGES["remax"](
            {"total": torch.ones(2)}, torch.zeros(2, 1), torch.ones(2, 1), 1
        )


# ---------------------------------------------------------------------------------------------
# GMPO
# ---------------------------------------------------------------------------------------------


def test_gmpo_geometric_mean_of_log_space_clipped_ratios():
    # row 0: A = +1, log-ratios 0.5, −0.1, 0.2 (0.5 is capped at ε_hi = 0.4)
    # row 1: A = −1, log-ratios −0.6, 0.3 (−0.6 is floored at −ε_lo = −0.4), third token padding
    log_ratio = torch.tensor([[0.5, -0.1, 0.2], [-0.6, 0.3, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    old = torch.tensor([[-1.0, -2.0, -1.5], [-0.7, -1.1, -2.0]])
    logp = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    params = PolicyLossParams(clip_eps_lo=0.4, clip_eps_hi=0.4)
    per_token, stats = gmpo_loss(PolicyLossInputs(logp, old, adv, mask), params)

    s0 = math.exp((0.4 - 0.1 + 0.2) / 3)  # 1.181360...
    s1 = math.exp((-0.4 + 0.3) / 2)  # 0.951229...
    assert per_token[0].tolist() == pytest.approx([-s0] * 3, abs=1e-6)
    assert per_token[1, :2].tolist() == pytest.approx([s1] * 2, abs=1e-6)
    assert per_token[1, 2] == 0
    assert stats["ratio"][0, 0].item() == pytest.approx(s0, abs=1e-6)
    assert stats["clipped"].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]

    loss = aggregate(
        per_token,
        mask,
        "seq_mean_token_mean",
        step_num_seqs=2,
        step_num_tokens=5.0,
        max_new_tokens=3,
    )
    assert loss.item() == pytest.approx((-s0 + s1) / 2, abs=1e-6)  # the mean of −A·s
    loss.backward()
    # d(−A·s)/dlogρ_t = −A·s/n on tokens inside the clip, 0 on the clipped ones; /2 sequences
    assert logp.grad[0].tolist() == pytest.approx([0.0, -s0 / 3 / 2, -s0 / 3 / 2], abs=1e-6)
    assert logp.grad[1].tolist() == pytest.approx([0.0, s1 / 2 / 2, 0.0], abs=1e-6)


def test_gmpo_clip_is_pessimistic_only():
    """A log-ratio beyond the bound on the side that does not help the objective is kept: for
    A > 0 a very negative log-ratio is not raised to −ε_lo (PPO's min in log space)."""
    old = torch.zeros(1, 2)
    logp = torch.tensor([[-1.0, 0.0]])
    adv = torch.ones(1, 2)
    params = PolicyLossParams(clip_eps_lo=0.4, clip_eps_hi=0.4)
    per_token, stats = gmpo_loss(PolicyLossInputs(logp, old, adv, torch.ones(1, 2)), params)
    assert per_token[0, 0].item() == pytest.approx(-math.exp(-0.5), abs=1e-6)
    assert stats["clipped"].sum() == 0


# ---------------------------------------------------------------------------------------------
# Specs and config
# ---------------------------------------------------------------------------------------------


def test_the_four_specs_name_their_pieces():
    assert spec_for("REINFORCE++").name == "reinforce_pp"
    assert spec_for("reinforce++-baseline").name == "reinforce_pp_baseline"
    assert spec_for("ReMax").name == "remax"
    assert spec_for("geometric-mean policy optimization").name == "gmpo"
    for name in ("reinforce_pp", "reinforce_pp_baseline", "remax"):
        spec = spec_for(name)
        assert spec.advantage in TOKEN_REWARD_ADVANTAGES and spec.kl == "reward", name
    assert spec_for("remax").greedy_baseline and not spec_for("reinforce_pp").greedy_baseline
    assert POLICY_LOSSES["gmpo"] is gmpo_loss and spec_for("gmpo").clip_eps == (0.4, 0.4)
    assert (
        spec_for("reinforce_pp_baseline").needs_groups and not spec_for("reinforce_pp").needs_groups
    )


def test_remax_refuses_a_whitened_reward_model_score():
    with pytest.raises(ValidationError, match="reward.normalize"):
        PolicyGradientConfig(
            algorithm="remax",
            data={"source": "preference", "dataset": "builtin"},
            reward={"model": "some/rm", "normalize": "batch"},
        )
    PolicyGradientConfig(  # the same with normalize none is fine
        algorithm="remax",
        data={"source": "preference", "dataset": "builtin"},
        reward={"model": "some/rm"},
    )


# ---------------------------------------------------------------------------------------------
# End to end on tiny: ReMax's greedy baseline, REINFORCE++'s reward KL
# ---------------------------------------------------------------------------------------------

CONFIGS = configs_of("policy_gradients")
SMALL = [
    *PG_ONE_STEP_ON_TINY,
    "train.gradient_accumulation_steps=1",
    "eval.num_samples=2",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]


def alternating_rewards(texts, metas, lengths, *, format_weight=0.5, penalty=None):
    """Stand-in verifier: row i is right iff i is odd (so the two greedy completions of a step,
    scored as rows 0 and 1, get 0 and 1, and each sampled group holds one of each)."""
    n = len(texts)
    correct = torch.tensor([float(i % 2) for i in range(n)])
    zeros = torch.zeros(n)
    fmt = torch.full((n,), 0.5)
    total = correct + format_weight * fmt
    return {
        "correctness": correct,
        "format": fmt,
        "penalty": zeros,
        "binary": correct,
        "total": total,
    }


@pytest.fixture
def one_thread():
    with torch_threads(1):
        yield


def test_remax_subtracts_the_scored_greedy_completion(tmp_path, one_thread):
    run_dir = tmp_path / "remax"
    argv = trainer_argv(CONFIGS / "remax.yaml", run_dir, SMALL)
    assert pg_train.main.with_options(verifier=alternating_rewards)(argv) == 0
    (rollout,) = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "rollout"]
    # greedy totals: prompt 0 → 0 + 0.25, prompt 1 → 1 + 0.25, each on its prompt's 2 rows
    assert rollout["avg_greedy"] == pytest.approx(0.75)
    samples = [s for s in read_jsonl(run_dir / "samples.jsonl") if s["kind"] == "rollout"]
    assert [s["greedy"] for s in samples] == pytest.approx([0.25, 1.25])
    for s in samples:  # β = 0: every token's advantage is the sample's total minus the greedy one
        assert s["advantage"] == pytest.approx(s["total"] - s["greedy"])


def test_reinforce_pp_puts_its_k1_kl_in_the_reward(tmp_path, one_thread):
    run_dir = tmp_path / "rpp"
    argv = trainer_argv(CONFIGS / "reinforce_pp.yaml", run_dir, SMALL)
    assert pg_train.main.with_options(verifier=alternating_rewards)(argv) == 0
    (rollout,) = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "rollout"]
    # π_old is the reference at step 1: k1 = log π_old − log π_ref is exactly 0 on every token
    assert rollout["kl_reward"] == 0.0 and rollout["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    config = (run_dir / "config.yaml").read_text()
    assert "kl_estimator: k1" in config and "beta: 0.01" in config


@pytest.mark.parametrize("a", [0.8, -0.8])
def test_gmpo_gradient_sign_on_policy(a):
    """At ρ = 1 a positive advantage makes the loss fall as logπ rises, a negative one rise, and
    nothing flows into padding (as test_pg_math checks for the other losses)."""
    lp = torch.tensor([[-1.0, -0.5, 0.0]])
    logp = lp.clone().requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.tensor([[a, a, float("nan")]])
    per_token, _ = gmpo_loss(PolicyLossInputs(logp, lp, adv, mask), PolicyLossParams(0.4, 0.4))
    aggregate(
        per_token, mask, "seq_mean_token_mean", step_num_seqs=1, step_num_tokens=2, max_new_tokens=4
    ).backward()
    g = logp.grad[0]
    assert (g[:2] < 0).all() if a > 0 else (g[:2] > 0).all()
    assert g[2] == 0 and torch.isfinite(g).all()
