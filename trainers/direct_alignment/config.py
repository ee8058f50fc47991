"""Direct-alignment config (torch-free; the lab validates with it)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainers.core.config import (
    CheckpointSection,
    LoggingSection,
    ModelSection,
    OptimSection,
    StrictModel,
)

LossName = Literal["dpo", "cdpo", "dpo_norm", "ipo", "simpo", "orpo", "kto", "apo_zero", "apo_down"]
LOSS_NAMES: tuple[str, ...] = LossName.__args__

# β when the config leaves it unset (ALGORITHMS.md). For ORPO β plays the paper's λ.
DEFAULT_BETA: dict[str, float] = {
    "dpo": 0.1,
    "cdpo": 0.1,
    "dpo_norm": 2.0,
    "ipo": 0.1,
    "simpo": 2.0,
    "orpo": 0.1,
    "kto": 0.1,
    "apo_zero": 0.1,
    "apo_down": 0.1,
}
# Losses whose objective needs no reference model (nothing is loaded or cached for them).
REFERENCE_FREE: frozenset[str] = frozenset({"simpo", "orpo"})

BUILTIN_DATASET = "builtin:reasoning-preferences"  # data.py re-exports it


class DataSection(StrictModel):
    dataset: str = Field(
        default="argilla/ultrafeedback-binarized-preferences-cleaned",
        description=f"hub id, local file/folder, or {BUILTIN_DATASET} (offline)",
    )
    split: str = "train"
    format: Literal["auto", "ultrafeedback", "hh", "plain", "unpaired"] = "auto"
    max_samples: int | None = Field(default=1000, ge=2, description="shuffled, then the first N")
    eval_size: int = Field(default=100, ge=0, description="examples held out for eval/ metrics")
    max_length: int = Field(default=512, ge=8, description="prompt + response tokens")
    max_prompt_length: int | None = Field(default=None, ge=1)
    builtin_tasks: list[str] | None = Field(
        default=None, description=f"reasoning-gym tasks for {BUILTIN_DATASET} (None: defaults)"
    )


class EvalSection(StrictModel):
    eval_every: int = Field(default=25, ge=0, description="optimizer steps; 0 = only at the end")
    eval_batch_size: int = Field(default=8, ge=1)
    sample_every: int = Field(default=25, ge=0, description="optimizer steps; 0 = only at the end")
    num_samples: int = Field(default=3, ge=0, description="held-out prompts sampled per event")
    sample_max_new_tokens: int = Field(default=128, ge=1)
    sample_do_sample: bool = True
    sample_temperature: float = Field(default=0.7, gt=0)
    sample_top_p: float = Field(default=0.9, gt=0, le=1)


class DirectAlignmentConfig(StrictModel):
    loss: LossName = "dpo"
    beta: float | None = Field(default=None, gt=0, description="None: the loss's default")
    gamma: float = Field(default=0.5, description="SimPO target margin as the γ/β ratio")
    label_smoothing: float = Field(default=0.1, ge=0, lt=0.5, description="cDPO ε")
    lambda_d: float = Field(default=1.0, gt=0, description="KTO desirable weight")
    lambda_u: float = Field(default=1.0, gt=0, description="KTO undesirable weight")
    ipo_sum: bool = Field(default=False, description="IPO on summed log-probs (the book's form)")
    model: ModelSection = ModelSection(name="allenai/OLMo-2-0425-1B-SFT")
    data: DataSection = DataSection()
    train: OptimSection = OptimSection()
    eval: EvalSection = EvalSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    seed: int = 42

    @model_validator(mode="before")
    @classmethod
    def _default_beta(cls, data):
        """Fill β from the loss so config.yaml always records the value used."""
        if isinstance(data, dict) and data.get("beta") is None:
            loss = data.get("loss", "dpo")
            if loss in DEFAULT_BETA:
                data = {**data, "beta": DEFAULT_BETA[loss]}
        return data

    @model_validator(mode="after")
    def _check_lengths(self):
        """A prompt budget that leaves no room for the response is refused here, so the lab
        rejects it before a run starts (the trainer used to find it only after loading)."""
        d = self.data
        if d.max_prompt_length is not None and d.max_prompt_length >= d.max_length:
            raise ValueError(
                f"data.max_prompt_length ({d.max_prompt_length}) must be smaller than "
                f"data.max_length ({d.max_length}), which holds prompt and response; raise "
                "data.max_length or lower data.max_prompt_length"
            )
        return self

    @property
    def needs_reference(self) -> bool:
        return self.loss not in REFERENCE_FREE
