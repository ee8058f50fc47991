"""The memory package's parts: the family registry and each building block on a small case
computed by hand (sizes in bytes, divided by GIB)."""

from __future__ import annotations

import dataclasses

import pytest

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.planning.catalog import FAMILIES
from rlhf_lab.planning.memory import (
    FAMILY_ESTIMATORS,
    GIB,
    EstimateBuilder,
    EstimateInputs,
    MemoryComponent,
    ModelArch,
    blocks,
    dtype_bytes,
    estimate_memory,
    kv_cache_bytes_per_token,
    layer_activation_bytes,
)
from rlhf_lab.planning.trainer_config import TrainerConfig, config_leaf

# h=4, q = 2 heads × 2 = 4, kv = 1 head × 2 = 2, gated MLP of width 8, 2 layers, vocab 10
SHAPE = {"vocab_size": 10, "hidden_size": 4, "num_layers": 2, "intermediate_size": 8}
HEADS = {"num_heads": 2, "num_kv_heads": 1, "head_dim": 2}
ARCH = ModelArch(model_type="llama", tie_word_embeddings=True, **SHAPE, **HEADS)
# EstimateInputs for 1000 parameters without an architecture: bf16, no checkpointing, eager off
BASE = EstimateInputs(
    TrainerConfig("sft", {}), None, None, None, 1000, 2, False, False, False, False, 128
)


def _inputs(config: dict, algorithm: str | None, **changes) -> EstimateInputs:
    view = TrainerConfig("sft", config)  # the estimators read the view, never the family
    return dataclasses.replace(BASE, config=view, algorithm=algorithm, **changes)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_every_family_has_an_estimator():
    assert set(FAMILY_ESTIMATORS) == set(FAMILIES)
    assert all(callable(fn) for fn in FAMILY_ESTIMATORS.values())


def test_estimate_memory_dispatches_on_the_registry(monkeypatch):
    seen = []

    def fake(inputs: EstimateInputs, bld: EstimateBuilder) -> int:
        seen.append(inputs.algorithm)
        bld.add("marker", 1.0, ["train"])
        return 7

    monkeypatch.setitem(FAMILY_ESTIMATORS, "sft", fake)
    est = estimate_memory("sft", "sft", TrainerConfig("sft", {}), 1000, device="cpu")
    assert seen == ["sft"]
    assert est.trainable_params == 7
    assert [c.name for c in est.components][:2] == ["marker", "process baseline"]
    # train phase: 1.0 + 0.8 baseline, plus 10 % slack
    assert est.total_gb == pytest.approx(1.8 * 1.1, abs=1e-3)


def test_estimators_return_their_trained_parameters():
    """With only a parameter count each estimator adds weights and states and says how many
    parameters it trains (PPO trains a value model beside the policy; a frozen RM backbone
    trains nothing counted)."""
    cases = [
        ("direct_alignment", "dpo", {}, 1000),
        ("sft", "sft", {}, 1000),
        ("policy_gradients", "grpo", {}, 1000),
        ("policy_gradients", "ppo", {}, 2000),
        ("reward_models", "preference", {}, 1000),
        ("reward_models", "preference", {"freeze_backbone": True}, 0),
        ("rejection_sampling", "top_k_overall", {}, 1000),
    ]
    for family, algorithm, config, trained in cases:
        bld = EstimateBuilder()
        assert FAMILY_ESTIMATORS[family](_inputs(config, algorithm), bld) == trained, family
        assert bld.components, family


def test_reference_model_follows_the_algorithm():
    def names(family: str, algorithm: str, config: dict, **changes) -> list[str]:
        bld = EstimateBuilder()
        FAMILY_ESTIMATORS[family](_inputs(config, algorithm, **changes), bld)
        return [c.name for c in bld.components]

    assert "reference weights (frozen)" in names("direct_alignment", "dpo", {})
    assert "reference weights (frozen)" not in names("direct_alignment", "simpo", {})
    assert "reference weights (frozen)" not in names(
        "direct_alignment", "dpo", {}, reference_cached=True
    )
    kl = {"loss": {"beta": 0.04}}
    assert "reference weights (frozen)" in names("policy_gradients", "grpo", kl)
    assert "reference weights (frozen)" not in names("policy_gradients", "dapo", kl)
    assert "reference weights (frozen)" not in names("policy_gradients", "grpo", {})
    assert "value model weights" in names("policy_gradients", "ppo", {})


