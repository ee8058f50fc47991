"""The MCP tools: each adapts one function of :mod:`rlhf_lab.api` (:data:`TOOL_OPERATIONS`),
passing its typed arguments and returning its pydantic result (:func:`reply`: structured content
with non-finite floats as null, and the same as compact JSON text). Every result is bounded with
the default arguments (tests/mcp/test_output_sizes.py): lists and series are cut to a size, with
a note saying how to see more."""

from typing import Annotated, Any

from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from rlhf_lab import api
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
from rlhf_lab.mcp_server._core import (
    METRICS_MAX_BYTES,
    METRICS_MAX_POINTS,
    READ_ONLY,
    STOP_MAX_GRACE_S,
    TAIL_MAX_BYTES,
    Device,
    Family,
    ModelArg,
    OverridesArg,
    Phase,
    RecipeArg,
    RunIdArg,
    State,
    _call,
    reply,
    server,
)

Result = CallToolResult  # each tool's result: Annotated[Result, <its model>]


@server.tool(
    title="List recipes",
    annotations=READ_ONLY,
    description="The recipes (one YAML per algorithm) with each family's key metrics and "
    "criteria, and the pipelines. Use it to find a recipe or what a run should show.",
)
def list_recipes(
    family: Annotated[Family | None, Field(description="only this family")] = None,
) -> Annotated[Result, RecipeList]:
    return reply(
        _call("list_recipes", "call list_recipes without a family.", api.list_recipes, family)
    )


@server.tool(
    title="Plan an experiment",
    annotations=READ_ONLY,
    description="Plan a sanity run, a matched comparison or a pipeline from free text ('compare "
    "ppo and grpo'): per run the changes, calibration, time, memory vs free memory, the "
    "command; criteria, order. Use it first; writes nothing.",
)
def plan_experiment(
    request: Annotated[
        str | None, Field(description="free text, e.g. 'dpo sanity check on tiny'")
    ] = None,
    algorithm: Annotated[str | None, Field(description="algorithm, recipe or YAML path")] = None,
    model: ModelArg = None,
    campaign: Annotated[
        str | None, Field(description="ledger slug (default <algo>-sanity)")
    ] = None,
    overrides: OverridesArg = [],  # noqa: B006 (pydantic copies defaults)
    calibrate: Annotated[bool, Field(description="false: measure nothing, use caches")] = True,
) -> Annotated[Result, Plan]:
    plan = _call(
        "plan_experiment",
        "pass algorithm= explicitly (see list_recipes).",
        api.plan_experiment,
        request,
        algorithm,
        model,
        campaign,
        list(overrides),
        calibrate=calibrate,
    )
    return reply(plan)


@server.tool(
    title="Shrink a config",
    annotations=READ_ONLY,
    description="A recipe as a validated quick sanity-run config: "
    "the full config, its diff and the expected steps. Use it to check overrides before "
    "launch_run; it writes nothing.",
)
def shrink_config(
    recipe: RecipeArg,
    model: ModelArg = None,
    overrides: OverridesArg = [],  # noqa: B006
) -> Annotated[Result, ShrinkResult]:
    shrunk = _call(
        "shrink_config",
        "check the recipe name with list_recipes and the override keys in the message.",
        api.shrink_config,
        recipe,
        list(overrides),
        model=model,
    )
    return reply(shrunk)


@server.tool(
    title="Estimate memory",
    annotations=READ_ONLY,
    description="Peak training memory of a recipe (shrunk by default) per component, against "
    "the free memory of the device launch_run would use. Use it before a launch.",
)
def estimate_memory(
    recipe: RecipeArg,
    model: ModelArg = None,
    overrides: OverridesArg = [],  # noqa: B006
    shrink: Annotated[bool, Field(description="the shrunk config (false: the full recipe)")] = True,
    device: Annotated[Device, Field(description="auto, cpu, cuda or cuda:N")] = "auto",
    gpus: Annotated[str | None, Field(description="as launch_run; per-rank estimate")] = None,
    nproc: Annotated[int | None, Field(description="as launch_run")] = None,
) -> Annotated[Result, MemoryCheck]:
    check = _call(
        "estimate_memory",
        "check the recipe and model names (list_recipes; model='tiny' works offline).",
        api.estimate_memory,
        recipe,
        model,
        list(overrides),
        shrink,
        device,
        gpus,
        nproc,
    )
    return reply(check)


@server.tool(
    title="Check resources",
    annotations=READ_ONLY,
    description="GPU memory and which runs hold each GPU, CPU count and load, free RAM. Use it "
    "before launching or when a run is slow; no GPU is an answer.",
)
def check_resources() -> Annotated[Result, Resources]:
    return reply(
        _call(
            "check_resources",
            "retry once; a machine without a GPU is an answer, not an error.",
            api.check_resources,
        )
    )


