"""The ledger's data: the pydantic models stored in ``ledger.json`` and returned by the ledger's
functions (a run's record, a campaign, a recorded comparison), and the campaign's block names.
Torch-free."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from rlhf_lab.evaluation.records import EvalSummary
from rlhf_lab.planning.configs import ConfigChange  # one shape for every config diff the lab shows

__all__ = [
    "BLOCKS",
    "MANUAL_STATUSES",
    "AnswerEntry",
    "ArmSummary",
    "Attempt",
    "Campaign",
    "CampaignView",
    "ComparisonEntry",
    "ConfigChange",
    "HeadlineValue",
    "Lineage",
    "MetricSummary",
    "RunRecord",
    "SampleExcerpt",
    "SampleTurn",
    "Verdict",
]

BLOCKS: tuple[str, ...] = (
    "answer",
    "setup",
    "runs",
    "plots",
    "evaluation",
    "comparison",
    "observations-auto",
    "next",
)

MANUAL_STATUSES = frozenset({"concluded", "abandoned", "archived", "paused"})


class _Model(BaseModel):
    """Base of the ledger's models: NaN/inf survive a JSON round trip (as "NaN"/"Infinity")."""

    model_config = ConfigDict(ser_json_inf_nan="strings")


class MetricSummary(_Model):
    """Final and best value of one metric over a run (best only where a direction is clear)."""

    name: str
    final: float | None = None
    final_step: int | None = None
    best: float | None = None
    best_step: int | None = None
    direction: Literal["max", "min"] | None = None


class SampleTurn(_Model):
    """One turn of a multi-turn trajectory: the model's text or a tool's reply."""

    role: str = Field(description="model or tool (more: how many turns the excerpt leaves out)")
    text: str = ""


class SampleExcerpt(_Model):
    step: int | None = None
    kind: str | None = None
    prompt: str = ""
    completion: str = ""
    scores: dict[str, float] = Field(default_factory=dict)
    turns: list[SampleTurn] = Field(
        default_factory=list, description="a multi-turn trajectory turn by turn (else empty)"
    )


class HeadlineValue(_Model):
    """A run's held-out headline metric (what the run is judged on) and its sampling noise."""

    metric: str
    label: str = ""
    higher_is_better: bool = True
    value: float | None = None
    step: int | None = None
    n: int | None = Field(default=None, description="held-out items")
    n_source: str | None = None
    low: float | None = Field(default=None, description="Wilson 95% interval")
    high: float | None = None
    training_signal: str | None = Field(default=None, description="secondary, not the result")
    training_value: float | None = None
    start_value: float | None = Field(default=None, description="at step 0 (or first eval)")
    start_step: int | None = None


class Attempt(_Model):
    """One attempt of a run: the first launch, then one per resume."""

    number: int
    state: str | None = None
    steps: int | None = None
    resumed_from_step: int | None = None
    wall_time_s: float | None = None
    command: str | None = None
    detail: str | None = None


class Lineage(_Model):
    """Where a run's inputs come from: the runs it waited for and the config values that name
    their final models (``run:<id>``), and its stage when a pipeline made it."""

    after: list[str] = Field(default_factory=list, description="upstream run ids")
    references: dict[str, str] = Field(default_factory=dict, description="config key -> run id")
    pipeline: str | None = None
    stage: str | None = None


class RunRecord(_Model):
    """One run's row in a campaign ledger, built from its run folder."""

    run_id: str
    campaign: str
    family: str | None = None
    algorithm: str | None = None
    state: str = "unknown"
    outcome: str | None = Field(default=None, description="summary.json outcome")
    failure: str | None = Field(default=None, description="failure mode (error, signal, ...)")
    command: str | None = Field(
        default=None,
        description="the lab-level launch command that reproduces the run",
    )
    trainer_command: str | None = None
    argv: list[str] = Field(default_factory=list, description="the trainer argv as recorded")
    overrides: list[str] = Field(default_factory=list)
    model: str | None = None
    dataset: str | None = None
    seed: int | None = None
    config_source: str | None = Field(default=None, description="the shipped YAML it started from")
    recipe: str | None = None
    settings: dict[str, Any] = Field(default_factory=dict, description="lr, steps, KL values")
    config_file: str | None = Field(default=None, description="the run's resolved config.yaml")
    changes: list[ConfigChange] = Field(default_factory=list)
    metrics: list[MetricSummary] = Field(default_factory=list)
    performance: dict[str, float] = Field(
        default_factory=dict,
        description="medians of throughput/tokens_per_s, timing/*, mfu/*; max memory/peak_gb",
    )
    steps: int | None = None
    total_steps: int | None = None
    wall_time_s: float | None = Field(default=None, description="total over all attempts")
    predicted_wall_s: float | None = Field(
        default=None, description="the lab's prediction at launch (run.json predicted_time)"
    )
    attempts: list[Attempt] = Field(default_factory=list)
    headline: HeadlineValue | None = None
    flags: list[str] = Field(default_factory=list, description="findings Next acts on")
    wandb_url: str | None = None
    note: str | None = None
    samples: list[SampleExcerpt] = Field(default_factory=list)
    plot: str | None = Field(default=None, description="PNG path relative to experiments/")
    reward_kl_plot: str | None = Field(
        default=None,
        description="proxy and gold reward against √KL to the reference (PNG relative to "
        "experiments/), for a run that logs kl_ref and proxy_reward",
    )
    gold_peak_step: int | None = Field(
        default=None, description="where the gold reward peaked, when overoptimisation was found"
    )
    diagnostics: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    run_dir: str = ""
    recorded_at: str = ""
    lineage: Lineage | None = Field(default=None, description="upstream runs, pipeline stage")
    evaluation: EvalSummary | None = Field(
        default=None, description="an evaluation job's numbers (its eval.json)"
    )
    calibration: list[str] = Field(
        default_factory=list,
        description="the difficulty calibration before launch, as markdown lines (the run "
        "folder's calibration.json; rlhf_lab.planning.calibration)",
    )

    def metric(self, name: str) -> MetricSummary | None:
        return next((m for m in self.metrics if m.name == name), None)


