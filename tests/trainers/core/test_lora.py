"""LoRA adapters (trainers/core/lora.py) in every family: the adapter-off reference equals a
frozen copy of the base, resume is exact, DPO with adapters learns, each family trains one step
with adapters and leaves a merged final model that loads as a plain one, and bad target
modules fail before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_complete_run_dir, torch_threads, trainer_argv
from stop_resume import assert_same_history

from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.quick_runs import DPO_ON_TINY, PG_ONE_STEP_ON_TINY
from trainers.core import lora
from trainers.core.config import ConfigError, LoraSection, ModelSection, load_config
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.rundir import read_jsonl
from trainers.direct_alignment import pairs as da_pairs
from trainers.direct_alignment import train as da_train
from trainers.direct_alignment.config import DirectAlignmentConfig

LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8"]

DPO_QUICK = [*DPO_ON_TINY, "train.gradient_accumulation_steps=1"]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    with torch_threads(1):
        yield


def config_path(family: str, name: str) -> Path:
    return configs_of(family) / f"{name}.yaml"


def adapted_tiny(seed: int = 0, **lora_settings) -> torch.nn.Module:
    """``tiny`` with rank-4 adapters whose B is random (not the zero start), so the adapted
    model differs from its base."""
    settings = {"enabled": True, "rank": 4, "alpha": 8.0, "dropout": 0.0, **lora_settings}
    torch.manual_seed(seed)  # peft draws A from the global generator: the same adapter in any order
    model = lora.add_adapters(
        load_causal_lm("tiny", device="cpu", dtype="fp32"), LoraSection(**settings)
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


# ---------------------------------------------------------------------------------------------
# Configuration and targets
# ---------------------------------------------------------------------------------------------


def test_lora_settings_without_enabled_are_refused_and_the_default_stays_full_fine_tuning():
    assert ModelSection(name="tiny").lora.enabled is False
    with pytest.raises(ValueError, match="model.lora.rank given but model.lora.enabled is false"):
        ModelSection(name="tiny", lora={"rank": 8})
    dumped = ModelSection(name="tiny").model_dump(mode="json")  # a run's config.yaml reloads
    assert ModelSection.model_validate(dumped).lora.enabled is False


def test_default_targets_per_architecture():
    on = LoraSection(enabled=True)
    assert lora.resolve_targets(on, "qwen2") == list(lora.DEFAULT_TARGETS["llama"])
    assert lora.resolve_targets(on, "gpt2") == ["c_attn", "c_proj", "c_fc"]
    assert lora.resolve_targets(on, "some_new_arch") == "all-linear"
    mine = LoraSection(enabled=True, target_modules=["q_proj"])
    assert lora.resolve_targets(mine, "gpt2") == ["q_proj"]
    assert lora.missing_targets(["q_proj", "qkv"], ["k_proj", "q_proj"]) == ["qkv"]


def test_tiny_gets_adapters_on_attention_and_mlp_and_only_they_train():
    model = adapted_tiny()
    trainable = lora.trainable_names(model)
    assert trainable and all("lora_" in n for n in trainable)
    adapted = {n.split(".")[-4] for n in trainable}  # ...q_proj.lora_A.default.weight
    assert adapted == set(lora.DEFAULT_TARGETS["qwen2"])
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert any("embed_tokens" in n for n in frozen)


def test_bad_target_modules_fail_before_the_run_folder_is_written(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [*DPO_QUICK, *LORA, "model.lora.target_modules=[q_proj,attn_qkv]"]
    argv = trainer_argv(config_path("direct_alignment", "dpo"), run_dir, overrides)
    assert da_train.main(argv) == 2
    err = capsys.readouterr().err
    assert "attn_qkv is not a linear layer of tiny" in err, err
    assert "q_proj" in err and "gate_proj" in err  # the layers that exist are named
    assert not run_dir.exists()


# ---------------------------------------------------------------------------------------------
# The reference is the base with the adapters off
# ---------------------------------------------------------------------------------------------


def test_dpo_step_with_adapter_off_reference_equals_one_with_a_frozen_base_copy():
    cfg = load_config(
        config_path("direct_alignment", "dpo"), DirectAlignmentConfig, [*DPO_QUICK, *LORA]
    )
    tokenizer = load_tokenizer("tiny")
    pad = tokenizer.pad_token_id
    train_ex, _, _, _ = da_pairs.prepare_examples(cfg, tokenizer)
    examples, ids = train_ex[:4], [0, 1, 2, 3]
    device = torch.device("cpu")

    policy = adapted_tiny(seed=1)
    base_copy = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    with lora.reference_view(policy) as ref:
        assert ref is policy
        off = da_pairs.compute_reference_logps(ref, examples, pad, device, 4, with_kl=False)
    on = da_pairs.compute_reference_logps(policy, examples, pad, device, 4, with_kl=False)
    copy = da_pairs.compute_reference_logps(base_copy, examples, pad, device, 4, with_kl=False)
    assert not torch.allclose(on["chosen"], copy["chosen"], atol=1e-3)  # the adapter matters
    torch.testing.assert_close(off["chosen"], copy["chosen"], rtol=0, atol=1e-5)
    torch.testing.assert_close(off["rejected"], copy["rejected"], rtol=0, atol=1e-5)

    def step(ref_logps) -> tuple[float, dict[str, torch.Tensor]]:
        policy.train()
        policy.zero_grad(set_to_none=True)
        loss, _, _ = da_pairs.micro_batch_loss(cfg, policy, examples, ids, ref_logps, pad, device)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
        return float(loss.detach()), grads

    loss_off, grads_off = step(off)
    loss_copy, grads_copy = step(copy)
    assert loss_off == pytest.approx(loss_copy, abs=1e-6)
    assert loss_off != pytest.approx(0.6931, abs=1e-3)  # the reference differs from the policy
    assert grads_off.keys() == grads_copy.keys() and grads_off
    for name in grads_off:
        torch.testing.assert_close(grads_off[name], grads_copy[name], rtol=1e-4, atol=1e-7)


def test_policy_gradient_reference_view_scores_the_base():
    """The KL terms' reference (rollout.prepare_update) through the same view: per-token
    log-probs of the adapter-off policy equal the base copy's."""
    from trainers.policy_gradients.token_passes import completion_token_stats

    policy = adapted_tiny(seed=2).eval()
    base = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    with torch.no_grad(), lora.reference_view(policy) as ref:
        off = completion_token_stats(ref, ids, attn, 4)[0]
    with torch.no_grad():
        on = completion_token_stats(policy, ids, attn, 4)[0]
        want = completion_token_stats(base, ids, attn, 4)[0]
    torch.testing.assert_close(off, want, rtol=0, atol=1e-5)
    assert not torch.allclose(on, want, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Final model: adapter folder + merged plain model
# ---------------------------------------------------------------------------------------------


def test_merged_final_model_loads_as_a_plain_model_with_base_plus_adapter_logits(tmp_path):
    from peft import PeftModel

    model = adapted_tiny(seed=3).eval()
    tokenizer = load_tokenizer("tiny")
    ids = torch.randint(3, 500, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    lora.save_final(model, tokenizer, tmp_path / "final_model")

    plain = load_causal_lm(str(tmp_path / "final_model"), device="cpu", dtype="fp32")
    assert not lora.has_adapters(plain)
    assert not (tmp_path / "final_model" / "adapter_config.json").exists()
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)

    adapter = tmp_path / lora.ADAPTER_DIR
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").stat().st_size < 200_000  # tiny: ~100 kB
    base = load_causal_lm("tiny", device="cpu", dtype="fp32", trainable=False)
    reloaded = PeftModel.from_pretrained(base, str(adapter)).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Training runs
# ---------------------------------------------------------------------------------------------


def test_lora_dpo_resume_equals_an_uninterrupted_run_and_checkpoints_hold_the_adapter(
    tmp_path, sigterm_at
):
    common = [*DPO_QUICK, *LORA, "train.max_steps=4", "checkpoint.save_final_model=true"]
    argv = lambda d, resume=False: trainer_argv(  # noqa: E731
        config_path("direct_alignment", "dpo"), d, common, resume
    )
    straight, half = tmp_path / "straight", tmp_path / "half"
    assert da_train.main(argv(straight)) == 0

    sigterm_at("step_end:2")  # a real SIGTERM at the end of step 2
    assert da_train.main(argv(half)) == 143
    checkpoint = torch.load(
        next((half / "checkpoints").glob("step-*")) / "model.pt", weights_only=True
    )
    assert checkpoint and all("lora_" in name for name in checkpoint)  # the adapter only
    sigterm_at(None)
    assert da_train.main(argv(half, resume=True)) == 0

    assert_same_history(
        straight, half, ("loss", "accuracy", "grad_norm", "eval/loss", "eval/margins")
    )
    for run_dir in (straight, half):
        assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
        assert (run_dir / "final_model" / "config.json").is_file()


@pytest.mark.slow
def test_dpo_with_lora_on_tiny_learns(tmp_path):
    """Held-out preference accuracy clearly above chance with adapters only (rank 8)."""
    overrides = [
        *DPO_QUICK,
        "model.lora.enabled=true",
        "model.lora.rank=8",
        "model.lora.alpha=16",
        "data.max_samples=240",
        "data.eval_size=64",
        "train.batch_size=16",
        "train.learning_rate=2.0e-3",
        "train.max_steps=10",
        "eval.eval_every=10",
        "checkpoint.save_final_model=false",
    ]
    argv = trainer_argv(config_path("direct_alignment", "dpo"), tmp_path / "run", overrides)
    assert da_train.main(argv) == 0
    summary = assert_complete_run_dir(tmp_path / "run")
    final = summary["final_eval"]
    assert final["eval/accuracy"] >= 0.70, final
    assert final["eval/margins"] > 0.05, final


def _assert_lora_run(run_dir: Path) -> dict:
    summary = assert_complete_run_dir(run_dir, check_rows=False)
    adapter = run_dir / lora.ADAPTER_DIR
    assert (adapter / "adapter_config.json").is_file(), list(run_dir.iterdir())
    plain = load_causal_lm(str(run_dir / "final_model"), device="cpu", dtype="fp32")
    assert not lora.has_adapters(plain)
    return summary


def test_sft_trains_one_step_with_lora(tmp_path):
    from trainers.sft import train as sft_train

    overrides = [
        "model.name=tiny",
        "model.chat_template_source=null",
        "model.gradient_checkpointing=true",  # adapters under activation checkpointing
        "data.dataset=builtin:reasoning-sft",
        "data.max_samples=16",
        "data.eval_size=4",
        "data.max_length=96",
        "train.batch_size=4",
        "train.max_steps=1",
        "eval.sample_every=0",
        "eval.num_samples=0",
        *LORA,
    ]
    run_dir = tmp_path / "run"
    assert sft_train.main(trainer_argv(config_path("sft", "sft"), run_dir, overrides)) == 0
    _assert_lora_run(run_dir)


def test_reward_model_trains_one_step_with_lora_and_its_head(tmp_path):
    from trainers.core.reward_model import HEAD_FILE, load_reward_model
    from trainers.reward_models import train as rm_train

    overrides = [
        "model.name=tiny",
        f"data.dataset={FIXTURES / 'ultrafeedback_cleaned.jsonl'}",
        "data.max_samples=null",
        "data.eval_size=2",
        "train.batch_size=2",
        "train.max_steps=1",
        "eval.eval_every=0",
        "eval.num_samples=0",
        "checkpoint.save_every=1",
        *LORA,
    ]
    run_dir = tmp_path / "run"
    argv = trainer_argv(config_path("reward_models", "preference_rm"), run_dir, overrides)
    assert rm_train.main(argv) == 0
    _assert_lora_run(run_dir)
    saved = torch.load(next((run_dir / "checkpoints").glob("step-*")) / "model.pt")
    assert {"head.weight"} < set(saved) and all(
        "lora_" in k for k in saved if k != "head.weight"
    )  # adapters and the head: the head trains in full
    assert (run_dir / lora.ADAPTER_DIR / lora.HEAD_FILE).is_file()
    assert (run_dir / "final_model" / HEAD_FILE).is_file()
    model, _ = load_reward_model(run_dir / "final_model", device="cpu")
    assert not lora.has_adapters(model)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_policy_gradients_train_one_step_with_lora(tmp_path, algorithm):
    """GRPO with its KL term (the reference is the adapter-off policy: no reference load) and
    PPO (its value model gets adapters of its own and a fully trained head)."""
    from trainers.policy_gradients import train as pg_train

    loads = []
    real_load = pg_train.load_causal_lm

    def counting_load(name, **kwargs):
        loads.append(kwargs.get("trainable"))
        return real_load(name, **kwargs)

    overrides = [
        *PG_ONE_STEP_ON_TINY,
        "loss.beta=0.05",
        "eval.num_samples=0",
        "checkpoint.save_every=1",
        *LORA,
    ]
    run_dir = tmp_path / "run"
    mp = pytest.MonkeyPatch()
    mp.setattr(pg_train, "load_causal_lm", counting_load)
    real_reference = pg_train.load_reference

    def counting_reference(*args, **kwargs):
        loads.append(False)  # a frozen reference copy
        return real_reference(*args, **kwargs)

    mp.setattr(pg_train, "load_reference", counting_reference)
    try:
        argv = trainer_argv(config_path("policy_gradients", algorithm), run_dir, overrides)
        assert pg_train.main(argv) == 0
    finally:
        mp.undo()
    assert loads == [True]  # the policy only: no frozen reference copy
    _assert_lora_run(run_dir)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert any("kl_ref" in r for r in rows)
    if algorithm == "ppo":
        state = torch.load(
            next((run_dir / "checkpoints").glob("step-*")) / "state.pt", weights_only=False
        )
        value = state["extra"]["value_model"]
        assert {"head.weight", "head.bias"} < set(value)
        assert all("lora_" in k for k in value if not k.startswith("head."))


def test_rejection_sampling_passes_lora_to_its_sft_stage(tmp_path):
    from trainers.rejection_sampling import sft_stage
    from trainers.rejection_sampling.config import RejectionSamplingConfig

    cfg = load_config(
        config_path("rejection_sampling", "top_per_prompt"),
        RejectionSamplingConfig,
        ["model.name=tiny", *LORA],
    )
    sft = sft_stage.sft_config(cfg, tmp_path / "selection.jsonl")
    assert sft.model.lora == cfg.model.lora and sft.model.lora.rank == 4


def test_freeze_backbone_and_lora_together_are_refused():
    from trainers.reward_models.config import RewardModelConfig

    with pytest.raises(ConfigError, match="choose one"):
        load_config(
            config_path("reward_models", "preference_rm"),
            RewardModelConfig,
            ["model.name=tiny", "freeze_backbone=true", *LORA],
        )
