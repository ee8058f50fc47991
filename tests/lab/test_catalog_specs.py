"""The lab reads the algorithm specs: the catalog, shrink, plan and compare hold no family
table of their own, and their answers for today's algorithms are the specs'."""

from __future__ import annotations

import pytest

from rlhf_lab.errors import LabError, NotFound
from rlhf_lab.planning import catalog, plan, shrink
from rlhf_lab.results import family_tables as compare
from tests._helpers.imports import modules_left_imported
from trainers.core.spec import FAMILY_NAMES, all_specs, family_spec, spec_for


def test_families_are_the_specs() -> None:
    assert list(catalog.FAMILIES) == list(FAMILY_NAMES)
    for name, info in catalog.FAMILIES.items():
        spec = family_spec(name)
        assert info.algorithms == list(spec.algorithm_names)
        assert info.config_module == spec.config_module
        assert info.trainer_module == spec.trainer_module
        assert info.key_metrics == list(spec.key_metric_names())
        assert info.comparison == spec.comparison
        assert info.headline_metric == spec.headline_metric
    assert catalog.all_algorithms() == {s.name: s.family for s in all_specs()}


def test_aliases_come_from_the_specs() -> None:
    expected = {alias.lower(): s.name for s in all_specs() for alias in s.aliases}
    assert catalog.ALGORITHM_ALIASES == expected
    assert catalog.normalize_algorithm("GRPO done right") == "drgrpo"
    assert catalog.normalize_algorithm("Process Reward Model") == "prm"
    assert catalog.algorithm_spec("c-dpo") is spec_for("cdpo")
    with pytest.raises(NotFound) as err:
        catalog.algorithm_spec("dpoo")
    assert "Did you mean" in err.value.message and err.value.next_steps


def test_key_metrics_acceptance_and_watch_read_the_specs() -> None:
    assert catalog.key_metrics_for("direct_alignment", "kto")[-1] == "kl"
    assert "value_loss" in catalog.key_metrics_for("policy_gradients", "ppo")
    assert catalog.key_metrics_for("policy_gradients") == [
        "avg_correctness",
        "avg_format",
        "avg_binary",
        "loss",
        "frac_reward_zero_std",
    ]
    # Reward-model kinds replace the family's list by their own held-out metrics.
    assert catalog.key_metrics_for("reward_models", "prm") == [
        "loss",
        "eval/step_accuracy",
        "eval/majority_baseline",
    ]
    assert catalog.acceptance_for("policy_gradients", "maxrl")[-1].startswith("avg_binary")
    assert catalog.watch_for("policy_gradients", "gspo")[-1].startswith("clip_frac")
    assert catalog.acceptance_for("sft") == list(family_spec("sft").acceptance)


@pytest.mark.parametrize(
    "name,family,expected",
    [
        ("accuracy", None, "max"),
        ("eval/accuracy", "sft", "max"),
        ("loss", None, "min"),
        ("loss", "policy_gradients", None),
        ("eval/loss", "policy_gradients", None),
        ("loss", "direct_alignment", "min"),
        ("frac_reward_zero_std", "policy_gradients", "min"),
        ("rejected_rewards", "direct_alignment", None),
        ("eval/majority_baseline", "reward_models", None),
        ("avg_total", None, "max"),
        ("or_loss", "direct_alignment", "min"),
        ("some_new_loss", None, "min"),
        ("grad_norm", None, None),
        ("eval/exact_match", "rejection_sampling", "max"),
    ],
)
def test_metric_direction(name: str, family: str | None, expected: str | None) -> None:
    assert catalog.metric_direction(name, family) == expected


def test_headline_metric() -> None:
    assert catalog.headline_metric("direct_alignment") == "eval/accuracy"
    assert catalog.headline_metric("policy_gradients") == "eval/avg_correctness"
    assert catalog.headline_metric("reward_models") == "eval/accuracy"
    assert catalog.headline_metric("prm") == "eval/step_accuracy"
    assert catalog.headline_metric("dr. grpo") == "eval/avg_correctness"
    assert catalog.headline_metric("sft") == "eval/loss"
    with pytest.raises(LabError):
        catalog.headline_metric("nonsense")


def test_matched_controls_and_compare_columns_come_from_the_specs() -> None:
    pairs = {"top_per_prompt": "random_per_prompt", "top_k_overall": "random_k_overall"}
    assert catalog.matched_controls() == pairs
    assert plan.MATCHED_CONTROL == pairs and compare.RS_PAIRS == pairs
    assert compare.DA_COLUMNS == family_spec("direct_alignment").comparison_columns
    assert compare.PG_EVAL_COLUMNS == (
        "eval/avg_correctness",
        "eval/avg_format",
        "eval/avg_binary",
    )
    assert compare.RM_COLUMNS[-1] == "step_accuracy_over_baseline"
    assert set(compare.FAMILY_RULES) == set(FAMILY_NAMES)


def test_shrink_rules_are_keyed_by_the_spec_hook() -> None:
    for spec in all_specs():
        assert spec.shrink_key in shrink._RULES, spec.name
    assert shrink._shrink_hook("direct_alignment", "ipo") == "direct_alignment"
    assert shrink._shrink_hook("sft", "not-an-algorithm") == "sft"


def test_memory_hooks_name_families() -> None:
    """Every algorithm's memory hook names a family or a registered hook of its own (online DPO
    keeps its reference loaded: not its family's estimate)."""
    from rlhf_lab.planning.memory.families import FAMILY_ESTIMATORS, HOOK_ESTIMATORS

    keys = {s.memory_key for s in all_specs()}
    assert set(FAMILY_NAMES) <= keys <= set(FAMILY_ESTIMATORS) | set(HOOK_ESTIMATORS)
    assert spec_for("online_dpo").memory_key == "online_dpo"


def test_catalog_import_is_torch_free_and_acyclic() -> None:
    code = "import rlhf_lab.planning.catalog, rlhf_lab.planning.configs, rlhf_lab.results.compare"
    assert modules_left_imported(code, ("torch", "transformers")) == []
    # catalog and configs no longer import each other both ways (not even lazily).
    with open(catalog.__file__, encoding="utf-8") as handle:
        assert "rlhf_lab.planning.configs" not in handle.read()