def test_unknown_family_and_bad_model_are_typed_errors():
    with pytest.raises(InvalidArgument) as err:
        estimate_memory("nope", None, TrainerConfig("nope", {}), 1000)
    assert [s.operation for s in err.value.next_steps] == ["list_recipes"]
    with pytest.raises(InvalidArgument):
        estimate_memory("sft", "sft", TrainerConfig("sft", {}), True)
    with pytest.raises(InvalidArgument) as err:
        estimate_memory("sft", "sft", TrainerConfig("sft", {}), None)  # no model.name in the config
    assert err.value.next_steps


def test_config_leaf_finds_a_key_at_any_depth():
    config = {"a": {"b": {"max_new_tokens": 64}}, "top": 3, "empty": None}
    assert config_leaf(config, "max_new_tokens") == 64
    assert config_leaf(config, "top") == 3
    assert config_leaf(config, "empty", 5) == 5
    assert config_leaf(config, "missing", 9) == 9


# ---------------------------------------------------------------------------------------------
# Per-token sizes
# ---------------------------------------------------------------------------------------------


def test_dtype_bytes():
    assert dtype_bytes("fp32") == 4
    assert dtype_bytes("bf16") == 2
    assert dtype_bytes("fp16") == 2


def test_layer_activation_bytes_by_hand():
    # 4h + 2q + 2kv + 4i = 16 + 8 + 4 + 32 = 60 values × 2 B, plus the RMSNorms' fp32 copies
    # in 16 bits: 2 more bytes for each of the 2h = 8 normed values
    assert layer_activation_bytes(ARCH, 2, seq=5, eager=False) == 120 + 16
    # eager keeps 2 · heads · seq = 20 more values per token
    assert layer_activation_bytes(ARCH, 2, seq=5, eager=True) == 160 + 16
    plain = ARCH.model_copy(update={"mlp_gated": False})
    assert layer_activation_bytes(plain, 4, seq=5, eager=False) == 4 * (16 + 8 + 4 + 16)


def test_qk_norms_and_fp32_norm_copies_by_hand():
    """Found on an H200: a Qwen3-shaped model in bf16 kept ~1.6x the activations estimated
    without these two terms (its per-head q/k norms, and the fp32 copy each RMSNorm makes)."""
    qwen3 = ARCH.model_copy(update={"qk_norm": "head"})
    # 60 values + the q/k norms' inputs and outputs 2 · (q + kv) = 12 → 72 values
    assert layer_activation_bytes(qwen3, 4, seq=5, eager=False) == 4 * 72  # fp32: no copies
    # bf16: 72 × 2 B + 2 B × (2h + q + kv = 8 + 6 normed values)
    assert layer_activation_bytes(qwen3, 2, seq=5, eager=False) == 144 + 28
    layer_norm = ARCH.model_copy(update={"norm": "layer"})  # not an fp32-upcasting RMSNorm
    assert layer_activation_bytes(layer_norm, 2, seq=5, eager=False) == 120


def test_kv_cache_bytes_per_token_by_hand():
    # keys and values × 2 layers × 1 kv head × head_dim 2 × 2 B
    assert kv_cache_bytes_per_token(ARCH, 2) == 16
    assert kv_cache_bytes_per_token(ARCH, 4) == 32


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def test_model_states_by_hand():
    assert blocks.weights_gb(GIB, 2) == 2.0
    assert blocks.master_weights_gb(GIB, 2) == 6.0  # 2 B + 4 B fp32 copy
    assert blocks.gradients_gb(GIB, 4) == 4.0
    assert blocks.optimizer_gb(GIB, 2, master_weights=False) == 4.0  # 2 moments × 2 B
    assert blocks.optimizer_gb(GIB, 2, master_weights=True) == 8.0  # 2 moments × 4 B


