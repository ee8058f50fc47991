"""The lab knows the issue-#17 policy-gradient algorithms from their spec entries alone:
recipes, shrink notes, the memory estimate (reference from the spec's KL placement, ReMax's
greedy rollouts) and matched plans."""

from __future__ import annotations

import pytest

from rlhf_lab.planning.catalog import find_recipe, list_recipes
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.memory import (
    GIB,
    KNOWN_ARCHITECTURES,
    count_parameters,
    estimate_memory,
)
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.plan import matched_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig

NEW = ("reinforce_pp", "reinforce_pp_baseline", "remax", "gmpo")
QWEN3_06B = KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"]  # the model the recipes ship


def _components(est) -> dict[str, float]:
    return {c.name: c.gb for c in est.components}


def test_the_new_recipes_are_listed_and_resolve():
    ids = {r.id for r in list_recipes("policy_gradients")}
    assert {f"policy_gradients/{n}" for n in NEW} <= ids
    for name in NEW:
        recipe = find_recipe(name)
        assert recipe.family == "policy_gradients" and recipe.algorithm == name
        assert resolve_config(name).algorithm == name
    assert find_recipe("reinforce++").algorithm == "reinforce_pp"  # the spec's aliases
    assert len(list_recipes()) >= 33 - 2  # + online_dpo and distill from their own branch


def test_memory_reads_the_reference_and_the_greedy_baseline_from_the_spec():
    arch = count_parameters(QWEN3_06B)
    # reinforce_pp ships β 0.01 with its KL in the reward: the reference is loaded
    rpp = estimate_memory(
        "policy_gradients",
        "reinforce_pp",
        resolve_config("reinforce_pp").config,
        arch,
        device="cuda",
    )
    assert "reference weights (frozen)" in _components(rpp)
    # DAPO's spec has no KL term: β > 0 loads nothing
    dapo_cfg = resolve_config("dapo", as_overrides(["loss.beta=0.04"])).data
    dapo = estimate_memory(
        "policy_gradients", "dapo", TrainerConfig("policy_gradients", dapo_cfg), arch, device="cuda"
    )
    assert "reference weights (frozen)" not in _components(dapo)

    remax = estimate_memory(
        "policy_gradients",
        "remax",
        resolve_config("remax", as_overrides(["eval.eval_batch_size=4"])).config,
        arch,
        device="cuda",
    )
    assert any("one greedy completion per prompt" in n for n in remax.notes)
    # 8 prompts × 1 sample: the greedy batch (8 rows, after the samples) adds nothing, so the
    # KV cache is the rollout batch's: 8 sequences × (128 prompt + 512 new) tokens
    kv = 2 * 28 * 8 * 128 * 8 * 640 * 2 + 8 * 151936 * 8
    assert _components(remax)["generation KV cache"] == pytest.approx(kv / GIB, abs=1e-3)
    grpo = estimate_memory(
        "policy_gradients", "grpo", resolve_config("grpo").config, arch, device="cuda"
    )
    assert not any("greedy" in n for n in grpo.notes)


def test_shrink_says_remax_generates_a_greedy_completion_per_prompt():
    shrunk = shrink_config("remax", [], model="tiny")
    assert any("one greedy completion per prompt" in n for n in shrunk.notes)
    assert not any("greedy completion" in n for n in shrink_config("gmpo", [], model="tiny").notes)


def test_matched_overrides_give_the_group_shape_to_the_single_rollout_recipes():
    matched = matched_overrides(["grpo", "reinforce_pp", "remax", "gmpo"], model="tiny")
    assert matched["grpo"] == [] and matched["gmpo"] == []
    for name in ("reinforce_pp", "remax"):  # shipped with one rollout per prompt
        written = [o.text for o in matched[name]]
        assert "rollout.num_rollouts=8" in written and "rollout.prompts_per_step=4" in written
