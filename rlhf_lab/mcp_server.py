"""The lab as an MCP server ("rlhf-lab"): thin adapters over :mod:`rlhf_lab.api`.

Every tool takes typed arguments (each with a description), returns a pydantic model (sent as
structured content with its output schema) and answers within seconds: ``launch_run`` starts the
trainer detached and returns its run id at once, ``tail_logs`` is capped and returns a cursor,
``get_metrics`` is down-sampled. Each tool adapts one function of :mod:`rlhf_lab.api`
(:data:`TOOL_OPERATIONS`); this module imports nothing else of the lab but :mod:`rlhf_lab.errors`.
Expected failures (:class:`~rlhf_lab.errors.LabError`: unknown recipe, run not found, invalid
config, busy device) come back as the SDK's ``ToolError``: the lab's message, then its next steps
rendered as tool calls (``launch_run(queue=true)``, :func:`render_step`), or the tool's own
default hint when the error names none; no traceback reaches the client. "No GPU" is an answer of
``check_resources``, not an error.

Resources: ``ledger://index`` (experiments/README.md, or a generated index when there is none)
and ``ledger://{campaign}`` (a campaign's markdown). Prompts: ``sanity_check`` and
``compare_algorithms``.

Transports: stdio (default; what ``.mcp.json`` starts with ``uv run rlhf-lab mcp``) or streamable
HTTP on 127.0.0.1 (``--http``); a non-loopback host needs ``--allow-remote``. Logging goes to
stderr only. Nothing here writes to stdout: in stdio mode stdout is the protocol channel, and the
trainers run as detached processes whose stdout and stderr go to their own ``train.log``.

Torch-free: importing this module (and serving) never imports torch or transformers.
"""

import argparse
import ipaddress
import json
import logging
import math
import sys
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from rlhf_lab import api
from rlhf_lab.api import (
    CampaignList,
    Comparison,
    LaunchRunResult,
    LogTail,
    MemoryCheck,
    MetricsResult,
    Plan,
    RecipeList,
    RecordResult,
    Resources,
    RunList,
    RunStatus,
    RunStatusResult,
    ShrinkResult,
)
from rlhf_lab.errors import InvalidArgument, LabError, NextStep

__all__ = [
    "DEFAULT_PORT",
    "MCP_OPERATIONS",
    "SERVER_NAME",
    "TOOL_NAMES",
    "TOOL_OPERATIONS",
    "check_bind_host",
    "main",
    "render_error",
    "render_step",
    "server",
]

SERVER_NAME = "rlhf-lab"
DEFAULT_PORT = 8765
TAIL_MAX_BYTES = 64_000
METRICS_MAX_POINTS = 2_000
STOP_MAX_GRACE_S = 30.0

log = logging.getLogger("rlhf_lab.mcp")

Family = Literal[
    "direct_alignment", "policy_gradients", "reward_models", "rejection_sampling", "sft"
]
State = Literal["queued", "starting", "running", "succeeded", "failed", "stopped", "died"]
Phase = Literal["train", "eval", "rollout"]
Device = Literal["auto", "cpu", "cuda"] | Annotated[str, Field(pattern=r"^cuda:\d{1,3}$")]

INSTRUCTIONS = """\
rlhf-lab runs small RLHF experiments (SFT, reward models, DPO-style direct alignment, policy
gradients, rejection sampling) and records them in dated markdown ledgers.
Workflow: plan_experiment -> shrink_config -> estimate_memory -> launch_run (returns at once) ->
poll run_status every 10-30 s and read new output with tail_logs(cursor=...) -> record_results ->
report from the ledger (resource ledger://{campaign}). One training job per device unless
estimate_memory says both fit. Without Hugging Face access use model="tiny".
"""

server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, version=api.LAB_VERSION)


# ---------------------------------------------------------------------------------------------
# Errors: a LabError's next steps rendered as tool calls
# ---------------------------------------------------------------------------------------------

