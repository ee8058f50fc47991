"""The memory estimate with LoRA adapters (rlhf_lab/planning/memory/lora.py): adapter parameters from
the architecture (hand-computed), only the adapters train, no reference copy, and the lab's
config checks accept and refuse ``model.lora.*`` overrides."""

from __future__ import annotations

import pytest

from rlhf_lab.errors import LabError
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.memory import GIB, arch_from_config, estimate_memory
from rlhf_lab.planning.memory.lora import LoraPlan, adapter_params, lora_plan
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.trainer_config import TrainerConfig
from tests._helpers.model_configs import GPT2, LLAMA2_7B

LORA = {"enabled": True, "rank": 16, "alpha": 32, "dropout": 0.05, "target_modules": None}


def _config(algorithm_keys: dict, lora: dict | None) -> dict:
    model = {"name": "some/7b", "gradient_checkpointing": True, "dtype": "bf16"}
    if lora is not None:
        model["lora"] = lora
    return {"model": model, **algorithm_keys}


DPO = {
    "loss": "dpo",
    "data": {"max_length": 1024},
    "train": {"batch_size": 2, "gradient_accumulation_steps": 8},
    "eval": {"num_samples": 0, "eval_batch_size": 4},
}
GRPO_KL = {
    "algorithm": "grpo",
    "loss": {"beta": 0.04},
    "rollout": {"max_new_tokens": 256, "prompts_per_step": 4, "num_rollouts": 8},
    "train": {"batch_size": 4, "gradient_accumulation_steps": 4},
}


def _estimate_7b(family: str, algorithm: str, algorithm_keys: dict, lora: dict | None):
    """The CUDA memory estimate of a Llama-2-7B run of ``algorithm`` (LoRA settings or None)."""
    config = TrainerConfig(family, _config(algorithm_keys, lora))
    return estimate_memory(family, algorithm, config, arch_from_config(LLAMA2_7B), device="cuda")


def _names(estimate) -> dict[str, float]:
    return {c.name: c.gb for c in estimate.components}


def test_adapter_parameters_hand_computed():
    llama = arch_from_config(LLAMA2_7B)
    plan = LoraPlan(rank=16, dropout=0.0, targets=None)
    # per block: q k v o 4·16·(4096+4096) + gate up 2·16·(4096+11008) + down 16·(11008+4096)
    per_block = 4 * 16 * 8192 + 2 * 16 * 15104 + 16 * 15104
    assert adapter_params(llama, plan) == 32 * per_block == 39_976_960
    assert adapter_params(llama, LoraPlan(16, 0.0, ("q_proj", "v_proj"))) == 32 * 2 * 16 * 8192
    gpt2 = arch_from_config(GPT2)
    # c_attn 768→2304, c_proj 768→768 and 3072→768, c_fc 768→3072, rank 8
    per_block = 8 * ((768 + 2304) + (768 + 768) + (3072 + 768) + (768 + 3072))
    assert adapter_params(gpt2, LoraPlan(8, 0.0, None)) == 12 * per_block


def test_lora_plan_reads_the_config_and_full_fine_tuning_has_none():
    def view(data: dict) -> TrainerConfig:
        return TrainerConfig("direct_alignment", data)

    assert lora_plan(view({"model": {"name": "tiny"}})) is None
    assert lora_plan(view({"model": {"lora": {**LORA, "enabled": False}}})) is None
    plan = lora_plan(view({"model": {"lora": {**LORA, "target_modules": "all-linear"}}}))
    assert plan == LoraPlan(rank=16, dropout=0.05, targets=("all-linear",))


def test_dpo_with_lora_trains_the_adapters_only_and_loads_no_reference_copy():
    full = _estimate_7b("direct_alignment", "dpo", DPO, None)
    lora = _estimate_7b("direct_alignment", "dpo", DPO, LORA)
    parts = _names(lora)
    assert lora.trainable_params == 39_976_960 and full.trainable_params == full.param_count
    assert parts["policy base weights (frozen)"] == pytest.approx(
        full.param_count * 2 / GIB, abs=1e-3
    )
    assert parts["policy LoRA optimizer (AdamW)"] == pytest.approx(39_976_960 * 8 / GIB, abs=1e-3)
    assert "reference weights (frozen)" not in parts and "policy gradients" not in parts
    assert "reference weights (frozen)" in _names(full)
    # the reference pass runs on the policy itself: its weights are held in that phase
    assert lora.phases["reference"] >= parts["policy base weights (frozen)"]
    # bf16 7B: full = 2 + 2 + 4 bytes a parameter of states; LoRA ~2
    assert lora.total_gb < 0.5 * full.total_gb


def test_grpo_kl_with_lora_has_no_reference_copy_unless_ref_name_is_another_model():
    arch = arch_from_config(LLAMA2_7B)
    lora = _estimate_7b("policy_gradients", "grpo", GRPO_KL, LORA)
    assert "reference weights (frozen)" not in _names(lora)
    assert any("adapters off" in n for n in lora.notes)
    other = _config(GRPO_KL, LORA)
    other["model"]["ref_name"] = "another/7b"
    copy = estimate_memory(
        "policy_gradients", "grpo", TrainerConfig("policy_gradients", other), arch, device="cuda"
    )
    assert "reference weights (frozen)" in _names(copy)


def test_ppo_with_lora_trains_two_adapter_sets():
    est = _estimate_7b("policy_gradients", "ppo", {**GRPO_KL, "algorithm": "ppo"}, LORA)
    assert est.trainable_params == 2 * 39_976_960
    assert "value model base weights (frozen)" in _names(est)


def test_the_lab_accepts_lora_overrides_and_refuses_them_without_enabled():
    resolved = resolve_config("dpo", as_overrides(["model.name=tiny", "model.lora.enabled=true"]))
    assert resolved.data["model"]["lora"]["enabled"] is True
    assert resolved.data["model"]["lora"]["rank"] == 16
    with pytest.raises(LabError, match="model.lora.enabled=true"):
        resolve_config("dpo", as_overrides(["model.name=tiny", "model.lora.rank=8"]))
    with pytest.raises(LabError, match="model.lora.rnak"):
        resolve_config("dpo", as_overrides(["model.name=tiny", "model.lora.rnak=8"]))


def test_the_lab_refuses_target_modules_the_model_does_not_have():
    from rlhf_lab.planning.validation import check_config

    good = resolve_config("dpo", as_overrides(["model.name=tiny", "model.lora.enabled=true"]))
    check_config("direct_alignment", good.config)
    bad = resolve_config(
        "dpo",
        as_overrides(
            [
                "model.name=tiny",
                "model.lora.enabled=true",
                "model.lora.target_modules=[q_proj,attn]",
            ]
        ),
    )
    with pytest.raises(LabError, match="attn is not a linear layer of model tiny") as err:
        check_config("direct_alignment", bad.config)
    assert "gate_proj" in err.value.message
