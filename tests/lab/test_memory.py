"""Parameter counts from config.json (checked against hand-computed numbers and a real built
model) and the per-algorithm memory estimate."""

from __future__ import annotations

import json
import math

import pytest

from rlhf_lab.paths import LabError
from rlhf_lab.planning import memory
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.memory import (
    GIB,
    KNOWN_ARCHITECTURES,
    arch_from_config,
    count_parameters,
    estimate_memory,
    model_facts,
)
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig
from tests._helpers.model_configs import GPT2, LLAMA2_7B, QWEN25_05B

# Models the shipped recipes name: their facts from the lab's table
# (rlhf_lab/planning/memory/architecture.py), checked below against hand-computed counts.
QWEN3_06B = KNOWN_ARCHITECTURES["Qwen/Qwen3-0.6B"]
OLMO2_1B = KNOWN_ARCHITECTURES["allenai/OLMo-2-0425-1B"]


# ---------------------------------------------------------------------------------------------
# Parameter counts
# ---------------------------------------------------------------------------------------------


def test_qwen25_05b_tied_with_qkv_biases():
    pc = count_parameters(QWEN25_05B)
    # embed 151936·896; per layer: q 896·896+896, k and v 896·128+128 each, o 896·896,
    # MLP 3·896·4864, two RMSNorms 2·896; final norm 896; the head is tied
    per_layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert pc.per_layer == per_layer == 14_912_384
    assert pc.total == 151936 * 896 + 24 * per_layer + 896 == 494_032_768
    assert pc.lm_head == 0 and pc.embedding == 136_134_656


def test_llama2_7b_untied():
    pc = count_parameters(LLAMA2_7B)
    assert pc.total == 6_738_415_616
    assert pc.lm_head == pc.embedding == 32000 * 4096
    assert pc.attention == 32 * 4 * 4096 * 4096
    assert pc.mlp == 32 * 3 * 4096 * 11008


def test_gpt2_small():
    pc = count_parameters(GPT2)
    assert pc.total == 124_439_808
    assert pc.embedding == 50257 * 768 + 1024 * 768  # token + learned positions
    assert pc.lm_head == 0
    arch = pc.arch
    assert arch is not None and not arch.mlp_gated and arch.norm == "layer"
    assert arch.intermediate_size == 4 * 768


def test_qwen3_qk_norm_and_explicit_head_dim():
    pc = count_parameters(QWEN3_06B)
    # q 1024·2048, k and v 1024·1024, o 2048·1024, q_norm and k_norm 128 each
    attn = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128
    per_layer = attn + 3 * 1024 * 3072 + 2 * 1024
    assert pc.per_layer == per_layer
    assert pc.total == 151936 * 1024 + 28 * per_layer + 1024 == 596_049_920


def test_olmo2_full_qk_norm():
    pc = count_parameters(OLMO2_1B)
    per_layer = 4 * 2048 * 2048 + 2 * 2048 + 3 * 2048 * 8192 + 2 * 2048
    assert pc.total == 2 * 100352 * 2048 + 16 * per_layer + 2048 == 1_484_916_736


def test_head_dim_defaults_and_gqa():
    arch = arch_from_config({**LLAMA2_7B, "num_key_value_heads": 8})
    assert arch.head_dim == 128 and arch.num_kv_heads == 8
    full = count_parameters(LLAMA2_7B).attention
    gqa = count_parameters(arch).attention
    assert full - gqa == 32 * 2 * 4096 * (4096 - 1024)


def test_attention_and_mlp_biases():
    base = count_parameters(LLAMA2_7B)
    biased = count_parameters({**LLAMA2_7B, "attention_bias": True, "mlp_bias": True})
    # q, k, v, o biases (4·4096) and gate, up, down biases (2·11008 + 4096) per layer
    assert biased.total - base.total == 32 * (4 * 4096 + 2 * 11008 + 4096)


def test_unknown_llama_like_type_is_counted_with_a_note():
    arch = arch_from_config({**LLAMA2_7B, "model_type": "somethingnew"})
    assert arch.notes and count_parameters(arch).total == 6_738_415_616