# lab operation -> (the tool that performs it, the tool's argument names). The lab API and the
# tools share argument names, so a next step's arguments pass through unrenamed; an operation or
# argument missing here cannot be rendered (tests/mcp/test_error_rendering.py walks them all).
MCP_OPERATIONS: dict[str, tuple[str, frozenset[str]]] = {
    "list_recipes": ("list_recipes", frozenset({"family"})),
    "plan_experiment": (
        "plan_experiment",
        frozenset({"request", "algorithm", "model", "campaign", "overrides"}),
    ),
    "shrink_config": ("shrink_config", frozenset({"recipe", "model", "overrides"})),
    "estimate_memory": (
        "estimate_memory",
        frozenset({"recipe", "model", "overrides", "shrink", "device"}),
    ),
    "check_resources": ("check_resources", frozenset()),
    "launch_run": (
        "launch_run",
        frozenset(
            {"recipe", "overrides", "shrink", "model", "campaign", "question", "device"}
            | {"queue", "force"}
        ),
    ),
    "run_status": ("run_status", frozenset({"run_id"})),
    "tail_logs": ("tail_logs", frozenset({"run_id", "lines", "cursor", "max_bytes"})),
    "get_metrics": ("get_metrics", frozenset({"run_id", "keys", "phase", "max_points"})),
    "stop_run": ("stop_run", frozenset({"run_id", "grace_s"})),
    "resume_run": ("resume_run", frozenset({"run_id", "force"})),
    "list_runs": ("list_runs", frozenset({"campaign", "state", "limit"})),
    "compare_runs": ("compare_runs", frozenset({"run_ids", "record_in"})),
    "record_results": ("record_results", frozenset({"run_id", "note"})),
    "list_campaigns": ("list_campaigns", frozenset()),
}
# operations an agent performs by reading a resource: operation -> (URI template, its argument)
MCP_RESOURCE_OPERATIONS: dict[str, tuple[str, str]] = {
    "show_campaign": ("ledger://{campaign}", "campaign"),
}


def _json_value(value: Any) -> str:
    """An argument value as the agent would write it in a call (JSON: true, null, "x")."""
    return json.dumps(value, ensure_ascii=False)


def render_step(step: NextStep) -> str:
    """A next step as a tool call, ``launch_run(queue=true)``, or a resource read; raises
    KeyError for an operation or argument this surface has no rendering for."""
    if step.operation in MCP_RESOURCE_OPERATIONS:
        template, arg = MCP_RESOURCE_OPERATIONS[step.operation]
        unknown = set(step.args) - {arg}
        if unknown:
            raise KeyError(f"{step.operation}: no MCP rendering for {sorted(unknown)}")
        value = step.args.get(arg)
        text = "read " + template.replace("{" + arg + "}", str(value) if value else f"<{arg}>")
    else:
        tool, known = MCP_OPERATIONS[step.operation]
        unknown = set(step.args) - known
        if unknown:
            raise KeyError(f"{step.operation}: no MCP rendering for {sorted(unknown)}")
        inner = ", ".join(f"{k}={_json_value(v)}" for k, v in step.args.items())
        text = f"{tool}({inner})"
    return f"{text} ({step.note})" if step.note else text


def render_error(err: LabError, default_next: str) -> str:
    """The error's message and its next steps as tool calls; the tool's own default hint when
    the error names none."""
    if err.next_steps:
        return err.render(render_step)
    return f"{err.message}\nNext: {default_next}"


T = TypeVar("T")


