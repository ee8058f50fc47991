"""Reward-model config (torch-free; the lab validates with it).

One config model for the three kinds. ``kind`` picks the head, the data and the loss:

* ``preference`` — Bradley–Terry scalar head on preference pairs;
* ``orm`` — outcome reward model: scalar head, binary cross-entropy on correctness labels;
* ``prm`` — process reward model: ``data.num_labels``-class head at each step separator.

``data.dataset`` left out (or null) takes the kind's book default, and ``config.yaml`` in the run
directory records the value used.
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
from trainers.reward_models import spec as RM_SPEC
from trainers.reward_models.spec import FAMILY as RM_FAMILY

RMKind = RM_FAMILY.algorithm_literal

# Offline sets generated from reasoning-gym (data.py); the preference one is the direct-alignment
# family's set, reused as is.
BUILTIN_PREFERENCES = RM_SPEC.BUILTIN_PREFERENCES
BUILTIN_OUTCOMES = RM_SPEC.BUILTIN_OUTCOMES
BUILTIN_STEPS = RM_SPEC.BUILTIN_STEPS
# Derived from the specs (trainers/reward_models/spec.py); kept for callers that import it.
BUILTIN_BY_KIND: dict[str, str] = {
    a.name: a.builtin_dataset for a in RM_FAMILY.algorithms if a.builtin_dataset
}

# The book's datasets (book-code-inventory §3).
DEFAULT_DATASETS: dict[str, str] = {
    "preference": "argilla/ultrafeedback-binarized-preferences-cleaned",
    "orm": "RLHF-Book/gsm8k-qwen3-0.6B-rollouts",
    "prm": "tasksource/PRM800K",
}

# The name a run is filed under (= the shipped config's file name); derived from the specs.
ALGORITHM_NAMES: dict[str, str] = {a.name: a.run_name or a.name for a in RM_FAMILY.algorithms}

DEFAULT_STEP_SEPARATOR = "\n<step>\n"


class DataSection(StrictModel):
    dataset: str | None = Field(
        default=None,
        description="hub id, local .jsonl/.json/.parquet/.csv file or folder, or the kind's "
        "offline set (builtin:reasoning-preferences | builtin:reasoning-outcomes | "
        "builtin:reasoning-steps); None: the book's dataset for the kind",
    )
    split: str = "train"
    max_samples: int | None = Field(
        default=5000,
        ge=2,
        description="shuffled with the seed, then the first N: pairs (preference), prompts "
        "(orm), solutions (prm); for builtin sets, the number generated",
    )
    eval_size: int = Field(
        default=500,
        ge=0,
        description="held out for eval/ metrics, in the same unit as max_samples (orm/prm split "
        "by prompt / solution, so no prompt appears on both sides)",
    )
    max_length: int = Field(default=512, ge=16, description="tokens per sequence")
    rollouts_per_prompt: int = Field(
        default=32,
        ge=2,
        le=1000,
        description="orm: the first N stored completions of each prompt (label-blind); "
        "builtin:reasoning-outcomes generates this many per prompt",
    )
    num_labels: Literal[2, 3] = Field(
        default=3, description="prm classes: 3 = bad/neutral/good, 2 = bad/not-bad"
    )
    step_separator: str = Field(
        default=DEFAULT_STEP_SEPARATOR,
        min_length=1,
        description="prm: text appended to every step; its last token carries the step label",
    )
    builtin_task_configs: dict[str, dict] = Field(
        default_factory=dict,
        description="builtin orm/prm sets: per-task reasoning-gym settings, over "
        "trainers.core.tasks.TASK_CONFIGS (prm: chain_sum only, over PRM_TASK_CONFIG)",
    )


class EvalSection(StrictModel):
    eval_every: int = Field(default=25, ge=0, description="optimizer steps; 0 = only at the end")
    eval_batch_size: int = Field(default=8, ge=1, description="sequences per forward pass")
    num_samples: int = Field(
        default=2, ge=0, description="held-out examples written to samples.jsonl per eval"
    )


class RewardModelConfig(StrictModel):
    kind: RMKind = "preference"
    freeze_backbone: bool = Field(
        default=False, description="train the head only (the book's freeze_backbone)"
    )
    orm_loss_tokens: Literal["all", "last"] = Field(
        default="all",
        description="orm: BCE on every completion token (mean per completion, then over "
        "completions) or on the last token only; the score is always the last token's",
    )
    model: ModelSection = ModelSection(name="Qwen/Qwen3-0.6B-Base")
    data: DataSection = DataSection()
    train: OptimSection = OptimSection(
        learning_rate=5e-5,
        num_epochs=2,
        batch_size=2,
        gradient_accumulation_steps=8,
        warmup_ratio=0.1,
        weight_decay=0.01,
    )
    eval: EvalSection = EvalSection()
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection()
    seed: int = 123

    @model_validator(mode="before")
    @classmethod
    def _default_dataset(cls, data):
        """Fill data.dataset from the kind so config.yaml records the dataset used."""
        if isinstance(data, dict):
            kind = data.get("kind", "preference")
            section = data.get("data")
            if kind in DEFAULT_DATASETS and (section is None or isinstance(section, dict)):
                section = dict(section or {})
                if section.get("dataset") is None:
                    section["dataset"] = DEFAULT_DATASETS[kind]
                    data = {**data, "data": section}
        return data

    @model_validator(mode="after")
    def _check(self):
        d = self.data
        if d.max_samples is not None and d.eval_size >= d.max_samples:
            raise ValueError(
                f"data.eval_size ({d.eval_size}) must be smaller than data.max_samples "
                f"({d.max_samples}): nothing would be left to train on"
            )
        ds = d.dataset or ""
        if ds.startswith("builtin:"):
            wanted = BUILTIN_BY_KIND[self.kind]
            if ds.split(":")[1] != wanted.split(":")[1]:
                raise ValueError(
                    f"data.dataset {ds!r} is not an offline set for kind {self.kind!r}; use "
                    f"{wanted!r} (the sets: {', '.join(BUILTIN_BY_KIND.values())})"
                )
        if d.builtin_task_configs:
            self._check_task_configs(ds)
        if self.freeze_backbone and self.model.lora.enabled:
            raise ValueError(
                "freeze_backbone=true trains the head only, model.lora.enabled=true adds "
                "adapters to the backbone: choose one"
            )
        return self

    def _check_task_configs(self, dataset: str) -> None:
        if self.kind == "preference" or not dataset.startswith("builtin:"):
            raise ValueError(
                "data.builtin_task_configs applies only to the offline sets "
                f"{BUILTIN_OUTCOMES} (orm) and {BUILTIN_STEPS} (prm)"
            )
        if self.kind == "prm" and set(self.data.builtin_task_configs) - {"chain_sum"}:
            raise ValueError(
                f"data.builtin_task_configs: {BUILTIN_STEPS} is made of chain_sum problems; "
                "only chain_sum settings apply"
            )

    @property
    def algorithm(self) -> str:
        return ALGORITHM_NAMES[self.kind]

    @property
    def head_size(self) -> int:
        return self.data.num_labels if self.kind == "prm" else 1
