"""Rejection-sampling config (torch-free; the lab validates with it).

Defaults follow the reference book's chapter-9 code (book-code-inventory.md §4): Qwen3-1.7B
policy, the first 1000 GSM8K train prompts × 8 completions (temperature 0.8, top_p 0.95,
top_k 20, 512 new tokens), SFT with constant lr 5e-6 for 2 epochs at batch 2 × 4, greedy exact
match on the first 200 GSM8K test prompts. Two differences, both recorded in the README: the
default scorer is the GSM8K verifier (the book scored with nvidia/AceMath-7B-RM, a sequence
classifier our reward-model loader does not read; pass a reward-model run's ``final_model/`` to
score with a trained reward model), and the SFT optimizer is AdamW with weight decay 0 (= Adam).

Field names follow the book where the lab looks them up (``rollout_batch_size``,
``score_batch_size``, ``max_seq_length``, ``eval_batch_size``, ``eval_max_new_tokens``,
top-level ``top_k``).
"""

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
from trainers.rejection_sampling.spec import FAMILY as RS_FAMILY

Strategy = RS_FAMILY.algorithm_literal

MATCHED_CONTROL: dict[str, str] = {
    a.name: a.matched_control for a in RS_FAMILY.algorithms if a.matched_control
}
"""Each strategy and its partner with the same selection size (reward-selected <-> random);
derived from the specs (trainers/rejection_sampling/spec.py)."""

VERIFIER = "verifier"
GSM8K = "openai/gsm8k"
BUILTIN_PREFIX = "builtin:"
"""``builtin:<task>[,<task>...]``: prompts generated offline from reasoning-gym tasks."""

GSM8K_SYSTEM_PROMPT = "Please reason step by step, and check your final answer within \\boxed{}."
"""The book's system prompt for GSM8K."""


class ScorerSection(StrictModel):
    name: str = Field(
        default=VERIFIER,
        description="'verifier' (GSM8K final-number match, or reasoning-gym's score for builtin "
        "tasks) or a reward-model folder (a trainers.reward_models run's final_model/)",
    )
    score_batch_size: int = Field(default=2, ge=1, description="sequences per reward-model pass")
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = "auto"

    @property
    def is_verifier(self) -> bool:
        return self.name == VERIFIER


class DataSection(StrictModel):
    dataset: str = Field(
        default=GSM8K,
        description="openai/gsm8k (hub), a local .jsonl/.json/.parquet/.csv file with the GSM8K "
        "schema (question, answer ending in '#### <number>'), or builtin:<task>[,<task>] "
        "(reasoning-gym, offline)",
    )
    subset: str | None = Field(default="main", description="hub dataset configuration")
    train_split: str = "train"
    test_split: str = "test"
    test_dataset: str | None = Field(
        default=None,
        description="a separate local file for the held-out prompts; None: the hub dataset's "
        "test_split, the last max_test_samples rows of a local file, or fresh builtin questions",
    )
    max_train_samples: int | None = Field(
        default=1000, ge=1, description="the first N training prompts (None: all)"
    )
    max_test_samples: int | None = Field(
        default=200, ge=0, description="the first N held-out prompts (0: no evaluation)"
    )
    system_prompt: str | None = Field(
        default=None,
        description="None: the book's \\boxed{} prompt for GSM8K data, the <think>/<answer> "
        "prompt for builtin tasks",
    )
    builtin_task_configs: dict[str, dict] = Field(
        default_factory=dict,
        description="per-task reasoning-gym settings merged over trainers.core.tasks.TASK_CONFIGS",
    )

    @property
    def is_builtin(self) -> bool:
        return self.dataset.startswith(BUILTIN_PREFIX)

    @property
    def builtin_tasks(self) -> list[str]:
        spec = self.dataset[len(BUILTIN_PREFIX) :] if self.is_builtin else ""
        return [t.strip() for t in spec.split(",") if t.strip()]