def _call(tool: str, default_next: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a lab function; expected failures become a ToolError that says what to do next,
    anything else a short ToolError naming the bug (the traceback goes to stderr only)."""
    try:
        return fn(*args, **kwargs)
    except ToolError:
        raise
    except LabError as err:
        raise ToolError(render_error(err, default_next)) from None
    except Exception as err:  # a bug, not the caller's mistake: say so, keep the traceback local
        log.exception("tool %s failed unexpectedly", tool)
        first = (str(err).strip().splitlines() or [""])[0][:300]
        raise ToolError(
            f"unexpected {type(err).__name__} in {tool}: {first}\nNext: this is a bug in "
            "rlhf-lab, not in the request; the server's stderr log has the details. Retry once, "
            "or run the CLI equivalent (uv run rlhf-lab --help) to see the full error."
        ) from None


def _finite(value: Any) -> Any:
    """NaN / inf -> None, recursively (JSON has no NaN; a diverged run's metrics must still
    validate against the output schema)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _clean(model: BaseModel, cls: type[BaseModel] | None = None) -> Any:
    """A copy of ``model`` (as ``cls``) whose non-finite floats are None."""
    data = _finite(model.model_dump())
    return (cls or type(model)).model_validate(data)


READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------

RecipeArg = Annotated[
    str,
    Field(
        description="recipe name (dpo, simpo, grpo, preference_rm, sft, ...), '<family>/<name>', "
        "an algorithm name or alias, or a YAML path; list_recipes shows them"
    ),
]
RunIdArg = Annotated[
    str,
    Field(description="run id as launch_run / list_runs return it, e.g. dpo-20260101-120000-ab12"),
]
ModelArg = Annotated[
    str | None,
    Field(
        description="swap the model: 'tiny' (built-in ~1M-parameter preset, offline), a local "
        "folder (e.g. another run's final_model/), a .gguf file or a hub id; null keeps the "
        "recipe's model"
    ),
]
OverridesArg = Annotated[
    list[str],
    Field(
        description="dotted key=value overrides applied last, e.g. ['train.max_steps=20', "
        "'data.max_samples=256']"
    ),
]


@server.tool(
    title="List recipes",
    annotations=READ_ONLY,
    description="List the shipped training recipes (one YAML config per algorithm) with each "
    "family's key metrics and acceptance criteria. Use it first when you do not know the exact "
    "recipe name, or to look up what a family's sanity run should show.",
)
def list_recipes(
    family: Annotated[Family | None, Field(description="only this family")] = None,
) -> RecipeList:
    return _call("list_recipes", "call list_recipes without a family.", api.list_recipes, family)


@server.tool(
    title="Plan an experiment",
    annotations=READ_ONLY,
    description="Plan a sanity run (or a comparison) from a request such as 'small SimPO sanity "
    "check' or 'compare dpo and ipo': the recipe, the shrunk config and its diff, the memory "
    "estimate against free memory, the exact commands, the metrics to watch and the acceptance "
    "criteria, and the ledger campaign. Use it at the start of every new experiment; it writes "
    "nothing.",
)
def plan_experiment(
    request: Annotated[
        str | None, Field(description="free text, e.g. 'dpo sanity check on tiny'")
    ] = None,
    algorithm: Annotated[
        str | None, Field(description="algorithm, recipe or YAML path (wins over the text)")
    ] = None,
    model: ModelArg = None,
    campaign: Annotated[
        str | None, Field(description="ledger slug, lowercase-with-hyphens (default <algo>-sanity)")
    ] = None,
    overrides: OverridesArg = [],  # noqa: B006 (pydantic copies defaults)
) -> Plan:
    return _call(
        "plan_experiment",
        "pass algorithm= explicitly (see list_recipes).",
        api.plan_experiment,
        request,
        algorithm,
        model,
        campaign,
        list(overrides),
    )


@server.tool(
    title="Shrink a config",
    annotations=READ_ONLY,
    description="Turn a recipe into a quick sanity-run config (smaller data, few steps, frequent "
    "logging; with model='tiny' also the offline built-in data) and validate it with the "
    "trainer's own config model. Returns the validated config, the diff from the shipped "
    "recipe and the expected number of steps. Use it before launch_run to check overrides; it "
    "writes nothing.",
)
def shrink_config(
    recipe: RecipeArg,
    model: ModelArg = None,
    overrides: OverridesArg = [],  # noqa: B006
) -> ShrinkResult:
    return _call(
        "shrink_config",
        "check the recipe name with list_recipes and the override keys in the message.",
        api.shrink_config,
        recipe,
        list(overrides),
        model=model,
    )


@server.tool(
    title="Estimate memory",
    annotations=READ_ONLY,
    description="Estimate the peak training memory of a recipe (shrunk by default) per component "
    "(weights, gradients, optimizer, activations, logits, reference/reward models, KV cache) and "
    "compare it with the memory free now on the device launch_run would use. Use it before every "
    "launch, and before starting a second job on a device that is already training.",
)
def estimate_memory(
    recipe: RecipeArg,
    model: ModelArg = None,
    overrides: OverridesArg = [],  # noqa: B006
    shrink: Annotated[
        bool, Field(description="estimate the shrunk sanity config (false: the full recipe)")
    ] = True,
    device: Annotated[
        Device, Field(description="auto (GPU if visible, else cpu), cpu, cuda or cuda:N")
    ] = "auto",
) -> MemoryCheck:
    return _call(
        "estimate_memory",
        "check the recipe and model names (list_recipes; model='tiny' works offline).",
        api.estimate_memory,
        recipe,
        model,
        list(overrides),
        shrink,
        device,
    )


@server.tool(
    title="Check resources",
    annotations=READ_ONLY,
    description="GPU memory (total/used/free) and which processes and lab runs hold each GPU, CPU "
    "count and load, free RAM. Use it before launching or when a run is slow. A machine without "
    "a GPU is a normal answer (gpus is empty and notes say why), not an error.",
)
def check_resources() -> Resources:
    return _call(
        "check_resources",
        "retry once; a machine without a GPU is an answer, not an error.",
        api.check_resources,
    )


@server.tool(
    title="Launch a run",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=True
    ),
    description="Start a training run in the background (a detached process that outlives this "
    "server) and return its run id at once; by default the recipe is shrunk to a sanity run. "
    "The run gets a folder under its dated campaign and a row in the campaign ledger. Use it "
    "after plan_experiment / shrink_config / estimate_memory. One training job per device: a "
    "busy device is refused unless queue=true (start after it) or force=true (only when "
    "estimate_memory says both fit).",
)
def launch_run(
    recipe: RecipeArg,
    overrides: OverridesArg = [],  # noqa: B006
    shrink: Annotated[
        bool, Field(description="shrink to a quick sanity run first (false: the full recipe)")
    ] = True,
    model: ModelArg = None,
    campaign: Annotated[
        str | None,
        Field(description="campaign slug (lowercase-with-hyphens); default <algorithm>-sanity"),
    ] = None,
    question: Annotated[
        str | None, Field(description="the question the campaign answers (new campaigns)")
    ] = None,
    device: Annotated[Device, Field(description="auto, cpu, cuda or cuda:N")] = "auto",
    queue: Annotated[bool, Field(description="queue behind the device's current job")] = False,
    force: Annotated[bool, Field(description="start even though the device is busy")] = False,
) -> LaunchRunResult:
    return _call(
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
    )


