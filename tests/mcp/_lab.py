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


def kill_runs(root: Path) -> None:
    """SIGKILL the process group of every run under ``root`` whose trainer is still alive."""
    from rlhf_lab.runs import _process_alive

    for path in root.glob("experiments/*/runs/*/run.json"):
        record = json.loads(path.read_text())
        if record.get("pgid") and _process_alive(record.get("pid"), record.get("create_time")):
            os.killpg(record["pgid"], signal.SIGKILL)