def test_unsupported_architecture():
    with pytest.raises(LabError, match="unsupported architecture"):
        arch_from_config({"model_type": "t5", "d_model": 512, "vocab_size": 32128})


def test_tiny_preset_count_matches_the_built_model():
    """The one test that builds a model (torch): the spec-based count equals the real one."""
    from trainers.core.tiny import ensure_preset

    folder = ensure_preset("tiny")
    real = json.loads((folder / "build_info.json").read_text())["num_parameters"]
    from_spec = model_facts("tiny").params.total
    from_config_json = model_facts(str(folder)).params.total
    assert math.isclose(from_spec, real, rel_tol=1e-3)
    assert from_config_json == from_spec
    assert model_facts(str(folder)).kind == "local"

    from trainers.core.tiny import export_gguf

    gguf = export_gguf(folder, folder.parent / "tiny-test.gguf")
    try:
        facts = model_facts(str(gguf))
        assert facts.kind == "gguf" and facts.params.exact
        assert facts.params.total == real
        assert facts.params.arch is not None and facts.params.arch.num_layers == 4
    finally:
        gguf.unlink()


def test_small_preset_counted_without_building():
    facts = model_facts("small")
    assert facts.kind == "preset" and facts.loadable
    assert 25_000_000 < facts.params.total < 35_000_000


def test_hub_model_not_cached_and_unknown(monkeypatch, empty_hub_cache):
    with pytest.raises(LabError) as err:
        model_facts("someorg/unknown-model")
    assert "not in the local Hugging Face cache" in str(err.value)
    assert err.value.kind == "unavailable"
    steps = {(s.operation, tuple(s.args.items())) for s in err.value.next_steps}
    assert ("estimate_memory", (("model", "tiny"),)) in steps
    assert ("pull_model", (("name", "smollm2-135m-instruct"),)) in steps


def test_hub_model_known_facts_when_not_cached(monkeypatch, empty_hub_cache):
    facts = model_facts("Qwen/Qwen3-0.6B-Base")
    assert facts.kind == "hub" and not facts.loadable
    assert facts.params.total == 596_049_920
    assert facts.warnings and "not in the local Hugging Face cache" in facts.warnings[0]


def test_hub_model_config_from_the_local_cache(monkeypatch, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GPT2))
    cached = {"config.json": str(cfg)}
    with memory.hub_cache_lookup(lambda hub_id, filename: cached.get(filename)):
        facts = model_facts("openai-community/gpt2")
        assert facts.params.total == 124_439_808
        assert "local Hugging Face cache" in facts.source
        assert not facts.loadable  # config only, no weights
        cached["model.safetensors"] = str(tmp_path / "model.safetensors")
        assert model_facts("openai-community/gpt2").loadable


def test_bad_model_name():
    with pytest.raises(LabError):
        model_facts("./does/not/exist")


# ---------------------------------------------------------------------------------------------
# Memory estimates
# ---------------------------------------------------------------------------------------------


def _by_name(est) -> dict[str, float]:
    return {c.name: c.gb for c in est.components}


def _dpo_config(**changes) -> TrainerConfig:
    overrides = [f"{k}={v}" for k, v in changes.items()]
    return resolve_config("dpo", as_overrides(overrides)).config


def _dpo_estimate(arch, config: TrainerConfig | None = None, *, device: str = "cuda", **assume):
    """The DPO estimate on ``arch`` with ``config`` (the shipped one by default) on ``device``,
    under the given :class:`memory.Assumptions`."""
    config = _dpo_config() if config is None else config
    return estimate_memory(
        "direct_alignment", "dpo", config, arch, device=device, assume=memory.Assumptions(**assume)
    )