@server.tool(
    title="Run status",
    annotations=READ_ONLY,
    description="State (queued/starting/running/succeeded/failed/stopped/died), step/total, ETA, "
    "latest train and eval metrics, W&B URL and diagnosed alerts (OOM, NaN loss, stall, no "
    "reward contrast, repetition, flat learning, download failure) with a hint each. Use it to "
    "poll a launched run every 10-30 s; it returns at once.",
)
def run_status(run_id: RunIdArg) -> RunStatusResult:
    view = _call("run_status", "call list_runs to see the run ids.", api.run_status, run_id)
    return _clean(view)


@server.tool(
    title="Tail logs",
    annotations=READ_ONLY,
    description="Read a run's train.log (trainer stdout + stderr, progress bars folded). Without "
    "cursor: the last `lines` lines. With the cursor a previous call returned: only what was "
    "written since. Output is capped at max_bytes; pass the returned cursor to continue. Use it "
    "to watch a run for loss lines, W&B links, OOMs, download errors and stalls.",
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
) -> LogTail:
    return _call(
        "tail_logs",
        "call list_runs to see the run ids.",
        api.tail_logs,
        run_id,
        lines=lines,
        cursor=cursor,
        max_bytes=max_bytes,
    )


@server.tool(
    title="Get metrics",
    annotations=READ_ONLY,
    description="A run's metric series from metrics.jsonl (rows with step, phase, metrics), "
    "down-sampled evenly to max_points per phase (the last row is always kept). Use it to judge "
    "learning curves, e.g. keys=['accuracy','margins'] for DPO or ['avg_correctness'] for GRPO.",
)
def get_metrics(
    run_id: RunIdArg,
    keys: Annotated[
        list[str] | None, Field(description="metric names to keep (default: all)")
    ] = None,
    phase: Annotated[Phase | None, Field(description="only train, eval or rollout rows")] = None,
    max_points: Annotated[
        int, Field(ge=1, le=METRICS_MAX_POINTS, description="rows per phase after down-sampling")
    ] = 200,
) -> MetricsResult:
    series = _call(
        "get_metrics",
        "call list_runs to see the run ids.",
        api.get_metrics,
        run_id,
        keys,
        phase,
        max_points,
    )
    return _clean(series)


