"""The lab's view of policy-gradient runs rewarded by a reward model (torch-free): the memory
estimate counts the reward model and the gold reward model, and the shipped RM recipes shrink on
the tiny preset with the reward model kept and offline prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.memory import estimate_memory
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig

# a small Llama-shaped reward model's config.json (what the estimate reads; no weights needed)
RM_CONFIG = {
    "architectures": ["LlamaForSequenceClassification"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "num_labels": 1,
}


@pytest.fixture(autouse=True)
def _lab_root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path / "lab"))


def _rm_folder(tmp_path, name="rm"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(RM_CONFIG))
    return folder


def _components(est) -> dict[str, float]:
    return {c.name: c.gb for c in est.components}


def test_memory_estimate_counts_the_reward_model_and_the_gold(tmp_path):
    rm = _rm_folder(tmp_path)
    base = ["model.name=tiny", "data.source=preference", "data.dataset=builtin"]
    plain = resolve_config("grpo", as_overrides(["model.name=tiny"])).data
    with_rm = resolve_config("grpo", as_overrides([*base, f"reward.model={rm}"])).data
    with_gold = resolve_config(
        "grpo", as_overrides([*base, f"reward.model={rm}", f"reward.gold_model={rm}"])
    )
    e0 = estimate_memory(
        "policy_gradients", "grpo", TrainerConfig("policy_gradients", plain), device="cpu"
    )
    e1 = estimate_memory(
        "policy_gradients", "grpo", TrainerConfig("policy_gradients", with_rm), device="cpu"
    )
    e2 = estimate_memory("policy_gradients", "grpo", with_gold.config, device="cpu")
    assert e0.total_gb < e1.total_gb < e2.total_gb
    c1 = _components(e1)
    # 4096·256 embeddings + 4 layers·(4·256² attention + 3·256·512 MLP + norms) + head ≈ 4.2M
    assert 0.01 < c1["reward model weights (frozen)"] < 0.02  # ≈ 4.2M params × 4 B (fp32 on cpu)
    assert c1["reward model forward (no grad)"] > 0
    assert "gold reward model weights (frozen)" in _components(e2)
    phases = {c.name: c.phases for c in e1.components}
    assert phases["reward model weights (frozen)"] == ["train", "generate"]


def test_memory_estimate_notes_a_reward_model_it_cannot_size(tmp_path):
    data = resolve_config(
        "grpo", as_overrides(["model.name=tiny", f"reward.model={tmp_path / 'gone'}"])
    ).data
    est = estimate_memory(
        "policy_gradients", "grpo", TrainerConfig("policy_gradients", data), device="cpu"
    )
    assert any(n.startswith("reward model ") and "not counted" in n for n in est.notes)


@pytest.mark.parametrize("recipe", ["ppo_rm", "grpo_rm"])
def test_reward_model_recipes_shrink_on_tiny_with_the_reward_model_kept(recipe):
    res = shrink_config(recipe, model="tiny")
    cfg = res.config
    assert cfg["data"]["source"] == "preference" and cfg["data"]["dataset"] == "builtin"
    assert cfg["reward"]["model"] == resolve_config(recipe).data["reward"]["model"]
    assert any("reward.model=" in n and "run:<its run id>" in n for n in res.notes)
    # the recipe's own (pretrained) model: the hub set, not cached here, becomes the built-in
    # prompts, and the notes say so (issue 25: a shrink never plans a run that fails offline)
    kept = shrink_config(recipe)
    assert kept.config["data"]["dataset"] == "builtin"
    assert any("Anthropic/hh-rlhf" in n for n in kept.notes)
    mine = shrink_config(
        recipe, as_overrides(["reward.model=/somewhere/final_model"]), model="tiny"
    )
    assert mine.config["reward"]["model"] == "/somewhere/final_model"
    # against a reward model on tiny: 20 steps at lr 1e-4 (lr 1e-3 made PPO diverge), and PPO's
    # KL in the reward is k1 (k3 as a per-token reward pushed the policy off its reference)
    assert cfg["train"]["learning_rate"] == 1.0e-4 and cfg["train"]["max_steps"] == 20
    assert cfg["loss"]["kl_estimator"] == ("k1" if recipe == "ppo_rm" else "k3")
    verifier = shrink_config(recipe.removesuffix("_rm"), model="tiny").config
    assert verifier["train"]["learning_rate"] == 1.0e-3 and verifier["train"]["max_steps"] == 10


def test_ledger_names_the_preference_dataset_of_a_preference_prompt_run():
    """A policy-gradient run on a preference set's prompts keeps the recipe's reasoning-gym
    ``data.specs`` in its config (unused): the ledger row and front matter name the preference
    dataset it really drew prompts from, not the unused task."""
    from rlhf_lab import ledger
    from tests.lab.test_overoptimisation import CAMP, RM_CONFIG, gao, make_run, rlhf_rows

    run = "ppo-20260302-000000-0009"
    specs = 'data.specs=[{"name": "spell_backward"}]'  # as the trainer's resolved config has
    make_run(run, rlhf_rows(gao), recipe="ppo_rm", overrides=(*RM_CONFIG, specs))
    rec = ledger.record_run(run, plot=False)
    assert rec.dataset == "builtin (preference prompts)"
    text = Path(ledger.show_campaign(CAMP).campaign.path).read_text()
    front = text.split("---")[1]
    assert "builtin (preference prompts)" in front and "spell_backward" not in front
    # a verifier run still names its reasoning-gym tasks
    make_run("grpo-20260302-000000-0008", rlhf_rows(gao), recipe="grpo", overrides=(specs,))
    assert ledger.record_run("grpo-20260302-000000-0008", plot=False).dataset == "spell_backward"