def test_trained_model_states_by_precision():
    p = 494_032_768
    arch = count_parameters(QWEN25_05B)
    gpu = _by_name(_dpo_estimate(arch))
    assert gpu["policy weights"] == pytest.approx(p * 2 / GIB, abs=1e-3)  # bf16 on a GPU
    assert gpu["policy gradients"] == pytest.approx(p * 2 / GIB, abs=1e-3)
    assert gpu["policy optimizer (AdamW)"] == pytest.approx(2 * p * 2 / GIB, abs=1e-3)
    cpu = _by_name(_dpo_estimate(arch, device="cpu"))
    assert cpu["policy weights"] == pytest.approx(p * 4 / GIB, abs=1e-3)  # fp32 on the CPU
    assert cpu["policy optimizer (AdamW)"] == pytest.approx(2 * p * 4 / GIB, abs=1e-3)
    assert "CUDA context" in gpu and "process baseline" in cpu

    mixed = _by_name(_dpo_estimate(arch, master_weights=True))
    states = mixed["policy weights"] + mixed["policy gradients"] + mixed["policy optimizer (AdamW)"]
    assert states == pytest.approx(p * 18 / GIB, abs=1e-3)  # 6 + 4 + 8 bytes per parameter


def test_reference_model_only_when_needed():
    arch = count_parameters(QWEN25_05B)
    dpo = _dpo_estimate(arch)
    names = _by_name(dpo)
    assert "reference weights (frozen)" in names
    # the reference pass runs before the policy is loaded: it has its own phase
    ref = next(c for c in dpo.components if c.name == "reference weights (frozen)")
    assert ref.phases == ["reference"]
    assert set(dpo.phases) >= {"train", "reference"}
    assert dpo.total_gb == max(dpo.phases.values())

    cached = _dpo_estimate(arch, reference_cached=True)
    assert "reference weights (frozen)" not in _by_name(cached)
    for loss in ("simpo", "orpo"):
        est = estimate_memory("direct_alignment", loss, _dpo_config(loss=loss), arch, device="cuda")
        assert not any("reference" in c.name for c in est.components)
        assert any("reference-free" in n for n in est.notes)


def test_gradient_checkpointing_and_batch_shape():
    arch = count_parameters(QWEN25_05B)

    def act(**kw) -> float:
        cfg = _dpo_config(**kw)
        return _by_name(_dpo_estimate(arch, cfg))["policy activations"]

    full = act(**{"model.gradient_checkpointing": "false"})
    ckpt = act(**{"model.gradient_checkpointing": "true"})
    assert ckpt < full / 5
    # (estimates are rounded to 4 decimals)
    assert act(**{"train.batch_size": 16}) == pytest.approx(
        2 * act(**{"train.batch_size": 8}), abs=2e-4
    )
    assert act(**{"data.max_length": 1024}) == pytest.approx(
        act(**{"data.max_length": 2048}) / 2, abs=2e-4
    )

    # the formula itself: without checkpointing, (L + 1) layers of b·(4h + 2q + 2kv + 4i), plus
    # in bf16 the RMSNorms' fp32 copies, 2 B for each of the 2h normed values
    cfg = _dpo_config(**{"model.gradient_checkpointing": "false", "train.batch_size": 1})
    h, q, kv, i = 896, 896, 128, 4864
    per_token = 25 * (2 * (4 * h + 2 * q + 2 * kv + 4 * i) + 2 * 2 * h)
    expected = 2 * 2048 * per_token / GIB  # chosen + rejected rows × max_length tokens
    got = _by_name(_dpo_estimate(arch, cfg))
    assert got["policy activations"] == pytest.approx(expected, abs=1e-3)


def test_kto_carries_a_third_sequence():
    arch = count_parameters(QWEN25_05B)
    dpo = _by_name(_dpo_estimate(arch))
    kto = _by_name(
        estimate_memory("direct_alignment", "kto", _dpo_config(loss="kto"), arch, device="cuda")
    )
    # (estimates are rounded to 4 decimals)
    assert kto["policy activations"] == pytest.approx(1.5 * dpo["policy activations"], abs=2e-4)


def test_logits_are_chunked():
    """Direct alignment packs the completion tokens of the micro-batch into one row before the
    LM head (trainers.core.logprobs.completion_logps): one 256-position chunk is alive."""
    arch = count_parameters(QWEN25_05B)
    cfg = _dpo_config(**{"train.batch_size": 2, "data.max_length": 4096})
    got = _by_name(_dpo_estimate(arch, cfg))
    # 256 positions × vocab × (2·2 + 12) bytes, independent of the 4 rows and the 4096 length
    expected = 256 * 151936 * 16 / GIB
    assert got["policy logits (chunked log-probs)"] == pytest.approx(expected, abs=1e-3)
    # fewer tokens than a chunk: 1 pair = 2 rows × 64 tokens = 128 positions
    cfg = _dpo_config(**{"train.batch_size": 1, "data.max_length": 64})
    got = _by_name(_dpo_estimate(arch, cfg))
    assert got["policy logits (chunked log-probs)"] == pytest.approx(
        128 * 151936 * 16 / GIB, abs=1e-4
    )