@server.tool(
    title="Stop a run",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
    ),
    description="Stop a running or queued run: SIGTERM to its process group (the trainer saves a "
    "checkpoint and writes outcome 'stopped'), SIGKILL after grace_s seconds. Use it for a run "
    "that is diverging, stalled or no longer needed; a finished run is returned unchanged.",
)
def stop_run(
    run_id: RunIdArg,
    grace_s: Annotated[
        float, Field(ge=0, le=STOP_MAX_GRACE_S, description="seconds between SIGTERM and SIGKILL")
    ] = 10.0,
) -> RunStatus:
    status = _call("stop_run", "call list_runs to see the run ids.", api.stop_run, run_id, grace_s)
    return _clean(status)


@server.tool(
    title="Resume a run",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
    ),
    description="Continue a died, stopped or failed run from its last checkpoint in the same run "
    "folder (model, optimizer, scheduler, RNG and data position restored; metrics rows after the "
    "checkpoint are dropped), detached like launch_run. Use it after a kill, an OOM fixed by "
    "freeing the device, or a stop you want to undo; poll run_status afterwards.",
)
def resume_run(
    run_id: RunIdArg,
    force: Annotated[bool, Field(description="start even if the device is busy")] = False,
) -> LaunchRunResult:
    result = _call(
        "resume_run",
        "call run_status: only a died, stopped or failed run with a checkpoint can be resumed.",
        api.resume_run_detached,
        run_id,
        force=force,
    )
    return _clean(result)


@server.tool(
    title="List runs",
    annotations=READ_ONLY,
    description="List runs (oldest first) with state, step and latest metrics, optionally of one "
    "campaign and/or in one state. Use it to find run ids, or state='running' to see what "
    "occupies the devices.",
)
def list_runs(
    campaign: Annotated[str | None, Field(description="campaign slug or dated name")] = None,
    state: Annotated[State | None, Field(description="only runs in this state")] = None,
    limit: Annotated[int, Field(ge=1, le=500, description="at most this many (newest)")] = 50,
) -> RunList:
    listed = _call(
        "list_runs",
        "call list_campaigns for campaign names.",
        api.run_list,
        campaign,
        state,
        limit,
    )
    return _clean(listed)


@server.tool(
    title="Compare runs",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    description="A comparison table of runs of ONE family by that family's rules: policy "
    "gradients avg_correctness/avg_format/avg_binary/loss and reward contrast; direct alignment "
    "held-out accuracy/margins/chosen and rejected rewards plus a sample each (loss scales "
    "differ across losses); reward models held-out margins/correctness, never training loss; "
    "rejection sampling each strategy beside its matched random control. Use it after "
    "record_results on every run of a sweep; with record_in the table is also written into "
    "that campaign's Comparison section (replacing the same set).",
)
def compare_runs(
    run_ids: Annotated[list[str], Field(min_length=1, description="run ids of one family")],
    record_in: Annotated[
        str | None, Field(description="campaign slug or name to record the table in")
    ] = None,
) -> Comparison:
    cmp = _call(
        "compare_runs", "call list_runs to see the run ids.", api.compare_runs, run_ids, record_in
    )
    return _clean(cmp)


@server.tool(
    title="Record results",
    annotations=ToolAnnotations(
        read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    ),
    description="Write (or refresh) a run's row in its campaign ledger: exact command, model, "
    "dataset, seed, config file, values changed from the shipped recipe, final/best metrics, "
    "failure mode, W&B link, sample excerpts and a plot. Use it when a run ends (any state), "
    "then report from the returned record or the ledger://<campaign> resource. Text written by "
    "hand outside the ledger's marker blocks is kept.",
)
def record_results(
    run_id: RunIdArg,
    note: Annotated[
        str | None, Field(description="one-line observation for the run's row (null keeps the old)")
    ] = None,
) -> RecordResult:
    rec = _call(
        "record_results", "call list_runs to see the run ids.", api.record_results, run_id, note
    )
    return _clean(rec)


@server.tool(
    title="List campaigns",
    annotations=READ_ONLY,
    description="List the experiment campaigns (dated ledgers), newest first, with status, "
    "question and run count. Use it to find a campaign to read (resource ledger://<campaign>) "
    "or to record a comparison in.",
)
def list_campaigns() -> CampaignList:
    return _call("list_campaigns", "read ledger://index.", api.list_campaigns)


TOOL_NAMES = (
    "resume_run",
    "list_recipes",
    "plan_experiment",
    "shrink_config",
    "estimate_memory",
    "check_resources",
    "launch_run",
    "run_status",
    "tail_logs",
    "get_metrics",
    "stop_run",
    "list_runs",
    "compare_runs",
    "record_results",
    "list_campaigns",
)

