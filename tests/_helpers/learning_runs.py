"""A learning check's run: a trainer whose verifier is the vowel-share stand-in
(tests/stand_in_rewards.py), on one torch thread (a 1M-parameter model gains nothing from
OpenMP workers); the start of a run from a trained checkpoint on chain sums."""

from __future__ import annotations

from pathlib import Path

from conftest import torch_threads, trainer_argv
from stand_in_rewards import vowel_share_rewards

from trainers.core.rundir import read_jsonl


def metrics_of_a_vowel_share_run(main, config: Path, run_dir: Path, overrides: list[str]) -> list:
    """Run the trainer ``main`` (one with ``with_options(verifier=...)``) on ``config`` with
    ``overrides`` into ``run_dir``, scored by the stand-in; it must succeed. Its metrics rows."""
    with torch_threads(1):
        argv = trainer_argv(config, run_dir, overrides)
        assert main.with_options(verifier=vowel_share_rewards)(argv) == 0
    return read_jsonl(run_dir / "metrics.jsonl")


def chain_sum_task(max_terms: int) -> dict[str, int]:
    """The reasoning-gym ``chain_sum`` settings of the learning checks: sums of 2 to
    ``max_terms`` one-digit terms."""
    return {"min_terms": 2, "max_terms": max_terms, "min_digits": 1, "max_digits": 1}


def from_checkpoint_on_chain_sums(policy: Path, max_terms: int) -> list[str]:
    """The overrides that start a learning run from the checkpoint ``policy`` (a warm start),
    without gradient checkpointing, on the prompts of :func:`chain_sum_task`."""
    task = ", ".join(f"{key}: {value}" for key, value in chain_sum_task(max_terms).items())
    return [
        f"model.name={policy}",
        "model.gradient_checkpointing=false",
        f"data.specs=[{{name: chain_sum, config: {{{task}}}}}]",
    ]


def stand_in_learning_settings(steps: int) -> list[str]:
    """The overrides the policy-gradient learning checks on the stand-in share: ``steps``
    steps of one micro-batch, a greedy held-out evaluation at the start and the end, no format
    reward (the stand-in scores vowels only), nothing saved, seed 42."""
    return [
        "train.gradient_accumulation_steps=1",
        f"train.max_steps={steps}",
        f"eval.eval_every={steps}",
        "eval.sample_every=0",
        "reward.format_weight=0",
        "checkpoint.save_every=null",
        "checkpoint.save_final_model=false",
        "seed=42",
    ]


def trained_model(main, config: Path, run_dir: Path, overrides: list[str]) -> Path:
    """Run the trainer ``main`` on ``config`` with ``overrides`` into ``run_dir``; it must
    succeed. The final_model folder it saved (a warm start, a reward model for a later run)."""
    assert main(trainer_argv(config, run_dir, overrides)) == 0
    return run_dir / "final_model"