class ArmSummary(_Model):
    """One arm of a comparison: runs of one algorithm (or setting) that differ only in seed."""

    label: str
    algorithm: str | None = None
    run_ids: list[str]
    seeds: list[int | None] = Field(default_factory=list)
    values: list[float] = Field(default_factory=list)
    mean: float | None = None
    low: float | None = Field(default=None, description="95% interval")
    high: float | None = None
    basis: str = ""
    n_items: int | None = None
    start_mean: float | None = Field(default=None, description="mean headline at step 0")
    recipe: str | None = None
    overrides: list[str] = Field(default_factory=list, description="seed left out")
    settings: dict[str, Any] = Field(default_factory=dict)


class Verdict(_Model):
    """Arm ``a`` against arm ``b`` on the headline, by the stated rule (rlhf_lab.results.stats)."""

    a: str
    b: str
    verdict: Literal["better", "worse", "tie within noise", "not comparable", "undecided"]
    difference: float | None = Field(default=None, description="a − b")
    low: float | None = None
    high: float | None = None
    method: str = ""
    reason: str = ""


class ComparisonEntry(_Model):
    """A comparison table recorded into a campaign's Comparison section."""

    key: str = Field(description="identifies the compared set; recording it again replaces it")
    title: str
    family: str
    run_ids: list[str]
    markdown: str
    recorded_at: str = ""
    headline: str | None = None
    higher_is_better: bool = True
    arms: list[ArmSummary] = Field(default_factory=list)
    verdicts: list[Verdict] = Field(default_factory=list)


class AnswerEntry(_Model):
    """The campaign's answer (rlhf_lab.results.answer): what the top of its report says."""

    verdict: str = Field(description="the answer to the question, with its 95% interval")
    details: list[str] = Field(default_factory=list, description="the other numbers behind it")
    rule: str = Field(default="", description="how the intervals and the verdict are made")
    budget: str = Field(default="", description="whether the budget was adequate, and why")
    figure: str | None = Field(default=None, description="PNG, relative to the asset folder")
    source: str = Field(default="", description="the analysis that made it")
    run_ids: list[str] = Field(default_factory=list)
    recorded_at: str = ""


class Campaign(_Model):
    id: str = Field(description="YYYY-MM-DD-<slug>, the markdown file's stem")
    slug: str
    date: str
    status: str
    question: str
    family: str | list[str] | None = None
    model: str | list[str] | None = None
    dataset: str | list[str] | None = None
    seeds: list[int] = Field(default_factory=list)
    path: str = Field(description="the markdown ledger")
    asset_dir: str = Field(description="runs/, plots/, ledger.json")
    runs: int = 0
    created: bool = Field(default=False, description="True when this call created it")
    warnings: list[str] = Field(default_factory=list)


class CampaignView(_Model):
    campaign: Campaign
    markdown: str
    runs: list[RunRecord]
    comparisons: list[ComparisonEntry] = Field(default_factory=list)


class _CampaignMeta(_Model):
    id: str
    slug: str
    date: str
    question: str
    family: str | None = None
    model: str | None = None
    dataset: str | None = None
    seeds: list[int] | None = None
    created_at: str = ""


class _LedgerData(_Model):
    version: int = 1
    campaign: _CampaignMeta
    runs: list[RunRecord] = Field(default_factory=list)
    comparisons: list[ComparisonEntry] = Field(default_factory=list)
    answer: AnswerEntry | None = None


class _RunBrief(NamedTuple):
    """What the index needs of a run (read without validating whole records)."""

    state: str
    family: str | None
    model: str | None
    dataset: str | None
    seed: int | None