# tool -> the one lab API function it adapts (tests/lab/test_api_layer.py checks each exists)
TOOL_OPERATIONS: dict[str, str] = {
    "list_recipes": "list_recipes",
    "plan_experiment": "plan_experiment",
    "shrink_config": "shrink_config",
    "estimate_memory": "estimate_memory",
    "check_resources": "check_resources",
    "launch_run": "launch_run",
    "run_status": "run_status",
    "tail_logs": "tail_logs",
    "get_metrics": "get_metrics",
    "stop_run": "stop_run",
    "resume_run": "resume_run_detached",
    "list_runs": "run_list",
    "compare_runs": "compare_runs",
    "record_results": "record_results",
    "list_campaigns": "list_campaigns",
}

# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------


@server.resource(
    "ledger://index",
    name="ledger-index",
    title="Experiment index",
    description="experiments/README.md: every campaign with its status, question and run count",
    mime_type="text/markdown",
)
def ledger_index() -> str:
    try:
        return api.ledger_index_markdown()
    except LabError as err:
        raise ResourceError(render_error(err, "call list_campaigns.")) from None


@server.resource(
    "ledger://{campaign}",
    name="ledger-campaign",
    title="Campaign ledger",
    description="A campaign's markdown ledger (front matter, setup, runs, plots, comparison, "
    "observations); campaign = YYYY-MM-DD-<slug> or a slug (most recent campaign with it)",
    mime_type="text/markdown",
)
def ledger_campaign(campaign: str) -> str:
    try:
        return api.campaign_markdown(campaign)
    except LabError as err:
        raise ResourceNotFoundError(
            render_error(err, "read ledger://index or call list_campaigns for the campaign names.")
        ) from None


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------

_FAMILY_RULES = """\
Comparison rules by family (ALGORITHMS.md):
- policy gradients: avg_correctness, avg_format, avg_binary, loss, and whether sampled groups
  carry reward contrast (frac_reward_zero_std well below 1); the loss alone says little.
- direct alignment: accuracy, margins, chosen_rewards, rejected_rewards (eval/ versions) and
  sample generations; IPO's loss scale is not comparable to DPO's, so never compare losses.
- reward models: held-out margins or correctness scores (eval/accuracy, eval/reward_margin,
  eval/auroc, eval/step_accuracy vs eval/majority_baseline), never the training loss.
- rejection sampling: each reward-selected strategy beside its matched random control
  (top_per_prompt vs random_per_prompt, top_k_overall vs random_k_overall).
- sft: eval/loss and held-out samples at matched steps."""


def _acceptance(algorithm: str) -> str:
    return api.acceptance_text(algorithm)


@server.prompt(
    name="sanity_check",
    title="Sanity-check an algorithm",
    description="Run one short sanity experiment end to end with the rlhf-lab tools and report it",
)
def sanity_check(algorithm: str, model: str = "tiny", campaign: str = "") -> str:
    camp = f"campaign='{campaign}'" if campaign else "the default campaign (<algorithm>-sanity)"
    return f"""\
Run a short sanity experiment for {algorithm} on model '{model}' with the rlhf-lab tools, in
{camp}. One step at a time:

1. plan_experiment(algorithm='{algorithm}', model='{model}') — note the shrunk config, the
   expected steps, the metrics to watch and the acceptance criteria.
2. shrink_config(recipe='{algorithm}', model='{model}', overrides=[...]) — validate any change.
3. estimate_memory(...) with the same arguments — launch only if it fits. One training job per
   device unless this check says both fit.
4. launch_run(recipe='{algorithm}', model='{model}', ...) — it returns the run id at once.
5. Poll run_status(run_id) every 10-30 s; read new output with tail_logs(run_id, cursor=...)
   passing the cursor each call returns. Watch for loss/metric lines, the W&B link, OOMs,
   download errors (use model 'tiny' offline) and stalls (no new output for minutes).
6. When it ends (any state): record_results(run_id, note='<one-line observation>').
7. Report: the exact command, model, dataset, seed, config file, values changed from the shipped
   recipe, final metrics against the acceptance criteria, the failure mode if any, the W&B link,
   and one follow-up sweep worth running. The ledger is the resource ledger://<campaign>.

{_acceptance(algorithm)}
"""