class GenerationSection(StrictModel):
    num_completions_per_prompt: int = Field(default=8, ge=1, description="N")
    temperature: float = Field(default=0.8, gt=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=20, ge=0, description="sampling top-k (0: off)")
    min_p: float = Field(default=0.0, ge=0, lt=1)
    max_new_tokens: int = Field(default=512, ge=1)
    rollout_batch_size: int = Field(
        default=8, ge=1, description="prompts per generate call (each with N completions)"
    )


class SFTStageSection(OptimSection):
    """The SFT stage on the selection (passed to trainers.sft as its ``train`` section)."""

    learning_rate: float = Field(default=5e-6, gt=0)
    num_epochs: int = Field(default=2, ge=1)
    batch_size: int = Field(default=2, ge=1, description="micro-batch size (examples)")
    gradient_accumulation_steps: int = Field(default=4, ge=1)
    schedule: Literal["linear", "constant"] = "constant"
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    max_seq_length: int = Field(default=1024, ge=8, description="prompt + completion tokens")
    eval_size: int = Field(
        default=0, ge=0, description="selected examples held out for SFT's eval/loss (0: none)"
    )


class EvalSection(StrictModel):
    eval_max_new_tokens: int = Field(default=512, ge=1)
    eval_batch_size: int = Field(default=8, ge=1, description="prompts per greedy generate call")
    baseline: bool = Field(
        default=True, description="also evaluate the policy before SFT (logged at step 0)"
    )
    num_samples: int = Field(
        default=5, ge=0, description="predictions per evaluation written to samples.jsonl"
    )


class DiagnosticsSection(StrictModel):
    plots: bool = Field(default=True, description="write PNG plots to <run-dir>/plots/")
    num_selection_samples: int = Field(
        default=4, ge=0, description="selected completions written to samples.jsonl"
    )


class RejectionSamplingConfig(StrictModel):
    strategy: Strategy = Field(description="selection rule; see README (each has a control)")
    top_k: int = Field(
        default=1000, ge=1, description="selection size of top_k_overall / random_k_overall"
    )
    model: ModelSection = ModelSection(name="Qwen/Qwen3-1.7B")
    scorer: ScorerSection = ScorerSection()
    data: DataSection = DataSection()
    generation: GenerationSection = GenerationSection()
    sft: SFTStageSection = SFTStageSection()
    eval: EvalSection = EvalSection()
    diagnostics: DiagnosticsSection = DiagnosticsSection()
    use_cache: bool = Field(
        default=True,
        description="reuse cached generations + scores ($RLHF_LAB_CACHE/rs_generations)",
    )
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection(save_every=None)
    seed: int = 42

    @model_validator(mode="after")
    def _check(self):
        if self.model.ref_name is not None:
            raise ValueError("model.ref_name is not used by rejection sampling; leave it null")
        if self.data.is_builtin and not self.data.builtin_tasks:
            raise ValueError(
                "data.dataset 'builtin:' needs at least one reasoning-gym task, e.g. "
                "builtin:chain_sum or builtin:chain_sum,spell_backward"
            )
        if self.data.builtin_task_configs and not self.data.is_builtin:
            raise ValueError("data.builtin_task_configs applies only to builtin:<task> datasets")
        m = self.data.max_train_samples
        if m is not None and self.sft.eval_size:
            size = selection_size(
                self.strategy, m, self.generation.num_completions_per_prompt, self.top_k
            )
            if self.sft.eval_size >= size:
                raise ValueError(
                    f"sft.eval_size ({self.sft.eval_size}) must be smaller than the selection "
                    f"({size} examples for {self.strategy})"
                )
        return self

    @property
    def matched_control(self) -> str:
        return MATCHED_CONTROL[self.strategy]


def selection_size(strategy: str, num_prompts: int, n: int, top_k: int) -> int:
    """How many completions ``strategy`` selects from ``num_prompts`` × ``n``: one per prompt for
    the per-prompt strategies, min(top_k, pool) for the overall ones."""
    if strategy.endswith("per_prompt"):
        return num_prompts
    return min(top_k, num_prompts * n)
