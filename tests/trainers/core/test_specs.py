"""The algorithm specs: one per algorithm, names that resolve in the family registries, unique
aliases, the trainers' dispatch and defaults read from them."""

from __future__ import annotations

from typing import get_args

import pytest

from tests._helpers.imports import modules_left_imported
from trainers.core.spec import (
    FAMILY_NAMES,
    AlgorithmSpec,
    FamilySpec,
    MetricSpec,
    all_specs,
    family_spec,
    family_specs,
    metrics,
    spec_for,
)

EXPECTED_COUNTS = {
    "policy_gradients": 14,
    "direct_alignment": 10,
    "reward_models": 3,
    "rejection_sampling": 4,
    "sft": 1,
    "distillation": 1,
}


def _config_names(family: str) -> tuple[str, ...]:
    """The algorithm names a family's config model accepts (its Literal field)."""
    from trainers.direct_alignment.config import DirectAlignmentConfig
    from trainers.distillation.config import DistillationConfig
    from trainers.policy_gradients.config import PolicyGradientConfig
    from trainers.rejection_sampling.config import RejectionSamplingConfig
    from trainers.reward_models.config import RewardModelConfig

    fields = {
        "policy_gradients": PolicyGradientConfig.model_fields["algorithm"],
        "direct_alignment": DirectAlignmentConfig.model_fields["loss"],
        "reward_models": RewardModelConfig.model_fields["kind"],
        "rejection_sampling": RejectionSamplingConfig.model_fields["strategy"],
        "distillation": DistillationConfig.model_fields["algorithm"],
    }
    if family == "sft":
        return ("sft",)
    return get_args(fields[family].annotation)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_algorithm_has_exactly_one_spec(family: str) -> None:
    spec = family_spec(family)
    names = spec.algorithm_names
    assert len(names) == EXPECTED_COUNTS[family]
    assert len(set(names)) == len(names)
    assert set(_config_names(family)) == set(names)
    assert spec.default_algorithm in names
    assert all(a.family == family for a in spec.algorithms)
    assert sum(1 for a in all_specs() if a.name in names) == len(names)


def test_aliases_are_unique_across_families() -> None:
    seen: dict[str, str] = {}
    for spec in all_specs():
        for key in (spec.name, *spec.aliases):
            norm = " ".join(key.lower().split())
            assert seen.setdefault(norm, spec.name) == spec.name, (key, seen[norm], spec.name)
    assert spec_for("Dr. GRPO").name == "drgrpo"
    assert spec_for("bradley-terry").name == "preference"
    assert spec_for("  Best  of N ").name == "top_per_prompt"
    with pytest.raises(KeyError):
        spec_for("no such algorithm")


def test_policy_gradient_names_exist_in_the_registries() -> None:
    from trainers.policy_gradients.advantages import (
        ADVANTAGES,
        TOKEN_ADVANTAGES,
        TOKEN_REWARD_ADVANTAGES,
    )
    from trainers.policy_gradients.losses import AGG_MODES, POLICY_LOSS_FUNCTIONS

    registries = (ADVANTAGES, TOKEN_ADVANTAGES, TOKEN_REWARD_ADVANTAGES)
    for spec in family_spec("policy_gradients").algorithms:
        assert sum(spec.advantage in r for r in registries) == 1, spec.name
        assert spec.needs_value_model == (spec.advantage in TOKEN_ADVANTAGES), spec.name
        assert spec.loss in POLICY_LOSS_FUNCTIONS, spec.name
        assert spec.loss_agg in AGG_MODES, spec.name
        assert spec.kl in {"loss", "reward", "none"}
        assert spec.clip_eps is not None and len(spec.clip_eps) == 2


def test_other_families_names_exist_in_their_registries() -> None:
    from trainers.direct_alignment.losses import LOSSES
    from trainers.rejection_sampling.selection import SELECTIONS
    from trainers.reward_models.losses import REWARD_LOSSES

    for spec in family_spec("direct_alignment").algorithms:
        assert spec.loss in LOSSES and spec.default_beta is not None, spec.name
    for spec in family_spec("reward_models").algorithms:
        assert spec.loss in REWARD_LOSSES, spec.name
    for spec in family_spec("rejection_sampling").algorithms:
        assert spec.selection in SELECTIONS and spec.loss == "token_nll", spec.name
        control = spec_for(spec.matched_control or "")
        assert control.matched_control == spec.name and control.is_control != spec.is_control
    assert family_spec("sft").algorithms[0].loss == "token_nll"


