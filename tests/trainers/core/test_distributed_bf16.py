"""The bf16 path every CUDA run takes, run on CPU: one optimizer step of every family with
``model.dtype=bf16`` (bf16 weights as ``dtype=auto`` picks on a bf16 GPU; the trainers use no
autocast: log-softmax and the reward head stay float32 by construction) next to the same step in
fp32.

Tolerances: where both runs see the same data (SFT, DPO, the reward model) the step's loss is
within 2 % of fp32 and the gradient norm within 10 % (bf16 keeps 8 bits of mantissa: about
0.4 % per rounding, and a 4-layer forward and backward accumulate a few). Policy gradients and
rejection sampling sample their data from the model, and bf16 logits sample other completions,
so there the step must be finite and of the same order as fp32 (loss within 1.0 absolute,
gradient norm within a factor 3).

The 2-process FSDP2 step with the CUDA ``MixedPrecisionPolicy`` runs in
``test_distributed.py`` (gloo allows it)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
from conftest import trainer_argv

from tests._helpers.paths import ROOT
from tests._helpers.quick_runs import RS_ON_GSM8K_FIXTURE
from trainers.core.rundir import read_jsonl

ONE_STEP = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "model.device=cpu",
    "train.max_steps=1",
    "logging.log_every=1",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]
# The families that train on a fixed data set (no sampling): a dozen short examples, one batch of 4.
FIXED_DATA_STEP = [
    "data.max_samples=12",
    "data.eval_size=2",
    "data.max_length=96",
    "train.batch_size=4",
    "train.gradient_accumulation_steps=1",
    "eval.eval_every=0",
]
FAMILIES = {
    "sft": (
        "trainers.sft.train",
        "trainers/sft/configs/sft.yaml",
        [
            *ONE_STEP,
            "model.chat_template_source=null",
            "data.dataset=builtin:reasoning-sft",
            *FIXED_DATA_STEP,
            "eval.sample_every=0",
        ],
        True,
    ),
    "dpo": (
        "trainers.direct_alignment.train",
        "trainers/direct_alignment/configs/dpo.yaml",
        [
            *ONE_STEP,
            "data.dataset=builtin:reasoning-preferences",
            *FIXED_DATA_STEP,
            "eval.sample_every=0",
        ],
        True,
    ),
    "reward_model": (
        "trainers.reward_models.train",
        "trainers/reward_models/configs/preference_rm.yaml",
        [
            *ONE_STEP,
            "data.dataset=builtin:reasoning-preferences",
            *FIXED_DATA_STEP,
        ],
        True,
    ),
    "grpo": (
        "trainers.policy_gradients.train",
        "trainers/policy_gradients/configs/grpo.yaml",
        [
            *ONE_STEP,
            "data.size=8",
            "data.eval_size=2",
            "rollout.prompts_per_step=2",
            "rollout.num_rollouts=4",
            "rollout.max_new_tokens=8",
            "train.batch_size=4",
            "train.gradient_accumulation_steps=1",
            "eval.eval_every=0",
        ],
        False,
    ),
    "rejection_sampling": (
        "trainers.rejection_sampling.train",
        "trainers/rejection_sampling/configs/top_per_prompt.yaml",
        [*RS_ON_GSM8K_FIXTURE, "sft.batch_size=4", "eval.eval_batch_size=8"],
        False,
    ),
}


def first_train_row(family: str, run_dir: Path, dtype: str) -> dict:
    module, config, overrides, _ = FAMILIES[family]
    argv = trainer_argv(ROOT / config, run_dir, [*overrides, f"model.dtype={dtype}"])
    assert importlib.import_module(module).main(argv) == 0
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "train"]
    if not rows:  # rejection sampling: the SFT stage logs its own metrics
        rows = [r for r in read_jsonl(next(run_dir.rglob("sft*/metrics.jsonl"))) if "loss" in r]
    return rows[0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_bf16_step_is_finite_and_close_to_fp32(tmp_path, family):
    same_data = FAMILIES[family][3]
    fp32 = first_train_row(family, tmp_path / "fp32", "fp32")
    bf16 = first_train_row(family, tmp_path / "bf16", "bf16")
    for key in ("loss", "grad_norm"):
        assert math.isfinite(bf16[key]) and math.isfinite(fp32[key]), (key, bf16, fp32)
    if same_data:
        assert bf16["loss"] == pytest.approx(fp32["loss"], rel=2e-2)
        assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.1)
    else:
        assert abs(bf16["loss"] - fp32["loss"]) < 1.0
        assert fp32["grad_norm"] / 3 <= bf16["grad_norm"] <= fp32["grad_norm"] * 3