def test_policy_gradient_logits_are_chunked_per_row():
    """The policy-gradient trainer runs the LM head on (rows, completion) chunks of 256 positions
    along the sequence: every row's chunk is alive, prompts excluded."""
    pytest.importorskip("trainers.policy_gradients.config")
    arch = count_parameters(QWEN3_06B)

    def logits_gb(new_tokens: int) -> float:
        cfg = _pg_config("grpo", "train.batch_size=2", f"rollout.max_new_tokens={new_tokens}")
        est = estimate_memory("policy_gradients", "grpo", cfg, arch, device="cuda")
        return _by_name(est)["policy logits (chunked log-probs)"]

    assert logits_gb(512) == pytest.approx(2 * 256 * 151936 * 16 / GIB, abs=1e-4)
    assert logits_gb(64) == pytest.approx(2 * 64 * 151936 * 16 / GIB, abs=1e-4)


def test_policy_gradient_activations_count_each_distinct_prompt_once():
    """Without checkpointing, rows of a micro-batch that share a prompt forward it once: the
    activations hold min(rows, prompts_per_step) prompts and every row's completion. With
    checkpointing (no shared forward) every row holds its prompt."""
    pytest.importorskip("trainers.policy_gradients.config")
    arch = count_parameters(QWEN3_06B)

    def activations_gb(*overrides: str) -> float:
        cfg = _pg_config("grpo", "train.batch_size=8", "rollout.max_new_tokens=64", *overrides)
        est = estimate_memory("policy_gradients", "grpo", cfg, arch, device="cuda")
        return _by_name(est)["policy activations"]

    off = "model.gradient_checkpointing=false"
    one_prompt = activations_gb(off, "rollout.prompts_per_step=1")
    two_prompts = activations_gb(off, "rollout.prompts_per_step=2")
    many_prompts = activations_gb(off, "rollout.prompts_per_step=64")
    # 128-token prompts: tokens = 1·128 + 8·64, 2·128 + 8·64, 8·128 + 8·64
    assert two_prompts / one_prompt == pytest.approx((2 * 128 + 512) / (128 + 512), rel=1e-3)
    assert many_prompts / one_prompt == pytest.approx((8 * 128 + 512) / (128 + 512), rel=1e-3)
    on = activations_gb("model.gradient_checkpointing=true", "rollout.prompts_per_step=1")
    on_many = activations_gb("model.gradient_checkpointing=true", "rollout.prompts_per_step=64")
    assert on == pytest.approx(on_many)


def test_gradients_without_accumulation_fill_in_as_activations_are_freed():
    """One micro-batch per optimizer step: backward writes the gradients while it frees the
    activations, so only max(LM-head gradient, gradients - activations - logits) is added."""
    arch = count_parameters(QWEN25_05B)
    h, q, kv, i, layers, vocab = 896, 896, 128, 4864, 24, 151936
    grads = 494_032_768 * 2  # bf16
    head = vocab * h * 2
    per_token = (layers + 1) * (2 * (4 * h + 2 * q + 2 * kv + 4 * i) + 2 * 2 * h)  # + fp32 norms

    def grads_gb(**changes) -> float:
        base = {"model.gradient_checkpointing": "false", "train.gradient_accumulation_steps": 1}
        cfg = _dpo_config(**{**base, **changes})
        est = _dpo_estimate(arch, cfg)
        return _by_name(est)["policy gradients"]

    # 1 pair × 64 tokens: activations 128 tokens, logits 128 positions; the gradients exceed them
    small = grads - 128 * per_token - 128 * vocab * 16
    assert small > head
    got = grads_gb(**{"train.batch_size": 1, "data.max_length": 64})
    assert got == pytest.approx(small / GIB, abs=1e-4)
    # 8 pairs × 512 tokens: the activations dwarf the gradients; the LM head's gradient remains
    got = grads_gb(**{"train.batch_size": 8, "data.max_length": 512})
    assert got == pytest.approx(head / GIB, abs=1e-4)
    # with accumulation (the recipe's 8 micro-batches) the gradients count in full
    got = grads_gb(**{"train.batch_size": 1, "data.max_length": 64})
    accumulating = grads_gb(
        **{"train.batch_size": 1, "data.max_length": 64, "train.gradient_accumulation_steps": 8}
    )
    assert accumulating == pytest.approx(grads / GIB, abs=1e-4) and accumulating > got


