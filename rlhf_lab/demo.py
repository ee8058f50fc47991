"""The main job: a short, offline DPO sanity run on the built-in `tiny` model and the built-in
reasoning-gym preference set. Runs the trainer as a separate process (as every lab launch will)
and prints where its run directory is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rlhf_lab.paths import campaign_name, experiments_dir, new_run_id, repo_root

# Shrink the book's DPO recipe to a CPU sanity run: tiny model, built-in data, a few hundred
# pairs, one epoch. Everything else (β, schedule, clipping) stays as shipped.
DPO_SANITY_OVERRIDES = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.dataset=builtin:reasoning-preferences",
    "data.max_samples=640",
    "data.eval_size=128",
    "data.max_length=160",
    "train.num_epochs=1",
    "train.batch_size=16",
    "train.gradient_accumulation_steps=1",
    "train.learning_rate=3.0e-4",
    "eval.eval_every=10",
    "eval.sample_every=20",
    "eval.num_samples=2",
    "eval.sample_max_new_tokens=48",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]


def sanity_command(config: Path, run_dir: Path, overrides: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "trainers.direct_alignment.train"]
    cmd += ["--config", str(config), "--run-dir", str(run_dir)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def run_demo(campaign_slug: str = "dpo-sanity") -> Path:
    config = repo_root() / "trainers" / "direct_alignment" / "configs" / "dpo.yaml"
    run_dir = experiments_dir() / campaign_name(campaign_slug) / "runs" / new_run_id("dpo")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = sanity_command(config, run_dir, DPO_SANITY_OVERRIDES)
    print("$ " + " ".join(cmd), flush=True)
    code = subprocess.call(cmd, cwd=repo_root(), env={**_env(), "PYTHONUNBUFFERED": "1"})
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        ev = summary.get("final_eval", {})
        print(
            f"outcome: {summary.get('outcome')}  eval/accuracy {ev.get('eval/accuracy')}  "
            f"eval/margins {ev.get('eval/margins')}"
        )
    print(f"run directory: {run_dir}")
    if code != 0:
        raise SystemExit(code)
    return run_dir


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "disabled")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env