@server.tool(
    title="Launch a run",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
    ),
    description="Start a training run in the background; returns its run id (shrunk and "
    "calibrated by default; a ledger row). Refused, nothing written, for a bad model, a length "
    "over its context, lr > 1 or memory that does not fit; a busy device is shared if the "
    "estimate fits (queue=true waits, force=true skips). run:<id> waits for that run.",
)
def launch_run(
    recipe: RecipeArg,
    overrides: OverridesArg = [],  # noqa: B006
    shrink: Annotated[bool, Field(description="false: the full recipe")] = True,
    model: ModelArg = None,
    campaign: Annotated[str | None, Field(description="campaign slug")] = None,
    question: Annotated[str | None, Field(description="the question of a new campaign")] = None,
    device: Annotated[Device, Field(description="auto, cpu, cuda or cuda:N")] = "auto",
    queue: Annotated[bool, Field(description="wait for the device")] = False,
    force: Annotated[bool, Field(description="start on a busy device")] = False,
    after: Annotated[list[str], Field(description="run ids to wait for")] = [],  # noqa: B006
    gpus: Annotated[str | None, Field(description="GPU ids 0,1 or a count")] = None,
    nproc: Annotated[int | None, Field(description="CPU ranks")] = None,
    slurm: Annotated[
        dict[str, Any] | None,
        Field(description="Slurm job options (nodes, gpus_per_node, ...)"),
    ] = None,
    calibrate: Annotated[bool, Field(description="false: no difficulty probe")] = True,
) -> Annotated[Result, LaunchRunResult]:
    launched = _call(
        "launch_run",
        "check the arguments with shrink_config and estimate_memory, then launch again.",
        api.launch_run,
        recipe,
        list(overrides),
        shrink=shrink,
        model=model,
        campaign=campaign,
        question=question,
        device=device,
        queue=queue,
        force=force,
        after=list(after),
        gpus=gpus,
        nproc=nproc,
        slurm=slurm,
        calibrate=calibrate,
    )
    return reply(launched)


@server.tool(
    title="Run a pipeline",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
    ),
    description="Queue a chain of runs in one campaign: rlhf (sft, reward model, ppo) or "
    "r1-zero (sft, grpo); a stage waits for the stages it takes a model from, a failure cancels "
    "the rest. Use it when plan_experiment proposes a pipeline.",
)
def run_pipeline(
    name: Annotated[str, Field(description="rlhf, r1-zero or a pipeline YAML")],
    model: ModelArg = None,
    campaign: Annotated[str | None, Field(description="campaign slug")] = None,
    overrides: Annotated[
        list[str], Field(description="stage.key=value, e.g. ['ppo.train.max_steps=3']")
    ] = [],  # noqa: B006
) -> Annotated[Result, PipelineResult]:
    return reply(
        _call(
            "run_pipeline",
            "see the pipelines and their stages in list_recipes.",
            api.run_pipeline,
            name,
            model,
            campaign,
            list(overrides),
        )
    )


@server.tool(
    title="Run status",
    annotations=READ_ONLY,
    description="A run's state, step/total, phase, ETA, headline (held-out first), latest "
    "metrics, diagnosed alerts with hints, advice. Use it to poll a run every 10-30 s.",
)
def run_status(run_id: RunIdArg) -> Annotated[Result, RunStatusResult]:
    return reply(_call("run_status", "call list_runs to see the run ids.", api.run_status, run_id))


@server.tool(
    title="Tail logs",
    annotations=READ_ONLY,
    description="A run's train.log: the last `lines` lines, or with the returned cursor what "
    "is new; capped at max_bytes. Use it to watch for errors and stalls.",
)
def tail_logs(
    run_id: RunIdArg,
    lines: Annotated[int, Field(ge=1, le=2000, description="last N lines (no cursor)")] = 50,
    cursor: Annotated[
        int | None, Field(ge=0, description="byte offset a previous tail_logs returned")
    ] = None,
    max_bytes: Annotated[
        int, Field(ge=256, le=TAIL_MAX_BYTES, description="cap on the returned text")
    ] = 8_000,
) -> Annotated[Result, LogTail]:
    tail = _call(
        "tail_logs",
        "call list_runs to see the run ids.",
        api.tail_logs,
        run_id,
        lines=lines,
        cursor=cursor,
        max_bytes=max_bytes,
    )
    return reply(tail)


