"""2 processes vs 1 process: optimizer-step time of SFT, DPO and GRPO at the same global batch.

    uv run python bench/distributed_step.py [--steps 6] [--global-batch 8] [--families sft,dpo,grpo]

GRPO's step is a whole rollout step (generate, score, update) of 4 prompts × 4 rollouts of 16
new tokens, one micro-batch per rank (``--global-batch`` does not apply to it).

Runs each trainer for real on the tiny model on CPU: once as one process (micro-batch = the
global batch) and once under ``torchrun --nproc-per-node 2`` (gloo, FSDP2, micro-batch = half),
then reads ``timing/step_s`` from each run's metrics.jsonl (the first step, which pays for
warm-up, is left out) and prints the median step time and the scaling efficiency
``t1 / (2 · t2)`` (1.0 = perfect; above 0.5 = the second process helps at all).

On a 2-core machine shared with other work the efficiency is poor and noisy: two processes
share the same two cores, and for a model this small the all-gathers and reduce-scatters cost
more than half a step saves. The numbers are meaningful on a machine with a core (or a GPU)
per process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests._helpers.quick_runs import TINY_FP32_ON_CPU

ROOT = Path(__file__).resolve().parents[1]

FAMILIES = {
    "sft": (
        "trainers.sft.train",
        ROOT / "trainers/sft/configs/sft.yaml",
        [
            "model.chat_template_source=null",
            "data.dataset=builtin:reasoning-sft",
            "data.max_length=128",
            "eval.eval_every=0",
            "eval.sample_every=0",
        ],
    ),
    "dpo": (
        "trainers.direct_alignment.train",
        ROOT / "trainers/direct_alignment/configs/dpo.yaml",
        [
            "data.dataset=builtin:reasoning-preferences",
            "data.max_length=128",
            "eval.eval_every=0",
            "eval.sample_every=0",
        ],
    ),
    "grpo": (
        "trainers.policy_gradients.train",
        ROOT / "trainers/policy_gradients/configs/grpo.yaml",
        [
            "data.size=64",
            "data.eval_size=2",
            "rollout.prompts_per_step=4",
            "rollout.num_rollouts=4",
            "rollout.max_new_tokens=16",
            "eval.eval_every=0",
            "eval.sample_every=0",
        ],
    ),
}
COMMON = [*TINY_FP32_ON_CPU, "checkpoint.save_final_model=false"]


def command(family: str, run_dir: Path, procs: int, global_batch: int, steps: int) -> list[str]:
    module, config, extra = FAMILIES[family]
    sets = [*COMMON, *extra, f"train.max_steps={steps}"]
    if family == "grpo":  # 16 sequences a rollout step: one micro-batch per rank
        sets.append(f"train.batch_size={16 // procs}")
    else:
        sets += [
            f"data.max_samples={global_batch * steps + 16}",
            "data.eval_size=8",
            f"train.batch_size={global_batch // procs}",
        ]
    args = ["--config", str(config), "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    if procs == 1:
        return [sys.executable, "-m", module, *args]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs)]
    return [*launcher, "--standalone", "-m", module, *args]


def step_times(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["timing/step_s"] for r in rows if r.get("phase") == "train"][1:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--families", default="sft,dpo,grpo")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    print(f"global batch {args.global_batch}, {args.steps} steps (first left out), CPU, tiny")
    print(f"{'family':8} {'1 proc s/step':>14} {'2 procs s/step':>15} {'efficiency':>11}")
    with tempfile.TemporaryDirectory(prefix="dist-bench-") as tmp:
        for family in args.families.split(","):
            medians = {}
            for procs in (1, 2):
                run_dir = Path(tmp) / f"{family}-{procs}"
                cmd = command(family, run_dir, procs, args.global_batch, args.steps)
                done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
                    return done.returncode
                medians[procs] = statistics.median(step_times(run_dir))
            eff = medians[1] / (2 * medians[2])
            print(f"{family:8} {medians[1]:14.3f} {medians[2]:15.3f} {eff:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
