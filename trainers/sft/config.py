"""SFT config (torch-free; the lab validates with it).

Defaults follow the reference book's instruction-tuning chapter (OLMo-2-1B base on No Robots,
final-assistant-turn loss, lr 5e-6, 3 epochs, batch 4 × 8, max_length 2048); the shipped
``configs/sft.yaml`` holds the same values. ``configs/sft_tiny_warmstart.yaml`` is the recipe
that turns the ``tiny`` preset into a warm start for policy-gradient runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from trainers.core.builtin_data import DEMONSTRATION_TASKS, TOOL_SFT_DATASET, split_builtin_name
from trainers.core.config import (
    CheckpointSection,
    LoggingSection,
    ModelSection,
    OptimSection,
    StrictModel,
)
from trainers.sft.spec import BUILTIN_DATASET as SFT_BUILTIN

BUILTIN_DATASET = SFT_BUILTIN
"""Offline demonstrations generated from reasoning-gym tasks (data.py re-exports it)."""

TOOL_DATASET = TOOL_SFT_DATASET
"""Offline demonstrations of calling the calculator (``trainers.core.tool_demonstrations``);
their tool-call turn is not the last one, so this set trains with ``train_on=all_assistant``."""

BUILTIN_NAMES: tuple[str, ...] = (BUILTIN_DATASET, TOOL_DATASET)
"""The built-in SFT sets, each optionally followed by ``:task_a,task_b``."""

DEFAULT_BUILTIN_TASKS: tuple[str, ...] = DEMONSTRATION_TASKS
"""Tasks of the built-in set when neither ``data.builtin_tasks`` nor the dataset name picks any
(the built-in set's own default, :data:`trainers.core.builtin_data.DEMONSTRATION_TASKS`)."""


def is_tool_dataset(dataset: str) -> bool:
    """Whether ``dataset`` names the tool-use demonstrations (``builtin:tool-sft[:tasks]``)."""
    return dataset.startswith("builtin:") and split_builtin_name(dataset)[0] == TOOL_DATASET


class SFTModelSection(ModelSection):
    chat_template_source: str | None = Field(
        default=None,
        description="model/tokenizer to copy the chat template from when `name` has none "
        "(a base model); the template is saved with final_model",
    )


class DataSection(StrictModel):
    dataset: str = Field(
        default="HuggingFaceH4/no_robots",
        description=f"hub id, local .jsonl/.json/.parquet/.csv file or folder, or "
        f"{BUILTIN_DATASET}[:task_a,task_b] / {TOOL_DATASET}[:task_a,task_b] (offline)",
    )
    split: str = "train"
    max_samples: int | None = Field(
        default=None, ge=1, description="shuffled with the seed, then the first N (None: all)"
    )
    eval_size: int = Field(default=100, ge=0, description="examples held out for eval/ metrics")
    max_length: int = Field(default=2048, ge=8, description="tokens per conversation (right cut)")
    train_on: Literal["final", "all_assistant"] = Field(
        default="final",
        description=f"which assistant turns carry the loss ({TOOL_DATASET} needs all_assistant)",
    )
    builtin_tasks: list[str] | None = Field(
        default=None,
        description=f"reasoning-gym tasks for {BUILTIN_DATASET} or {TOOL_DATASET} "
        "(None: the set's defaults)",
    )
    builtin_task_configs: dict[str, dict] = Field(
        default_factory=dict,
        description="per-task reasoning-gym settings merged over trainers.core.tasks.TASK_CONFIGS",
    )
    packing: bool = Field(
        default=True,
        description="several conversations per row, each attending only to itself, where that "
        "saves token slots (same loss and gradients, less padding); false: one right-padded "
        "row per conversation",
    )


class EvalSection(StrictModel):
    eval_every: int = Field(default=50, ge=0, description="optimizer steps; 0 = only at the end")
    eval_batch_size: int = Field(default=8, ge=1)
    sample_every: int = Field(default=50, ge=0, description="optimizer steps; 0 = only at the end")
    num_samples: int = Field(default=4, ge=0, description="held-out prompts sampled per event")
    sample_max_new_tokens: int = Field(default=128, ge=1)
    sample_max_input_tokens: int | None = Field(default=512, ge=1)
    sample_do_sample: bool = True
    sample_temperature: float = Field(default=0.7, gt=0)
    sample_top_p: float = Field(default=0.9, gt=0, le=1)


class SFTConfig(StrictModel):
    model: SFTModelSection = SFTModelSection(
        name="allenai/OLMo-2-0425-1B",
        chat_template_source="allenai/OLMo-2-0425-1B-SFT",
        gradient_checkpointing=True,
    )
    data: DataSection = DataSection()
    train: OptimSection = OptimSection(
        learning_rate=5e-6, num_epochs=3, batch_size=4, gradient_accumulation_steps=8
    )
    eval: EvalSection = EvalSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    seed: int = 42

    @model_validator(mode="after")
    def _check_tool_turns(self):
        if is_tool_dataset(self.data.dataset) and self.data.train_on == "final":
            raise ValueError(
                f"data.train_on=final trains only the last assistant turn, but {TOOL_DATASET}'s "
                "tool call is in an earlier one; set data.train_on=all_assistant"
            )
        return self

    @model_validator(mode="after")
    def _check_sizes(self):
        n = self.data.max_samples
        if n is not None and self.data.eval_size >= n:
            raise ValueError(
                f"data.eval_size ({self.data.eval_size}) must be smaller than data.max_samples "
                f"({n}) so that some examples are left to train on"
            )
        return self
