"""What a plan is made of, as the API returns it: :class:`Plan`, its :class:`PlannedRun` s with
their device fits and memory briefs, and the :class:`Criteria` to judge them by. Torch-free."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rlhf_lab.planning.calibration import Calibration
from rlhf_lab.planning.configs import ConfigChange
from rlhf_lab.planning.time import TimeEstimate


class DeviceFit(BaseModel):
    device: str = Field(description="cuda:<index> or cpu")
    name: str
    total_gb: float
    free_gb: float
    estimate_gb: float | None
    fits: bool | None = Field(description="estimate plus a 10% margin fits in the free memory")
    held_by: list[str] = Field(default_factory=list, description="lab runs using this device")


class MemoryBrief(BaseModel):
    """A memory estimate in brief (estimate_memory gives every component and its derivation)."""

    total_gb: float
    dtype: str
    param_count: int
    largest: str = Field(description="the largest component and its GiB")


class Criteria(BaseModel):
    """What to watch and what a good run shows, for the algorithms named (a run's criteria are
    every entry that names its algorithm)."""

    algorithms: list[str]
    key_metrics: list[str] = Field(default_factory=list)
    acceptance: list[str] = Field(default_factory=list)
    watch: list[str] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.key_metrics or self.acceptance or self.watch)


class PlannedRun(BaseModel):
    name: str = Field(description="this run's name in the plan, e.g. grpo or top_per_prompt[prm]")
    recipe: str = Field(description="<family>/<name> of the shipped recipe (or the YAML path)")
    config_path: str
    family: str
    algorithm: str
    model: str | None
    changes: list[ConfigChange] = Field(
        description="values that differ from the recipe: the shrink rules, the matching, yours"
    )
    expected_optimizer_steps: int | None
    memory: dict[str, MemoryBrief] = Field(
        default_factory=dict, description="estimate per device kind (cuda: bf16, cpu: fp32)"
    )
    devices: list[DeviceFit] = Field(default_factory=list)
    recommended_device: str | None = None
    env: dict[str, str] = Field(default_factory=dict, description="environment for the trainer")
    launch_command: str = Field(description="the lab command (it shrinks and records the run)")
    trainer_command: str = Field(description="the same run as a bare trainer command")
    after: list[str] = Field(
        default_factory=list, description="runs of this plan that must finish first (by name)"
    )
    calibration: Calibration | None = Field(
        default=None,
        description="the difficulty probe of the base model and the task/length it chose "
        "(runs that learn from their own samples; rlhf_lab.planning.calibration)",
    )
    calibration_table: list[str] = Field(
        default_factory=list,
        exclude=True,  # the same facts as `calibration`: printed by the CLI, never serialised
        description="the calibration as the CLI prints it",
    )
    time: TimeEstimate | None = None  # predicted wall time here (rlhf_lab.planning.time)


class Plan(BaseModel):
    request: str | None
    intent: Literal["sanity", "compare", "pipeline"]
    pipeline: str | None = Field(
        default=None, description="the pipeline these runs are (run_pipeline launches them all)"
    )
    pipeline_command: str | None = Field(
        default=None, description="the lab command that queues every stage of the pipeline"
    )
    campaign: str = Field(description="ledger slug")
    campaign_name: str = Field(description="YYYY-MM-DD-<slug>: the ledger file and folder")
    runs: list[PlannedRun]
    steps: list[str] = Field(description="the launch order, naming the runs; later steps wait")
    matched: list[str] = Field(
        default_factory=list, description="settings held equal across the runs (key=value)"
    )
    comparison: str | None = None
    criteria: list[Criteria] = Field(
        default_factory=list,
        description="key metrics, acceptance and what to watch; shared ones listed once",
    )
    warnings: list[str] = Field(
        default_factory=list, description="'<runs>: ...' when it concerns some runs only"
    )
    offline_choices: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    time_total_s: float | None = None  # every run, one after another
    time_total: str | None = None