def test_activations_by_hand():
    # 3 × 5 tokens × (2 layers + 1 buffer layer) × 136 B
    gb, how = blocks.activations_gb(ARCH, 2, rows=3, seq=5, ckpt=False, eager=False)
    assert gb == 15 * 3 * 136 / GIB
    assert "3 layers" in how
    # checkpointed: 15 tokens × (L·h·b = 16 + 2 layers × 136)
    gb, how = blocks.activations_gb(ARCH, 2, rows=3, seq=5, ckpt=True, eager=False)
    assert gb == 15 * 288 / GIB
    assert how.startswith("checkpointed")
    assert blocks.forward_gb(ARCH, 2, rows=3, seq=5, eager=False) == 15 * 136 / GIB


def test_logit_positions_and_sizes_by_hand():
    assert blocks.packed_positions(3, 100) == 256  # one chunk
    assert blocks.packed_positions(2, 5) == 10
    assert blocks.per_row_positions(3, 1000) == 3 * 256
    assert blocks.per_row_positions(3, 7) == 21
    gb, _ = blocks.logits_gb(ARCH, 2, positions=10, grad=True)
    assert gb == 10 * 10 * (2 * 2 + 12) / GIB
    gb, _ = blocks.logits_gb(ARCH, 2, positions=10, grad=False)
    assert gb == 10 * 10 * (2 + 8) / GIB
    assert blocks.lm_head_grad_gb(ARCH, 4) == 10 * 4 * 4 / GIB


def test_kv_cache_by_hand():
    # 16 B per token × 3 seqs × 5 tokens + 3 seqs × vocab 10 × fp32 logits and probabilities
    gb, how = blocks.kv_cache_gb(ARCH, 2, sequences=3, length=5)
    assert gb == (16 * 15 + 3 * 10 * 8) / GIB
    assert "3 seqs × 5 tokens" in how


def test_gradients_beyond_activations_by_hand():
    extra, _ = blocks.gradients_beyond_activations(5.0, 3.0, 1.0, "g")
    assert extra == 2.0  # the gradients exceed what backward frees by 2
    extra, how = blocks.gradients_beyond_activations(5.0, 4.5, 1.0, "g")
    assert extra == 1.0  # the LM head's gradient is larger than the excess
    assert how.startswith("g = 5.000 GiB")


def test_phase_totals():
    comps = [
        MemoryComponent(name="a", gb=1.0, phases=["train"]),
        MemoryComponent(name="b", gb=2.0, phases=["generate", "train"]),
        MemoryComponent(name="c", gb=0.5, phases=["*"]),
    ]
    assert blocks.phase_totals(comps) == {"generate": 2.5, "train": 3.5}
    assert blocks.phase_totals(comps[2:]) == {"train": 0.5}


def _trained(
    bld: EstimateBuilder, params: int, arch: ModelArch | None, master_weights=False, **changes
) -> None:
    """``bld.trained`` on a 3 × 5 token micro-batch, bf16, no checkpointing, with ``changes``."""
    settings = {"logit_positions": 0, "accumulating": True, "resident": ["train"], **changes}
    shape = blocks.TrainingShape(rows=3, seq=5, **settings)
    bld.trained("m", params, arch, shape, blocks.Precision(2, False, False, master_weights))


def test_builder_trained_model_without_accumulation():
    """Weights and moments stay resident; the gradients add only the LM head's gradient when
    that is larger than what they exceed activations + logits by."""
    bld = EstimateBuilder()
    _trained(bld, 1000, ARCH, logit_positions=10, accumulating=False)
    got = {c.name: c.gb for c in bld.components}
    assert list(got) == [
        "m weights",
        "m gradients",
        "m optimizer (AdamW)",
        "m activations",
        "m logits (chunked log-probs)",
    ]
    assert got["m weights"] == round(2000 / GIB, 4)
    transient = 15 * 3 * 120 / GIB + 10 * 10 * 16 / GIB
    expected_grads = max(10 * 4 * 2 / GIB, 2000 / GIB - transient)
    assert got["m gradients"] == round(expected_grads, 4)


def test_builder_accumulating_keeps_all_gradients_and_frozen_weights():
    bld = EstimateBuilder()
    _trained(bld, GIB, None, master_weights=True)
    bld.frozen("ref", GIB, 2, ["reference"])
    got = {c.name: c.gb for c in bld.components}
    assert got == {
        "m weights": 6.0,
        "m gradients": 4.0,
        "m optimizer (AdamW)": 8.0,
        "ref weights (frozen)": 2.0,
    }
