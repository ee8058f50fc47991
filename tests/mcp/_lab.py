"""What the MCP tests share beyond fixtures: a quick DPO run's overrides. (The environment a
server subprocess needs is tests/_helpers/server_env.py; stopping the trainers a test lab left
running is tests/_lab_processes.kill_live_runs.)"""

from __future__ import annotations

# a DPO run on `tiny` that ends in seconds: 4 steps, evaluated at 2 and 4, no final model kept
QUICK = [
    "data.max_samples=64",
    "data.eval_size=16",
    "train.batch_size=8",
    "train.max_steps=4",
    "eval.eval_every=2",
    "eval.sample_every=0",
    "checkpoint.save_final_model=false",
]