def _pg_config(recipe: str, *overrides: str) -> TrainerConfig:
    return resolve_config(recipe, as_overrides(list(overrides))).config


def test_policy_gradient_kv_cache_reference_and_value_model():
    pytest.importorskip("trainers.policy_gradients.config")
    arch = count_parameters(QWEN3_06B)
    grpo = estimate_memory("policy_gradients", "grpo", _pg_config("grpo"), arch, device="cuda")
    comps = _by_name(grpo)
    assert "reference weights (frozen)" not in comps  # beta 0
    # 32 sequences (4 prompts × 8) × (128 prompt + 512 new) tokens
    kv = 2 * 28 * 8 * 128 * 32 * 640 * 2 + 32 * 151936 * 8
    assert comps["generation KV cache"] == pytest.approx(kv / GIB, abs=1e-3)
    assert grpo.trainable_params == grpo.param_count

    with_kl = estimate_memory(
        "policy_gradients", "grpo", _pg_config("grpo", "loss.beta=0.04"), arch, device="cuda"
    )
    ref = next(c for c in with_kl.components if c.name == "reference weights (frozen)")
    assert set(ref.phases) == {"train", "generate"}
    assert with_kl.total_gb > grpo.total_gb

    ppo = estimate_memory("policy_gradients", "ppo", _pg_config("ppo"), arch, device="cuda")
    assert ppo.trainable_params == 2 * ppo.param_count
    assert "value model optimizer (AdamW)" in _by_name(ppo)


def test_reward_model_body_and_frozen_backbone():
    pytest.importorskip("trainers.reward_models.config")
    arch = count_parameters(LLAMA2_7B)  # untied: the LM head is not part of a reward model
    cfg = resolve_config("preference_rm").config
    est = estimate_memory("reward_models", "preference", cfg, arch, device="cuda")
    assert est.trainable_params == 6_738_415_616 - 32000 * 4096
    assert not any("logits" in c.name for c in est.components)
    frozen = resolve_config("preference_rm", as_overrides(["freeze_backbone=true"])).config
    est = estimate_memory("reward_models", "preference", frozen, arch, device="cuda")
    assert est.trainable_params == 0
    assert not any("optimizer" in c.name for c in est.components)


def test_shrunk_tiny_run_is_small_and_param_count_only_is_accepted():
    shrunk = shrink_config("dpo", model="tiny")
    est = estimate_memory("direct_alignment", "dpo", shrunk.trainer_config, device="cpu")
    assert est.model == "tiny" and est.param_count == model_facts("tiny").params.total
    assert 0.8 < est.total_gb < 2.0  # dominated by the process baseline
    only_count = estimate_memory(
        "direct_alignment", "dpo", shrunk.trainer_config, 1_000_000, device="cpu"
    )
    assert not any("activations" in c.name for c in only_count.components)
    assert any("only a parameter count" in n for n in only_count.notes)


def test_full_recipe_estimates_are_in_the_expected_range():
    """OLMo-2 1B DPO at batch 8 × 2048 with checkpointing: the book measured about 35 % of a
    120 GB machine for this cell including the OS; our GPU estimate should land in 15-45 GiB."""
    arch = arch_from_config(OLMO2_1B)
    est = estimate_memory("direct_alignment", "dpo", resolve_config("dpo").config, arch)
    assert est.device == "cuda" and est.dtype == "bf16"
    assert 15 < est.total_gb < 45
    assert est.peak_phase == "train"


def test_unknown_family():
    with pytest.raises(LabError, match="unknown family"):
        estimate_memory("nope", None, TrainerConfig("nope", {}), 1000)