def test_policy_gradient_dispatch_reads_the_specs() -> None:
    from trainers.policy_gradients import config as pg_config
    from trainers.policy_gradients import losses as pg_losses

    specs = family_spec("policy_gradients").algorithms
    assert {s.name for s in specs if s.kl == "loss"} == {
        "grpo",
        "drgrpo",
        "gspo",
        "cispo",
        "sapo",
        "gmpo",
    }
    assert {s.name for s in specs if s.kl == "none"} == {"dapo", "maxrl"}
    assert {s.name for s in specs if s.needs_groups} == {s.name for s in specs} - {
        "reinforce",
        "ppo",
        "reinforce_pp",
        "remax",
    }
    for name in ("KL_IN_LOSS", "KL_IGNORED", "GROUP_ALGORITHMS", "DEFAULT_LOSS_AGG"):
        assert not hasattr(pg_config, name) and not hasattr(pg_losses, name), name  # no 2nd table
    for spec in specs:
        assert pg_losses.POLICY_LOSSES[spec.name] is pg_losses.POLICY_LOSS_FUNCTIONS[spec.loss]
    assert pg_losses.POLICY_LOSSES["gspo"] is pg_losses.gspo_loss
    assert pg_losses.POLICY_LOSSES["dapo"] is pg_losses.clipped_surrogate_loss
    assert pg_losses.POLICY_LOSSES["maxrl"] is pg_losses.reinforce_loss


@pytest.mark.parametrize(
    "algorithm,agg,clip,kl_in_reward,old_logps",
    [
        ("grpo", "seq_mean_token_mean", (0.2, 0.2), False, True),
        ("drgrpo", "seq_mean_token_sum_norm", (0.2, 0.2), False, True),
        ("gspo", "seq_mean_token_mean", (3e-4, 4e-4), False, True),
        ("cispo", "token_mean", (1.0, 4.0), False, True),
        ("dapo", "token_mean", (0.2, 0.28), False, True),
        ("rloo", "seq_mean_token_mean", (0.2, 0.2), True, False),
        ("ppo", "seq_mean_token_mean", (0.2, 0.2), True, True),
    ],
)
def test_policy_gradient_config_defaults_come_from_the_spec(
    algorithm: str, agg: str, clip: tuple[float, float], kl_in_reward: bool, old_logps: bool
) -> None:
    from trainers.policy_gradients.config import PolicyGradientConfig

    cfg = PolicyGradientConfig.model_validate(
        {
            "algorithm": algorithm,
            "loss": {"beta": 0.1, "updates_per_rollout": 2},
            "rollout": {"num_rollouts": 2},
        }
    )
    assert cfg.loss.loss_agg == agg
    assert (cfg.loss.clip_eps_lo, cfg.loss.clip_eps_hi) == clip
    assert (cfg.spec.kl == "reward") == kl_in_reward
    assert cfg.uses_kl == (cfg.spec.kl != "none")
    assert cfg.needs_old_logps == old_logps


def test_direct_alignment_and_other_configs_read_the_specs() -> None:
    from trainers.direct_alignment.config import DirectAlignmentConfig
    from trainers.rejection_sampling.config import MATCHED_CONTROL
    from trainers.reward_models.config import ALGORITHM_NAMES, BUILTIN_BY_KIND

    assert DirectAlignmentConfig(loss="simpo").beta == 2.0
    assert not DirectAlignmentConfig(loss="orpo").needs_reference
    assert DirectAlignmentConfig(loss="kto").needs_reference
    assert ALGORITHM_NAMES == {"preference": "preference_rm", "orm": "orm", "prm": "prm"}
    assert BUILTIN_BY_KIND["prm"] == "builtin:reasoning-steps"
    assert MATCHED_CONTROL["top_k_overall"] == "random_k_overall"
    assert MATCHED_CONTROL["random_per_prompt"] == "top_per_prompt"


def test_headline_metrics_are_key_or_declared_metrics() -> None:
    for fam in family_specs():
        declared = {m.name for m in fam.key_metrics}
        for algo in fam.algorithms:
            declared |= {m.name for m in algo.key_metrics}
        assert fam.headline_metric.startswith("eval/"), fam.name
        for algo in fam.algorithms:
            headline = algo.headline_metric or fam.headline_metric
            assert headline.startswith("eval/"), algo.name
            base = headline.removeprefix("eval/")
            assert headline in declared or base in declared, algo.name


def test_spec_records_are_frozen() -> None:
    spec = spec_for("dpo")
    assert isinstance(spec, AlgorithmSpec) and isinstance(family_spec("sft"), FamilySpec)
    with pytest.raises(AttributeError):
        spec.loss = "ipo"  # type: ignore[misc]
    assert spec.shrink_key == "direct_alignment" and spec.memory_key == "direct_alignment"


