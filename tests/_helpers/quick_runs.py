"""Overrides for short trainer runs on the tiny preset that several test files start from; each
file adds its data set and sizes."""

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
