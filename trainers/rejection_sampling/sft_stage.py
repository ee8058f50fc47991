"""Stage 3c of rejection sampling: SFT on the selection with trainers.sft's own loop, in-process,
writing into the rejection-sampling run's folder (its train rows go to metrics.jsonl, its
checkpoints to checkpoints/, its model to final_model/). The one place a family runs another
family's code (declared in pyproject's import contract).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainers.core.config import ConfigError, validate_config
from trainers.core.harness import Tracker
from trainers.core.rundir import RunDir
from trainers.core.runfolder import SummaryFile
from trainers.rejection_sampling.config import RejectionSamplingConfig


def sft_config(cfg: RejectionSamplingConfig, selection_path: Path):
    """The trainers.sft config of the SFT stage (validated by SFTConfig)."""
    from trainers.sft.config import SFTConfig

    optim = cfg.sft.model_dump(exclude={"max_seq_length", "eval_size"})
    data = {
        "model": {
            "name": cfg.model.name,
            "device": cfg.model.device,
            "dtype": cfg.model.dtype,
            "attn_implementation": cfg.model.attn_implementation,
            "gradient_checkpointing": cfg.model.gradient_checkpointing,
            "lora": cfg.model.lora.model_dump(exclude_unset=True),
            "chat_template_source": None,
        },
        "data": {
            "dataset": str(selection_path),
            "split": "train",
            "max_samples": None,
            "eval_size": cfg.sft.eval_size,
            "max_length": cfg.sft.max_seq_length,
            "train_on": "final",
        },
        "train": optim,
        "eval": {
            "eval_every": 0,  # only at the end (and only if sft.eval_size > 0)
            "eval_batch_size": cfg.eval.eval_batch_size,
            "sample_every": 0,
            "num_samples": 0,  # the held-out exact-match evaluation writes the samples
        },
        "logging": cfg.logging.model_dump(),
        "checkpoint": {**cfg.checkpoint.model_dump(), "save_final_model": True},
        "seed": cfg.seed,
    }
    return validate_config(data, SFTConfig, source="rejection-sampling SFT stage")


class SilentTracker:
    """The tracker of ranks other than 0 under torchrun: rank 0 alone logs to W&B."""

    url = None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        return None

    def finish(self, exit_code: int = 0) -> None:  # noqa: ARG002
        return None


class StageTracker:
    """Hands the SFT stage's W&B logging to this run's tracker: one W&B run per RS run."""

    def __init__(self, parent: Tracker) -> None:
        self.parent = parent

    @property
    def url(self) -> str | None:
        return self.parent.url

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.parent.log(metrics, step)

    def finish(self, exit_code: int = 0) -> None:  # noqa: ARG002 - the RS run finishes it
        return None


def run_sft(
    cfg: RejectionSamplingConfig, run: RunDir, selection_path: Path, tracker: Tracker, resume: bool
) -> SummaryFile:
    """trainers.sft's training loop, in-process, writing into this run directory: its train
    rows go to metrics.jsonl, its checkpoints to checkpoints/, its model to final_model/."""
    from trainers.sft import train as sft_train

    scfg = sft_config(cfg, selection_path)
    try:
        sft_train.preflight(scfg)
    except ConfigError as err:
        raise ConfigError(f"SFT stage: {err}") from None
    return sft_train.train(scfg, run, resume, tracker=StageTracker(tracker))
