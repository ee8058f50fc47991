"""Overrides for short trainer runs on the tiny preset that several test files start from; each
file adds what its tests need (a data set, sizes, saving)."""

from tests._helpers.paths import FIXTURES

# The tiny preset in fp32 on the CPU, plain optimizer steps (no gradient checkpointing, no
# accumulation) for one epoch, every step logged, no periodic checkpoint: the runs that
# tests/trainers/core/test_distributed.py and bench/distributed_step.py compare across 1 and 2
# processes; each adds the family's data, sizes and saving.
TINY_FP32_ON_CPU = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "model.device=cpu",
    "model.dtype=fp32",
    "train.gradient_accumulation_steps=1",
    "train.num_epochs=1",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]

# SFT: batches of 4 at lr 1e-3 for one epoch, evaluated and sampled every 2 steps, no saving.
SFT_ON_TINY = [
    "model.name=tiny",
    "model.chat_template_source=null",
    "model.gradient_checkpointing=false",
    "train.batch_size=4",
    "train.learning_rate=1.0e-3",
    "train.num_epochs=1",
    "eval.eval_every=2",
    "eval.sample_every=2",
    "eval.num_samples=2",
    "eval.sample_max_new_tokens=8",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]

# DPO: the built-in reasoning preferences (40 pairs, 8 held out) at lr 1e-3, evaluated every 2
# steps without samples, no saving.
DPO_ON_TINY = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.dataset=builtin:reasoning-preferences",
    "data.max_samples=40",
    "data.eval_size=8",
    "data.max_length=128",
    "train.batch_size=4",
    "train.learning_rate=1.0e-3",
    "eval.eval_every=2",
    "eval.sample_every=0",
    "eval.num_samples=0",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]

# Policy gradients: one step of 2 prompts x 2 rollouts of 8 tokens, no held-out evaluation.
PG_ONE_STEP_ON_TINY = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.size=8",
    "data.eval_size=2",
    "rollout.prompts_per_step=2",
    "rollout.num_rollouts=2",
    "rollout.max_new_tokens=8",
    "train.batch_size=4",
    "train.max_steps=1",
    "eval.eval_every=0",
    "eval.max_new_tokens=4",
]

# Policy gradients: two steps of 2 prompts at lr 1e-3 on 32 prompts (4 held out), no saving;
# each file sets the rollouts and the evaluation.
PG_TWO_STEPS_ON_TINY = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.size=32",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "train.batch_size=4",
    "train.gradient_accumulation_steps=1",
    "train.learning_rate=1.0e-3",
    "train.max_steps=2",
    "eval.max_new_tokens=8",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]

# Rejection sampling on the two-prompt GSM8K fixture: 2 completions of 8 tokens a prompt, the
# top 5 kept, one SFT epoch; each file sets the dtype and the SFT batch.
RS_ON_GSM8K_FIXTURE = [
    "model.name=tiny",
    f"data.dataset={FIXTURES / 'gsm8k.jsonl'}",
    "data.max_train_samples=null",
    "data.max_test_samples=2",
    "generation.num_completions_per_prompt=2",
    "generation.max_new_tokens=8",
    "generation.rollout_batch_size=6",
    "top_k=5",
    "sft.gradient_accumulation_steps=1",
    "sft.num_epochs=1",
    "sft.max_seq_length=160",
    "eval.eval_max_new_tokens=8",
    "eval.num_samples=1",
]

# The learning checks on preferences (DPO, the preference reward model): 480 built-in reasoning
# pairs, 96 held out, in batches of 16.
PREFERENCES_TO_LEARN = [
    "data.dataset=builtin:reasoning-preferences",
    "data.max_samples=480",
    "data.eval_size=96",
    "data.max_length=160",
    "train.batch_size=16",
]