def test_spec_modules_do_not_import_torch() -> None:
    code = (
        "import trainers.core.spec as s; s.all_specs(); "
        "import trainers.policy_gradients.config, trainers.direct_alignment.config"
    )
    assert modules_left_imported(code, ("torch",)) == []


def test_one_chunked_loop_gives_log_probs_and_entropy() -> None:
    import torch

    from trainers.core.logprobs import hidden_to_logps, hidden_to_token_stats, token_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    logps, entropy = hidden_to_token_stats(hidden, head, labels, chunk_size=2, with_entropy=True)
    logits = head(hidden).float()
    naive = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    probs = torch.softmax(logits, -1)
    assert torch.allclose(logps, naive, atol=1e-6)
    assert torch.allclose(entropy, -(probs * probs.log()).sum(-1), atol=1e-5)
    assert torch.allclose(token_entropy(logits), entropy, atol=1e-6)
    assert not entropy.requires_grad and logps.requires_grad
    assert torch.equal(hidden_to_logps(hidden, head, labels, chunk_size=2), logps)
    assert hidden_to_token_stats(hidden, head, labels)[1] is None


def test_dapo_and_maxrl_features_are_spec_flags() -> None:
    flagged = {s.name for s in family_spec("policy_gradients").algorithms if s.dynamic_sampling}
    assert flagged == {"dapo"}
    assert {s.name for s in all_specs() if s.overlong_penalty} == {"dapo"}
    assert {s.name for s in all_specs() if s.reward_signal == "binary"} == {"maxrl"}


def test_one_process_runs_are_declared_once_in_the_specs():
    """The one answer the trainers' harness and the lab's launch check both act on."""
    from trainers.core.spec import one_process_only

    assert one_process_only("distillation", "distill", lora=False) == (
        "family",
        "the distillation trainer",
    )
    assert one_process_only("direct_alignment", "online_dpo", lora=False) == (
        "algorithm",
        "online DPO",
    )
    assert one_process_only("direct_alignment", "dpo", lora=True) is None
    assert one_process_only("policy_gradients", "grpo", lora=False) is None
    assert one_process_only("policy_gradients", "grpo", lora=True) == (
        "lora",
        "direct_alignment, reward_models, sft",
    )


def test_metrics_are_declared_as_words_with_a_direction_suffix() -> None:
    assert metrics("accuracy+ eval/loss-", "rejected_rewards~") == (
        MetricSpec("accuracy", higher_is_better=True),
        MetricSpec("eval/loss", higher_is_better=False),
        MetricSpec("rejected_rewards", higher_is_better=None),
    )
    assert metrics("  kl_ref~\n gold_reward+ ", key=False) == (
        MetricSpec("kl_ref", higher_is_better=None, key=False),
        MetricSpec("gold_reward", higher_is_better=True, key=False),
    )
    assert metrics() == () == metrics("")
    for bad in ("accuracy", "accuracy* loss-", "+", "margins+ tie_frac"):
        with pytest.raises(ValueError, match=r"must be a name followed by \+ \(higher is better\)"):
            metrics(bad)


def test_policy_gradient_needs_follow_from_the_estimator_and_the_loss() -> None:
    """Groups, old log-probs and a value model are read off each row's estimator and loss (the
    spec's GROUP_ADVANTAGES / RATIO_LOSSES / CRITIC_ADVANTAGE), named in the registries."""
    from trainers.policy_gradients import spec as pg_spec
    from trainers.policy_gradients.advantages import (
        ADVANTAGES,
        TOKEN_ADVANTAGES,
        TOKEN_REWARD_ADVANTAGES,
    )
    from trainers.policy_gradients.losses import POLICY_LOSS_FUNCTIONS

    assert pg_spec.GROUP_ADVANTAGES <= set(ADVANTAGES) | set(TOKEN_REWARD_ADVANTAGES)
    assert pg_spec.RATIO_LOSSES <= set(POLICY_LOSS_FUNCTIONS) - {"reinforce"}
    assert pg_spec.CRITIC_ADVANTAGE in TOKEN_ADVANTAGES
    specs = {s.name: s for s in family_spec("policy_gradients").algorithms}
    assert {n for n, s in specs.items() if s.needs_old_logprobs} == set(specs) - {
        "reinforce",
        "rloo",
        "maxrl",
        "remax",
    }
    assert {n for n, s in specs.items() if s.needs_value_model} == {"ppo"}