@server.prompt(
    name="compare_algorithms",
    title="Compare algorithms",
    description="Compare several algorithms of one family with matched settings and the "
    "family's comparison rules",
)
def compare_algorithms(algorithms: str, model: str = "tiny", campaign: str = "") -> str:
    names = [a.strip() for a in algorithms.replace(" ", ",").split(",") if a.strip()]
    listed = ", ".join(names) or algorithms
    camp = campaign or "-vs-".join(n.replace("_", "-") for n in names)[:60] or "comparison"
    criteria = "\n\n".join(_acceptance(n) for n in names)
    return f"""\
Compare {listed} on model '{model}' with matched settings, in campaign '{camp}'.

1. plan_experiment(request='compare {" and ".join(names)}', model='{model}',
   campaign='{camp}'). Use the SAME overrides, seed and shrink for every run: only the
   algorithm may differ.
2. estimate_memory for each recipe. Launch them one after another with launch_run(...,
   campaign='{camp}', queue=true) so the device runs one job at a time (queue=false with
   force=true only if the memory check says they fit together).
3. Poll run_status for each run; tail_logs(cursor=...) when something looks wrong.
4. record_results for every run (any final state), then
   compare_runs(run_ids=[...], record_in='{camp}').
5. Report the table with the family's rules below, which runs met the acceptance criteria, the
   failure modes, and a follow-up sweep (e.g. a learning-rate or beta sweep for the winner,
   or more seeds where the gap is small).

{_FAMILY_RULES}

{criteria}
"""


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def check_bind_host(host: str, allow_remote: bool = False) -> str:
    """Return ``host`` if serving HTTP on it is allowed: loopback always, anything else only
    with ``allow_remote``. Raises InvalidArgument otherwise (the serving flags are the CLI's
    ``rlhf-lab mcp`` options, so its message names them)."""
    name = (host or "").strip()
    if not name:
        raise InvalidArgument("--host is empty; use 127.0.0.1")
    loopback = name == "localhost"
    if not loopback:
        try:
            loopback = ipaddress.ip_address(name.strip("[]")).is_loopback
        except ValueError:
            loopback = False
    if not loopback and not allow_remote:
        raise InvalidArgument(
            f"refusing to serve on {name!r}: the lab server can launch and stop training jobs, "
            "so it only listens on loopback (127.0.0.1, ::1, localhost) by default. Pass "
            "--allow-remote to expose it anyway (no authentication; use a trusted network or "
            "an SSH tunnel instead)"
        )
    return name


def _configure_logging() -> None:
    """Everything the lab logs goes to stderr (stdout is the protocol channel in stdio mode)."""
    root = logging.getLogger()
    for handler in root.handlers:
        stream = getattr(handler, "stream", None)
        if stream is sys.stdout:  # pragma: no cover - the SDK's handler already uses stderr
            handler.setStream(sys.stderr)
    if not root.handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    logging.getLogger("rlhf_lab").setLevel(logging.INFO)


def _serve_http(host: str, port: int) -> None:
    """Streamable HTTP at http://<host>:<port>/mcp. Like ``server.run("streamable-http")``, but
    uvicorn's access log goes to stderr too (its default is stdout)."""
    import copy

    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    log_config = copy.deepcopy(LOGGING_CONFIG)
    for handler in log_config["handlers"].values():
        handler["stream"] = "ext://sys.stderr"
    bind = host.strip("[]")
    app = server.streamable_http_app(host=bind)  # DNS-rebinding protection on loopback hosts
    log.info("rlhf-lab MCP server on http://%s:%s/mcp", host, port)
    uvicorn.run(app, host=bind, port=port, log_level="info", log_config=log_config)


def main(
    http: bool = False,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    allow_remote: bool = False,
) -> None:
    """Serve over stdio (default) or streamable HTTP at http://<host>:<port>/mcp."""
    _configure_logging()
    if http:
        host = check_bind_host(host, allow_remote)  # the checked, stripped name is served
        if not 0 < port < 65536:
            raise InvalidArgument(f"bad --port {port}: use 1-65535")
        if allow_remote:
            log.warning("serving rlhf-lab on %s:%s without authentication", host, port)
        _serve_http(host, port)
    else:
        server.run()


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlhf_lab.mcp_server", description=main.__doc__)
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--allow-remote", action="store_true")
    args = parser.parse_args(argv)
    try:
        main(http=args.http, host=args.host, port=args.port, allow_remote=args.allow_remote)
    except LabError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
