"""Distillation config (torch-free; the lab validates with it).

One optimizer step = ``train.batch_size × train.gradient_accumulation_steps`` prompts, each
with ``rollout.num_samples`` completions sampled from the student; ``train.max_steps`` and
``train.num_epochs`` count optimizer steps and passes over ``data.size`` prompts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainers.core.config import (
    CheckpointSection,
    LoggingSection,
    ModelSection,
    OptimSection,
    PromptDataSection,
    StrictModel,
)
from trainers.distillation.spec import FAMILY as DISTILL_FAMILY

Algorithm = DISTILL_FAMILY.algorithm_literal
DivergenceName = Literal["reverse_kl", "forward_kl", "jsd"]


class TeacherSection(StrictModel):
    name: str = Field(
        description="the teacher: a preset, local folder, hub id, a run's final_model/, or "
        "run:<id> (the lab resolves it); same tokenizer and vocabulary as the student"
    )


class LossSection(StrictModel):
    divergence: DivergenceName = Field(
        default="reverse_kl", description="per-token divergence to the teacher"
    )
    beta: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="JSD β (divergence jsd): 0 = forward KL, 1 = reverse KL (GKD's convention)",
    )
    temperature: float = Field(default=1.0, gt=0, description="softmax temperature of both")


class RolloutSection(StrictModel):
    num_samples: int = Field(default=1, ge=1, description="student samples per prompt")
    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, gt=0, description="student sampling temperature")
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0, description="0 = off")


class DistillOptimSection(OptimSection):
    """``batch_size`` counts prompts per micro-batch (each with ``rollout.num_samples`` rows)."""

    learning_rate: float = Field(default=1e-5, gt=0)
    batch_size: int = Field(default=8, ge=1, description="prompts per micro-batch")
    schedule: Literal["linear", "constant"] = "constant"
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)


class EvalSection(StrictModel):
    eval_every: int = Field(default=25, ge=0, description="optimizer steps; 0 = only at the end")
    eval_batch_size: int = Field(default=32, ge=1, description="prompts per generate call")
    max_new_tokens: int | None = Field(
        default=None, ge=1, description="None: rollout.max_new_tokens"
    )
    num_samples: int = Field(
        default=2, ge=0, description="greedy held-out completions written per evaluation"
    )


class DistillationConfig(StrictModel):
    algorithm: Algorithm = "distill"
    model: ModelSection = ModelSection(name="Qwen/Qwen3-0.6B")
    teacher: TeacherSection = TeacherSection(name="Qwen/Qwen3-1.7B")
    data: PromptDataSection = PromptDataSection()
    rollout: RolloutSection = RolloutSection()
    loss: LossSection = LossSection()
    train: DistillOptimSection = DistillOptimSection()
    eval: EvalSection = EvalSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection(save_final_model=True)
    seed: int = 42

    @model_validator(mode="after")
    def _check(self):
        d = self.data
        d.check_source()
        per_step = self.train.batch_size * self.train.gradient_accumulation_steps
        if d.size < per_step:
            raise ValueError(
                f"data.size ({d.size}) must be at least train.batch_size × "
                f"train.gradient_accumulation_steps ({per_step} prompts per step)"
            )
        d.check_specs_unique()
        return self
