"""The operation table: each operation the lab offers an agent, as one row
(:class:`~rlhf_lab.api._operation.Operation`): its name, title and description, its argument
model (typed, each argument described and bounded), its result model, the API function it calls
and its read-only / destructive flags. The MCP server registers one tool per row
(:mod:`rlhf_lab.mcp_server.tools`); an error's next step names a row
(``NextStep("launch_run", {"queue": True})``). The CLI keeps its own hand-made commands and help
and calls the same API functions (:data:`rlhf_lab.cli.commands.COMMAND_OPERATIONS`).

An argument model's fields are its function's keyword arguments, by name
(tests/lab/test_api_layer.py checks them), except where the function takes a request whole:
:class:`LaunchRun` is the :class:`~rlhf_lab.api.request.RunRequest` that
:func:`~rlhf_lab.api.launch` takes, :class:`SweepRuns` the
:class:`~rlhf_lab.api.request.SweepRequest` of :func:`~rlhf_lab.api.sweep`.
Every result is bounded with the default arguments (tests/mcp/test_output_sizes.py). Torch-free.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from rlhf_lab.api import (
    CampaignList,
    Comparison,
    EvaluationLaunch,
    LaunchRunResult,
    LogTail,
    MemoryCheck,
    MetricsResult,
    PipelineResult,
    Plan,
    QueryResult,
    RecipeList,
    RecordSummary,
    Resources,
    RunList,
    RunStatusResult,
    ShrinkResult,
    StopRunResult,
    SweepResult,
)
from rlhf_lab.api._operation import Operation
from rlhf_lab.api.request import CampaignArg, ModelArg, RecipeArg, RunRequest, SweepRequest
from rlhf_lab.api.results import State
from trainers.core.spec import FAMILY_NAMES

__all__ = ["OPERATIONS", "LaunchRun", "operation_named"]

TAIL_MAX_BYTES = 64_000
METRICS_MAX_POINTS = 2_000
METRICS_MAX_BYTES = 40_000
STOP_MAX_GRACE_S = 600.0

Family = Literal[FAMILY_NAMES]  # one of the families, in the lab's order
Phase = Literal["train", "eval", "rollout"]
Device = Literal["auto", "cpu", "cuda"] | Annotated[str, Field(pattern=r"^cuda:\d{1,3}$")]

RunIdArg = Annotated[str, Field(description="run id (see list_runs)")]
OverridesArg = Annotated[list[str], Field(description="key=value, e.g. train.max_steps=20")]
DeviceArg = Annotated[Device, Field(description="auto, cpu, cuda or cuda:N")]


# ---------------------------------------------------------------------------- argument models


class ListRecipes(BaseModel):
    family: Annotated[Family | None, Field(description="only this family")] = None


class PlanExperiment(BaseModel):
    request: Annotated[
        str | None, Field(description="free text, e.g. 'dpo sanity check on tiny'")
    ] = None
    algorithm: Annotated[str | None, Field(description="algorithm, recipe or YAML path")] = None
    model: ModelArg = None
    campaign: Annotated[str | None, Field(description="ledger slug (default <algo>-sanity)")] = None
    overrides: OverridesArg = []
    calibrate: Annotated[bool, Field(description="false: measure nothing, use caches")] = True


class ShrinkConfig(BaseModel):
    recipe: RecipeArg
    model: ModelArg = None
    overrides: OverridesArg = []


class EstimateMemory(BaseModel):
    recipe: RecipeArg
    model: ModelArg = None
    overrides: OverridesArg = []
    shrink: Annotated[bool, Field(description="the shrunk config (false: the full recipe)")] = True
    device: DeviceArg = "auto"
    gpus: Annotated[str | None, Field(description="as launch_run; per-rank estimate")] = None
    nproc: Annotated[int | None, Field(description="as launch_run")] = None


class NoArguments(BaseModel):
    pass


class LaunchRun(RunRequest):
    """A :class:`RunRequest` as an agent sends it: a device by name, GPUs as text."""

    device: DeviceArg = "auto"
    gpus: Annotated[str | None, Field(description="GPU ids 0,1 or a count")] = None


class RunPipeline(BaseModel):
    name: Annotated[str, Field(description="rlhf, r1-zero or a pipeline YAML")]
    model: ModelArg = None
    campaign: CampaignArg = None
    overrides: Annotated[
        list[str], Field(description="stage.key=value, e.g. ['ppo.train.max_steps=3']")
    ] = []


class RunId(BaseModel):
    run_id: RunIdArg


class TailLogs(BaseModel):
    run_id: RunIdArg
    lines: Annotated[int, Field(ge=1, le=2000, description="last N lines (no cursor)")] = 50
    cursor: Annotated[
        int | None, Field(ge=0, description="byte offset a previous tail_logs returned")
    ] = None
    max_bytes: Annotated[
        int, Field(ge=256, le=TAIL_MAX_BYTES, description="cap on the returned text")
    ] = 8_000


class GetMetrics(BaseModel):
    run_id: RunIdArg
    keys: Annotated[list[str] | None, Field(description="metric names to keep (default: all)")] = (
        None
    )
    phase: Annotated[Phase | None, Field(description="only train, eval or rollout rows")] = None
    max_points: Annotated[
        int | None,
        Field(ge=1, le=METRICS_MAX_POINTS, description="at most this many rows per phase"),
    ] = None
    max_bytes: Annotated[
        int, Field(ge=256, le=METRICS_MAX_BYTES, description="cap on the rows' JSON size")
    ] = 8_000


class StopRun(BaseModel):
    run_id: RunIdArg
    grace_s: Annotated[
        float,
        Field(
            ge=0,
            le=STOP_MAX_GRACE_S,
            description="seconds to wait for the checkpoint before a kill",
        ),
    ] = 60.0


class ResumeRun(BaseModel):
    run_id: RunIdArg
    force: Annotated[bool, Field(description="start even if the device is busy")] = False


class ListRuns(BaseModel):
    campaign: Annotated[str | None, Field(description="campaign slug or dated name")] = None
    state: Annotated[State | None, Field(description="only runs in this state")] = None
    limit: Annotated[
        int | None, Field(ge=1, le=500, description="at most this many (the newest)")
    ] = None
    detail: Annotated[bool, Field(description="add each run's full status")] = False
    offset: Annotated[int, Field(ge=0, description="skip the newest N")] = 0


class QueryRuns(BaseModel):
    where: Annotated[list[str], Field(description="FIELD OP VALUE; metrics by name")] = []
    sort: Annotated[str | None, Field(description="field, -field: descending")] = None
    group_by: Annotated[str | None, Field(description="one row per value")] = None
    best: Annotated[str | None, Field(description="field picking each group's run")] = None
    limit: Annotated[int, Field(ge=1, le=500, description="at most N rows")] = 50


class CompareRuns(BaseModel):
    run_ids: Annotated[list[str] | None, Field(description="run ids of one family")] = None
    record_in: Annotated[str | None, Field(description="campaign to record the table in")] = None
    campaign: Annotated[str | None, Field(description="a campaign")] = None
    family: Annotated[str | None, Field(description="its family")] = None


class RecordResults(BaseModel):
    run_id: RunIdArg
    note: Annotated[str | None, Field(description="one-line observation (null keeps the old)")] = (
        None
    )


class ListCampaigns(BaseModel):
    limit: Annotated[int, Field(ge=1, le=500, description="at most this many (the newest)")] = 20


class SweepRuns(SweepRequest):
    """A :class:`SweepRequest` as an agent sends it: at least one recipe, bounded seeds."""

    recipes: Annotated[list[str], Field(min_length=1, description="recipes, e.g. ['dpo','ipo']")]
    device: DeviceArg = "auto"
    seeds: Annotated[int, Field(ge=1, le=16, description="runs per recipe")] = 1
    base_seed: Annotated[
        int | None, Field(ge=0, description="first seed (null: the first recipe's)")
    ] = None


class EvaluateModel(BaseModel):
    target: Annotated[str, Field(description="run id or model")]
    suite: Annotated[list[str], Field(description="reasoning, math, winrate, generation")] = [
        "reasoning"
    ]
    baseline: Annotated[str | None, Field(description="auto, none, run id or model")] = None
    judge: Annotated[str | None, Field(description="winrate: reward-model run")] = None
    overrides: OverridesArg = []


# ------------------------------------------------------------------------------------ the table

RUN_IDS = "call list_runs to see the run ids."
READ_ONLY = {"read_only": True, "idempotent": True}

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "list_recipes",
        "List recipes",
        "The recipes (one YAML per algorithm) with each family's key metrics and criteria, and "
        "the pipelines. Use it to find a recipe or what a run should show.",
        ListRecipes,
        RecipeList,
        "list_recipes",
        "call list_recipes without a family.",
        **READ_ONLY,
    ),
    Operation(
        "plan_experiment",
        "Plan an experiment",
        "Plan a sanity run, a matched comparison or a pipeline from free text ('compare ppo and "
        "grpo'): per run the changes, calibration, time, memory vs free memory, the command; "
        "criteria, order. Use it first; writes nothing.",
        PlanExperiment,
        Plan,
        "plan_experiment",
        "pass algorithm= explicitly (see list_recipes).",
        **READ_ONLY,
    ),
    Operation(
        "shrink_config",
        "Shrink a config",
        "A recipe as a validated quick sanity-run config: the full config, its diff and the "
        "expected steps. Use it to check overrides before launch_run; it writes nothing.",
        ShrinkConfig,
        ShrinkResult,
        "shrink_config",
        "check the recipe name with list_recipes and the override keys in the message.",
        **READ_ONLY,
    ),
    Operation(
        "estimate_memory",
        "Estimate memory",
        "Peak training memory of a recipe (shrunk by default) per component, against the free "
        "memory of the device launch_run would use. Use it before a launch.",
        EstimateMemory,
        MemoryCheck,
        "estimate_memory",
        "check the recipe and model names (list_recipes; model='tiny' works offline).",
        **READ_ONLY,
    ),
    Operation(
        "check_resources",
        "Check resources",
        "GPU memory and which runs hold each GPU, CPU count and load, free RAM. Use it before "
        "launching or when a run is slow; no GPU is an answer.",
        NoArguments,
        Resources,
        "check_resources",
        "retry once; a machine without a GPU is an answer, not an error.",
        **READ_ONLY,
    ),
    Operation(
        "launch_run",
        "Launch a run",
        "Start a training run in the background; returns its run id (shrunk and calibrated by "
        "default; a ledger row). Refused, nothing written, for a bad model, a length over its "
        "context, lr > 1 or memory that does not fit; a busy device is shared if the estimate "
        "fits (queue=true waits, force=true skips). run:<id> waits for that run.",
        LaunchRun,
        LaunchRunResult,
        "launch",
        "check the arguments with shrink_config and estimate_memory, then launch again.",
        open_world=True,
        whole=True,
        shape="launch_run_result",
    ),
    Operation(
        "run_pipeline",
        "Run a pipeline",
        "Queue a chain of runs in one campaign: rlhf (sft, reward model, ppo) or r1-zero (sft, "
        "grpo); a stage waits for the stages it takes a model from, a failure cancels the rest. "
        "Use it when plan_experiment proposes a pipeline.",
        RunPipeline,
        PipelineResult,
        "run_pipeline",
        "see the pipelines and their stages in list_recipes.",
        open_world=True,
    ),
    Operation(
        "run_status",
        "Run status",
        "A run's state, step/total, phase, ETA, headline (held-out first), latest metrics, "
        "diagnosed alerts with hints, advice. Use it to poll a run every 10-30 s.",
        RunId,
        RunStatusResult,
        "run_status",
        RUN_IDS,
        **READ_ONLY,
    ),
    Operation(
        "tail_logs",
        "Tail logs",
        "A run's train.log: the last `lines` lines, or with the returned cursor what is new; "
        "capped at max_bytes. Use it to watch for errors and stalls.",
        TailLogs,
        LogTail,
        "tail_logs",
        RUN_IDS,
        **READ_ONLY,
    ),
    Operation(
        "get_metrics",
        "Get metrics",
        "A run's metric rows, each phase down-sampled evenly (last row kept) to fit max_bytes; "
        "the note says what was left out. Use it to judge curves (fewer keys: more points).",
        GetMetrics,
        MetricsResult,
        "get_metrics",
        RUN_IDS,
        **READ_ONLY,
    ),
    Operation(
        "stop_run",
        "Stop a run",
        "Stop a running or queued run: the trainer checkpoints its last step ('stopped'); after "
        "grace_s it is killed ('killed': work since the last checkpoint lost). Use it for a "
        "diverging, stalled or unneeded run.",
        StopRun,
        StopRunResult,
        "stop_run",
        RUN_IDS,
        destructive=True,
        idempotent=True,
        shape="stop_run_result",
    ),
    Operation(
        "resume_run",
        "Resume a run",
        "Continue a died, stopped, killed or failed run from its last checkpoint, detached; its "
        "cancelled dependents queue again. Use it after a kill, a fixed OOM or a stop to undo.",
        ResumeRun,
        LaunchRunResult,
        "resume_run",
        "call run_status: only a died, stopped or failed run with a checkpoint can be resumed.",
        shape="launch_run_result",
    ),
    Operation(
        "list_runs",
        "List runs",
        "Runs (newest 50, or 10 with detail=true): id, campaign, state, step/total, headline. "
        "Use it to find run ids; state='running' shows what holds the devices.",
        ListRuns,
        RunList,
        "run_list",
        "call list_campaigns for campaign names.",
        **READ_ONLY,
    ),
    Operation(
        "query_runs",
        "Query runs",
        "Use it for questions over all runs: where ['state=died','ended_at>=-7d'], sort "
        "'-eval/accuracy', group_by+best: each group's best run.",
        QueryRuns,
        QueryResult,
        "query_runs",
        "call query_runs(where=[]).",
        **READ_ONLY,
    ),
    Operation(
        "compare_runs",
        "Compare runs",
        "Compare runs of ONE family (run_ids or a campaign's) by held-out headline: arms with "
        "mean and 95% interval, a verdict per pair. Use after record_results.",
        CompareRuns,
        Comparison,
        "compare_runs",
        RUN_IDS,
        idempotent=True,
    ),
    Operation(
        "record_results",
        "Record results",
        "Use when a run ends: writes its ledger row; then report from ledger://<campaign>. "
        "Hand-written text is kept.",
        RecordResults,
        RecordSummary,
        "record_results",
        RUN_IDS,
        idempotent=True,
        shape="RecordSummary.of",
    ),
    Operation(
        "list_campaigns",
        "List campaigns",
        "The campaigns (dated ledgers), newest first, with status, question and run count. Use "
        "it to find a campaign to read (ledger://<campaign>).",
        ListCampaigns,
        CampaignList,
        "list_campaigns",
        "read ledger://index.",
        **READ_ONLY,
    ),
    Operation(
        "sweep_runs",
        "Sweep with matched seeds",
        "Queue matched runs of several recipes in one campaign; seeds=K gives each recipe K "
        "runs with the same seeds (compare_runs then gives intervals and verdicts). Use it for "
        "any comparison meant to be reported.",
        SweepRuns,
        SweepResult,
        "sweep",
        "check the recipes with list_recipes and the overrides with shrink_config.",
        whole=True,
    ),
    Operation(
        "evaluate_model",
        "Evaluate a model",
        "Use after a run: evaluates its final model against its starting model, in the background.",
        EvaluateModel,
        EvaluationLaunch,
        "evaluate_model",
        "call list_runs for run ids.",
    ),
)


def operation_named(name: str) -> Operation:
    """The row called ``name`` (KeyError for none)."""
    for op in OPERATIONS:
        if op.name == name:
            return op
    raise KeyError(name)
