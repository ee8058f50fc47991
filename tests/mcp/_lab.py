"""What the MCP tests share beyond fixtures: a quick DPO run's overrides, the environment a
server subprocess needs, and stopping the trainers a test lab left running
(tests/lab/test_inspector_e2e.py starts its server with :func:`server_env` too)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

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


def server_env(root: Path) -> dict[str, str]:
    """What a server subprocess needs (a stdio client passes only HOME, PATH, ... plus what it
    is given): the lab root, offline switches, one math thread per trainer, and the test
    session's model cache."""
    env = {
        "RLHF_LAB_ROOT": str(root),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key in ("RLHF_LAB_CACHE", "HF_DATASETS_CACHE", "HF_HOME"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def kill_runs(root: Path) -> None:
    """SIGKILL the process group of every run under ``root`` whose trainer is still alive."""
    from rlhf_lab.runs import _process_alive

    for path in root.glob("experiments/*/runs/*/run.json"):
        record = json.loads(path.read_text())
        if record.get("pgid") and _process_alive(record.get("pid"), record.get("create_time")):
            os.killpg(record["pgid"], signal.SIGKILL)