@server.tool(
    title="Get metrics",
    annotations=READ_ONLY,
    description="A run's metric rows, each phase down-sampled evenly "
    "(last row kept) to fit max_bytes; the note says what was left out. Use it to judge "
    "curves (fewer keys: more points).",
)
def get_metrics(
    run_id: RunIdArg,
    keys: Annotated[
        list[str] | None, Field(description="metric names to keep (default: all)")
    ] = None,
    phase: Annotated[Phase | None, Field(description="only train, eval or rollout rows")] = None,
    max_points: Annotated[
        int | None,
        Field(ge=1, le=METRICS_MAX_POINTS, description="at most this many rows per phase"),
    ] = None,
    max_bytes: Annotated[
        int, Field(ge=256, le=METRICS_MAX_BYTES, description="cap on the rows' JSON size")
    ] = 8_000,
) -> Annotated[Result, MetricsResult]:
    series = _call(
        "get_metrics",
        "call list_runs to see the run ids.",
        api.get_metrics,
        run_id,
        keys,
        phase,
        max_points,
        max_bytes,
    )
    return reply(series)


@server.tool(
    title="Stop a run",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    description="Stop a running or queued run: the trainer checkpoints its last step "
    "('stopped'); after grace_s it is killed ('killed': work since the last checkpoint lost). "
    "Use it for a diverging, stalled or unneeded run.",
)
def stop_run(
    run_id: RunIdArg,
    grace_s: Annotated[
        float,
        Field(
            ge=0,
            le=STOP_MAX_GRACE_S,
            description="seconds to wait for the checkpoint before a kill",
        ),
    ] = 60.0,
) -> Annotated[Result, StopRunResult]:
    status = _call("stop_run", "call list_runs to see the run ids.", api.stop_run, run_id, grace_s)
    return reply(api.stop_run_result(status))


@server.tool(
    title="Resume a run",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    ),
    description="Continue a died, stopped, killed or failed run from its last checkpoint, "
    "detached; its cancelled dependents queue again. Use it after a kill, a fixed OOM or a stop "
    "to undo.",
)
def resume_run(
    run_id: RunIdArg,
    force: Annotated[bool, Field(description="start even if the device is busy")] = False,
) -> Annotated[Result, LaunchRunResult]:
    result = _call(
        "resume_run",
        "call run_status: only a died, stopped or failed run with a checkpoint can be resumed.",
        api.resume_run_detached,
        run_id,
        force=force,
    )
    return reply(result)


@server.tool(
    title="List runs",
    annotations=READ_ONLY,
    description="Runs (newest 50, or 10 with detail=true): id, campaign, state, step/total, "
    "headline. Use it to find run ids; state='running' shows what holds the devices.",
)
def list_runs(
    campaign: Annotated[str | None, Field(description="campaign slug or dated name")] = None,
    state: Annotated[State | None, Field(description="only runs in this state")] = None,
    limit: Annotated[
        int | None, Field(ge=1, le=500, description="at most this many (the newest)")
    ] = None,
    detail: Annotated[bool, Field(description="add each run's full status")] = False,
    offset: Annotated[int, Field(ge=0, description="skip the newest N")] = 0,
) -> Annotated[Result, RunList]:
    listed = _call(
        "list_runs",
        "call list_campaigns for campaign names.",
        api.run_list,
        campaign,
        state,
        limit,
        detail,
        offset,
    )
    return reply(listed)


@server.tool(
    title="Query runs",
    annotations=READ_ONLY,
    description="Use it for questions over all runs: where ['state=died','ended_at>=-7d'], "
    "sort '-eval/accuracy', group_by+best: each group's best run.",
)
def query_runs(
    where: Annotated[list[str], Field(description="FIELD OP VALUE; metrics by name")] = [],  # noqa: B006
    sort: Annotated[str | None, Field(description="field, -field: descending")] = None,
    group_by: Annotated[str | None, Field(description="one row per value")] = None,
    best: Annotated[str | None, Field(description="field picking each group's run")] = None,
    limit: Annotated[int, Field(ge=1, le=500, description="at most N rows")] = 50,
) -> Annotated[Result, QueryResult]:
    found = _call(
        "query_runs",
        "call query_runs(where=[]).",
        api.query_runs,
        list(where),
        sort,
        group_by,
        best,
        limit,
    )
    return reply(found)


@server.tool(
    title="Compare runs",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    description="Compare runs of ONE family (run_ids or a campaign's) by held-out headline: arms "
    "with mean and 95% interval, a verdict per pair. Use after record_results.",
)
def compare_runs(
    run_ids: Annotated[list[str] | None, Field(description="run ids of one family")] = None,
    record_in: Annotated[str | None, Field(description="campaign to record the table in")] = None,
    campaign: Annotated[str | None, Field(description="a campaign")] = None,
    family: Annotated[str | None, Field(description="its family")] = None,
) -> Annotated[Result, Comparison]:
    cmp = _call(
        "compare_runs",
        "call list_runs to see the run ids.",
        api.compare_runs,
        run_ids,
        record_in,
        campaign,
        family,
    )
    return reply(cmp)


