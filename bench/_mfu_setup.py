"""What bench/mfu.py measures on: the model (a preset, or a randomly initialised
Qwen3-0.6B-shaped model built into a temporary folder with a preset's tokenizer), synthetic
long-sequence data files for the GPU sizes, and the trainer overrides of each phase.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import ROOT

CONFIGS = {
    "sft": ROOT / "trainers" / "sft" / "configs" / "sft.yaml",
    "dpo": ROOT / "trainers" / "direct_alignment" / "configs" / "dpo.yaml",
    "rm": ROOT / "trainers" / "reward_models" / "configs" / "preference_rm.yaml",
    "grpo": ROOT / "trainers" / "policy_gradients" / "configs" / "grpo.yaml",
}
RECIPES = {"sft": "sft", "dpo": "dpo", "rm": "preference_rm", "grpo": "grpo"}
# A tokenizer carried to a machine without the presets (bench/gpu/README.md)
CARRIED_TOKENIZER = ROOT / ".whl" / "tokenizer"

# Qwen3-0.6B's architecture (Qwen/Qwen3-0.6B config.json), random weights
QWEN3_06B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
}


@dataclass
class Sizes:
    """Per-phase batch sizes and lengths."""

    sft_rows: int
    pairs: int  # DPO and RM pairs per step
    max_length: int | None  # None: the built-in data at 128 tokens
    grpo_prompts: int
    grpo_rollouts: int
    grpo_new_tokens: int
    grpo_micro_batch: int
    steps: int
    warmup: int
    extra: dict[str, Any] = field(default_factory=dict)


def sizes_for(shape: str, quick: bool) -> Sizes:
    if shape == "qwen3-0.6b":
        if quick:
            return Sizes(8, 8, 256, 2, 8, 64, 8, 2, 1)
        return Sizes(16, 16, 512, 4, 8, 256, 16, 4, 2)
    if quick:
        return Sizes(8, 4, None, 2, 4, 16, 8, 2, 1)
    return Sizes(16, 8, None, 2, 8, 32, 8, 4, 2)


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def tokenizer_source() -> Path:
    """A folder with a preset's tokenizer files: the local `small` preset, else the carried copy."""
    from trainers.core.tiny import ensure_preset, is_complete, preset_dir

    if CARRIED_TOKENIZER.is_dir():
        return CARRIED_TOKENIZER
    folder = preset_dir("small")
    return folder if is_complete(folder) else ensure_preset("small")


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Every file of a preset folder except the weights and configs of its model."""
    dst.mkdir(parents=True, exist_ok=True)
    skip = {"model.safetensors", "config.json", "generation_config.json", "build_info.json"}
    for item in src.iterdir():
        if item.is_file() and item.name not in skip:
            shutil.copy2(item, dst / item.name)


def build_qwen3(out_dir: Path, device: str) -> Path:
    """A Qwen3-0.6B-shaped causal LM with random weights (bf16 on disk) and a preset's
    tokenizer, in ``out_dir``; returns the folder (the trainers take it as ``model.name``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen3Config

    copy_tokenizer_files(tokenizer_source(), out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    pad = tokenizer.pad_token_id
    eos = tokenizer.eos_token_id
    config = Qwen3Config(
        **QWEN3_06B,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        pad_token_id=pad,
        eos_token_id=eos,
        bos_token_id=None,
    )
    with torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out_dir, safe_serialization=True)
    del model
    return out_dir


# ---------------------------------------------------------------------------------------------
# Synthetic long-sequence data (the built-in sets are ~115 tokens a row at most)
# ---------------------------------------------------------------------------------------------

WORDS = (
    "the model reads each step of the proof and checks that the answer follows from the "
    "numbers given in the question before it writes a short final line with the result "
    "alpha beta gamma delta seven eleven thirteen twenty forty ninety reverse spell count "
    "letters words order sort list first second third last value sum product difference"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def write_synthetic_data(folder: Path, rows: int, max_length: int, seed: int = 0) -> dict:
    """JSONL files for SFT (prompt/completion) and preference pairs (prompt/chosen/rejected)
    whose rows run past ``max_length`` tokens (they are cut to it): prompt ~1/5 of it."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    prompt_words, answer_words = max_length // 6, max_length
    sft, pairs = folder / "sft.jsonl", folder / "pairs.jsonl"
    with sft.open("w") as fs, pairs.open("w") as fp:
        for _ in range(rows):
            prompt = _text(rng, prompt_words)
            fs.write(json.dumps({"prompt": prompt, "completion": _text(rng, answer_words)}) + "\n")
            chosen, rejected = _text(rng, answer_words), _text(rng, answer_words)
            fp.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
    return {"sft": str(sft), "pairs": str(pairs)}


# ---------------------------------------------------------------------------------------------
# Trainer overrides
# ---------------------------------------------------------------------------------------------


def common_overrides(model: str, device: str, dtype: str, steps: int) -> list[str]:
    return [
        f"model.name={model}",
        f"model.device={device}",
        f"model.dtype={dtype}",
        "model.gradient_checkpointing=false",
        f"train.max_steps={steps}",
        "train.gradient_accumulation_steps=1",
        "logging.log_every=1",
        "checkpoint.save_every=null",
        "checkpoint.save_final_model=false",
        "seed=42",
    ]


def supervised_overrides(dataset: str, rows: int, steps: int, max_length: int) -> list[str]:
    return [
        f"data.dataset={dataset}",
        f"data.max_samples={rows * steps + 8}",
        "data.eval_size=0",
        f"data.max_length={max_length}",
        f"train.batch_size={rows}",
        "train.num_epochs=1",
        "eval.eval_every=0",
        "eval.num_samples=0",
    ]


def phase_overrides(
    phase: str, model: str, device: str, dtype: str, s: Sizes, data: dict | None
) -> list[str]:
    """``--set`` overrides of ``phase`` (sft, dpo, rm, grpo) for ``s.warmup + s.steps`` steps."""
    steps = s.warmup + s.steps
    base = common_overrides(model, device, dtype, steps)
    length = s.max_length or 128
    if phase == "sft":
        dataset = data["sft"] if data else "builtin:reasoning-sft"
        return [*base, *supervised_overrides(dataset, s.sft_rows, steps, length)]
    if phase in ("dpo", "rm"):
        dataset = data["pairs"] if data else "builtin:reasoning-preferences"
        extra = ["eval.sample_every=0"] if phase == "dpo" else []
        return [*base, *supervised_overrides(dataset, s.pairs, steps, length), *extra]
    if phase == "grpo":
        rows = s.grpo_prompts * s.grpo_rollouts
        micro = min(s.grpo_micro_batch, rows)
        return [
            *base[:5],
            f"train.max_steps={steps}",
            f"train.gradient_accumulation_steps={max(1, rows // micro)}",
            *base[6:],
            f"data.size={s.grpo_prompts * steps + 8}",
            "data.eval_size=4",
            f"rollout.prompts_per_step={s.grpo_prompts}",
            f"rollout.num_rollouts={s.grpo_rollouts}",
            f"rollout.max_new_tokens={s.grpo_new_tokens}",
            f"train.batch_size={micro}",
            "loss.beta=0.04",  # a reference pass in the prepare phase
            "eval.eval_every=0",
            "eval.sample_every=0",
            "eval.num_samples=0",
        ]
    raise ValueError(f"unknown phase {phase!r}")
