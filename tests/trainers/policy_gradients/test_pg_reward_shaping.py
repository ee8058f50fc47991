"""Reward shaping of the policy-gradient family as pure tensor functions, checked by hand:
batch whitening, running statistics merged over batches (Welford/Chan), clipping, the missing-EOS
penalty, the weighted total; and the reward section of the config (defaults filled per prompt
source, the bad combinations refused with the key named)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from tests._helpers.paths import configs_of
from trainers.core.config import ConfigError, load_config, validate_config
from trainers.core.verifier import text_rewards
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.rewards import (
    RunningMoments,
    batch_whiten,
    clip_reward,
    eos_penalty,
    normalize_scores,
    shaped_total,
)
from trainers.policy_gradients.rollout import sequence_kl


def t(values):
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------


def test_batch_whitening_by_hand():
    # mean 2.5, population variance ((−1.5)² + (−0.5)² + 0.5² + 1.5²)/4 = 1.25
    out = batch_whiten(t([1.0, 2.0, 3.0, 4.0]))
    sd = math.sqrt(1.25)
    assert out.tolist() == pytest.approx([-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd], rel=1e-6)
    assert batch_whiten(t([7.0])).tolist() == [0.0]  # one score: nothing to compare
    assert batch_whiten(t([3.0, 3.0])).tolist() == [0.0, 0.0]  # no spread: all 0, no NaN


def test_running_moments_merge_two_batches_exactly():
    a, b = [1.0, 2.0, 3.0], [10.0, 20.0]
    moments = RunningMoments()
    moments.update(t(a))
    assert (moments.count, moments.mean) == (3, pytest.approx(2.0))
    assert moments.var == pytest.approx(2.0 / 3.0)  # population variance of 1, 2, 3
    moments.update(t(b))
    everything = a + b
    assert moments.count == 5
    assert moments.mean == pytest.approx(statistics.fmean(everything))  # 7.2
    assert moments.var == pytest.approx(statistics.pvariance(everything))  # 50.96
    again = RunningMoments.from_state(moments.state())  # what a checkpoint keeps
    assert again.state() == moments.state()
    assert RunningMoments.from_state(None).count == 0


def test_running_whitening_uses_the_statistics_after_the_batch():
    moments = RunningMoments()
    first = normalize_scores(t([1.0, 3.0]), "running", moments)
    assert first.tolist() == pytest.approx([-1.0, 1.0], rel=1e-6)  # mean 2, std 1
    second = normalize_scores(t([5.0]), "running", moments)
    # now 1, 3, 5: mean 3, population std sqrt(8/3)
    assert second.tolist() == pytest.approx([2.0 / math.sqrt(8.0 / 3.0)], rel=1e-6)
    assert moments.count == 3
    alone = normalize_scores(t([4.0]), "running", RunningMoments())
    assert alone.tolist() == [0.0]  # a single score has no spread yet


def test_normalize_none_and_batch_leave_the_moments_alone():
    moments = RunningMoments()
    assert normalize_scores(t([1.0, 5.0]), "none", moments).tolist() == [1.0, 5.0]
    assert normalize_scores(t([1.0, 5.0]), "batch", moments).tolist() == pytest.approx(
        [-1.0, 1.0], rel=1e-6
    )
    assert moments.count == 0
    with pytest.raises(ValueError, match="unknown reward normalisation"):
        normalize_scores(t([1.0]), "zscore", moments)


# ---------------------------------------------------------------------------------------------
# Clip, EOS penalty, the total
# ---------------------------------------------------------------------------------------------


def test_clip_and_missing_eos_penalty():
    assert clip_reward(t([-7.0, -1.0, 0.5, 9.0]), 2.0).tolist() == [-2.0, -1.0, 0.5, 2.0]
    assert clip_reward(t([-7.0, 9.0]), None).tolist() == [-7.0, 9.0]
    truncated = torch.tensor([True, False, True])
    assert eos_penalty(truncated, 1.5).tolist() == [-1.5, 0.0, -1.5]
    assert eos_penalty(truncated, 0.0).tolist() == [0.0, 0.0, 0.0]


def test_shaped_total_weights_penalises_and_clips():
    parts = {
        "model_norm": t([2.0, -1.0, 0.5]),
        "correctness": t([1.0, 0.0, 0.5]),
        "format": t([1.0, 0.5, 0.0]),
        "penalty": t([0.0, -0.25, 0.0]),
    }
    truncated = torch.tensor([False, True, False])
    weights = dict(
        model_weight=0.5, verifier_weight=2.0, format_weight=0.1, missing_eos_penalty=1.0
    )
    total = shaped_total(parts, truncated, **weights)
    # 0.5·m + 2·c + 0.1·f + penalty − 1·truncated
    expected = [1.0 + 2.0 + 0.1, -0.5 + 0.0 + 0.05 - 0.25 - 1.0, 0.25 + 1.0 + 0.0]
    assert total.tolist() == pytest.approx(expected, rel=1e-6)
    clipped = shaped_total(parts, truncated, **weights, clip=1.2)
    assert clipped.tolist() == pytest.approx([1.2, -1.2, 1.2], rel=1e-6)
    # the verifier-only default of today: correctness + 0.5·format + penalty
    plain = shaped_total(
        {k: parts[k] for k in ("correctness", "format", "penalty")},
        torch.zeros(3, dtype=torch.bool),
        model_weight=0.0,
        verifier_weight=1.0,
        format_weight=0.5,
    )
    assert plain.tolist() == pytest.approx([1.5, -0.0, 0.5], abs=1e-6)


def test_text_rewards_need_no_verifier():
    out = text_rewards(
        ["<think>a</think><answer>b</answer>", "plain"], [3, 500], penalty=(512, 128)
    )
    assert out["format"].tolist() == [1.0, 0.0]
    assert out["penalty"].tolist() == pytest.approx([0.0, (384 - 500) / 128])


def test_sequence_kl_sums_k3_over_the_completion():
    logp = t([[-1.0, -2.0, -3.0]])
    ref = t([[-1.5, -2.0, -1.0]])
    mask = t([[1.0, 1.0, 0.0]])
    d = [0.5, 0.0]  # the third token is padding
    expected = sum(math.exp(-x) - 1 + x for x in d)
    assert sequence_kl(logp, ref, mask).tolist() == pytest.approx([expected], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# The config's reward section
# ---------------------------------------------------------------------------------------------


def cfg_of(**sections) -> PolicyGradientConfig:
    return validate_config(dict(sections), PolicyGradientConfig)


def test_reward_defaults_follow_the_prompt_source():
    rg = cfg_of()
    assert (rg.reward.model_weight, rg.reward.verifier_weight, rg.reward.format_weight) == (
        0.0,
        1.0,
        0.5,
    )
    assert rg.gold_source == "verifier"
    pref = cfg_of(
        data={"source": "preference", "dataset": "Anthropic/hh-rlhf"}, reward={"model": "x/rm"}
    )
    assert (pref.reward.model_weight, pref.reward.verifier_weight, pref.reward.format_weight) == (
        1.0,
        0.0,
        0.0,
    )
    assert pref.gold_source is None and not pref.data.has_verifier
    builtin = cfg_of(data={"source": "preference", "dataset": "builtin"}, reward={"model": "x/rm"})
    assert builtin.data.has_verifier and builtin.gold_source == "verifier"
    assert builtin.reward.verifier_weight == 0.0  # the verifier is the held-out gold there
    gold = cfg_of(reward={"model": "x/rm", "gold_model": "y/rm"})
    assert gold.gold_source == "model"
    assert gold.reward.verifier_weight == 1.0  # reasoning-gym prompts: verifier + model


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"data": {"source": "preference", "dataset": "builtin"}},
            "every reward weight is 0 (reward.model_weight=0, reward.verifier_weight=0, "
            "reward.format_weight=0)",
        ),
        (
            {"reward": {"verifier_weight": 0, "format_weight": 0}},
            "every reward weight is 0",
        ),
        (
            {
                "reward": {
                    "model": "x/rm",
                    "model_weight": 0,
                    "verifier_weight": 0,
                    "format_weight": 0,
                }
            },
            "every reward weight is 0",
        ),
        (
            {"data": {"source": "preference", "dataset": "a/b"}, "reward": {"verifier_weight": 1}},
            "reward.verifier_weight=1.0 needs prompts the reasoning-gym verifier can score",
        ),
        ({"data": {"source": "preference"}}, "data.dataset is required"),
        ({"data": {"dataset": "a/b"}}, "is read only with data.source=preference"),
        ({"reward": {"model_weight": 1.0}}, "reward.model_weight > 0 needs reward.model"),
        ({"reward": {"normalize": "running"}}, "reward.normalize='running'"),
        (
            {
                "algorithm": "dapo",
                "data": {"source": "preference", "dataset": "a/b"},
                "reward": {"model": "x/rm"},
            },
            "algorithm dapo reads reasoning-gym correctness",
        ),
        ({"reward": {"clip": 0}}, "reward.clip"),
        ({"reward": {"normalize": "zscore"}}, "reward.normalize"),
    ],
)
def test_bad_reward_configs_are_refused_naming_the_key(sections, message):
    with pytest.raises(ConfigError) as err:
        cfg_of(**sections)
    assert message in str(err.value)


def test_shipped_reward_model_recipes(tmp_path):

    configs = configs_of("policy_gradients")
    for name, algorithm, normalize in (("ppo_rm", "ppo", "running"), ("grpo_rm", "grpo", "none")):
        cfg = load_config(configs / f"{name}.yaml", PolicyGradientConfig)
        assert cfg.algorithm == algorithm and cfg.data.source == "preference"
        assert cfg.reward.model and cfg.reward.model_weight == 1.0
        assert cfg.reward.verifier_weight == 0.0 and cfg.reward.format_weight == 0.0
        assert cfg.reward.normalize == normalize and cfg.reward.missing_eos_penalty == 1.0
        assert cfg.uses_kl  # the KL leash to the SFT start is on
