"""A learning check's run: a trainer whose verifier is the vowel-share stand-in
(tests/stand_in_rewards.py), on one torch thread (a 1M-parameter model gains nothing from
OpenMP workers)."""

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