@server.tool(
    title="Record results",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    description="Use when a run ends: writes its ledger row; then report from "
    "ledger://<campaign>. Hand-written text is kept.",
)
def record_results(
    run_id: RunIdArg,
    note: Annotated[
        str | None, Field(description="one-line observation (null keeps the old)")
    ] = None,
) -> Annotated[Result, RecordSummary]:
    rec = _call(
        "record_results", "call list_runs to see the run ids.", api.record_results, run_id, note
    )
    return reply(RecordSummary.of(rec))


@server.tool(
    title="List campaigns",
    annotations=READ_ONLY,
    description="The campaigns (dated ledgers), newest first, with status, question and run "
    "count. Use it to find a campaign to read (ledger://<campaign>).",
)
def list_campaigns(
    limit: Annotated[int, Field(ge=1, le=500, description="at most this many (the newest)")] = 20,
) -> Annotated[Result, CampaignList]:
    return reply(_call("list_campaigns", "read ledger://index.", api.list_campaigns, limit))


@server.tool(
    title="Sweep with matched seeds",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    ),
    description="Queue matched runs of several recipes in one campaign; seeds=K gives each "
    "recipe K runs with the same seeds (compare_runs then gives intervals and verdicts). Use it "
    "for any comparison meant to be reported.",
)
def sweep_runs(
    recipes: Annotated[list[str], Field(min_length=1, description="recipes, e.g. ['dpo','ipo']")],
    overrides: OverridesArg = [],  # noqa: B006
    shrink: Annotated[bool, Field(description="shrink each to a sanity run")] = True,
    model: ModelArg = None,
    campaign: Annotated[str | None, Field(description="campaign slug")] = None,
    device: Annotated[Device, Field(description="auto, cpu, cuda or cuda:N")] = "auto",
    seeds: Annotated[int, Field(ge=1, le=16, description="runs per recipe")] = 1,
    base_seed: Annotated[
        int | None, Field(ge=0, description="first seed (null: the first recipe's)")
    ] = None,
) -> Annotated[Result, SweepResult]:
    return reply(
        _call(
            "sweep_runs",
            "check the recipes with list_recipes and the overrides with shrink_config.",
            api.sweep,
            list(recipes),
            list(overrides),
            shrink=shrink,
            model=model,
            campaign=campaign,
            device=device,
            seeds=seeds,
            base_seed=base_seed,
        )
    )


@server.tool(
    title="Evaluate a model",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    ),
    description="Use after a run: evaluates its final model against its starting model, in the "
    "background.",
)
def evaluate_model(
    target: Annotated[str, Field(description="run id or model")],
    suite: Annotated[list[str], Field(description="reasoning, math, winrate, generation")] = [  # noqa: B006
        "reasoning"
    ],
    baseline: Annotated[str | None, Field(description="auto, none, run id or model")] = None,
    judge: Annotated[str | None, Field(description="winrate: reward-model run")] = None,
    overrides: OverridesArg = [],  # noqa: B006
) -> Annotated[Result, EvaluationLaunch]:
    return reply(
        _call(
            "evaluate_model",
            "call list_runs for run ids.",
            api.evaluate_model,
            target,
            suite=list(suite),
            baseline=baseline,
            judge=judge,
            overrides=list(overrides),
        )
    )


TOOL_NAMES = (
    "resume_run",
    "list_recipes",
    "plan_experiment",
    "shrink_config",
    "estimate_memory",
    "check_resources",
    "launch_run",
    "run_pipeline",
    "run_status",
    "tail_logs",
    "get_metrics",
    "stop_run",
    "list_runs",
    "compare_runs",
    "record_results",
    "list_campaigns",
    "sweep_runs",
    "evaluate_model",
    "query_runs",
)

# tool -> the one lab API function it adapts (tests/lab/test_api_layer.py checks each exists)
TOOL_OPERATIONS: dict[str, str] = {
    "list_recipes": "list_recipes",
    "plan_experiment": "plan_experiment",
    "shrink_config": "shrink_config",
    "estimate_memory": "estimate_memory",
    "check_resources": "check_resources",
    "launch_run": "launch_run",
    "run_pipeline": "run_pipeline",
    "run_status": "run_status",
    "tail_logs": "tail_logs",
    "get_metrics": "get_metrics",
    "stop_run": "stop_run",
    "resume_run": "resume_run_detached",
    "list_runs": "run_list",
    "compare_runs": "compare_runs",
    "record_results": "record_results",
    "list_campaigns": "list_campaigns",
    "sweep_runs": "sweep",
    "evaluate_model": "evaluate_model",
    "query_runs": "query_runs",
}
