"""Overrides for short trainer runs on the tiny preset that several test files start from; each
file adds what its tests need (a data set, sizes, saving)."""

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
