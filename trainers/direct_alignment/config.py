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
from trainers.direct_alignment.spec import BUILTIN_DATASET as DA_BUILTIN
from trainers.direct_alignment.spec import FAMILY as DA_FAMILY

LOSS_NAMES: tuple[str, ...] = DA_FAMILY.algorithm_names
LossName = Literal[LOSS_NAMES]  # type: ignore[valid-type]  # the spec's names

# Derived from the specs (trainers/direct_alignment/spec.py); kept for callers that import it.
DEFAULT_BETA: dict[str, float] = {
    a.name: a.default_beta for a in DA_FAMILY.algorithms if a.default_beta is not None
}
# Derived from the specs; kept for callers that import it.
REFERENCE_FREE: frozenset[str] = frozenset(
    a.name for a in DA_FAMILY.algorithms if not a.needs_reference
)

BUILTIN_DATASET = DA_BUILTIN  # data.py re-exports it


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
            loss = data.get("loss", DA_FAMILY.default_algorithm)
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
        """Whether the loss's spec needs a frozen reference model."""
        return DA_FAMILY.algorithm(self.loss).needs_reference
