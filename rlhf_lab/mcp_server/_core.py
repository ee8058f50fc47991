"""The MCP server object, its shared argument types, and how a lab error becomes a tool error:
the message, then its next steps rendered as tool calls (:func:`render_step`). Torch-free."""

import json
import logging
import math
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from rlhf_lab import api
from rlhf_lab.errors import LabError, NextStep

SERVER_NAME = "rlhf-lab"
DEFAULT_PORT = 8765
TAIL_MAX_BYTES = 64_000
METRICS_MAX_POINTS = 2_000
STOP_MAX_GRACE_S = 600.0

log = logging.getLogger("rlhf_lab.mcp")

Family = Literal[
    "direct_alignment", "policy_gradients", "reward_models", "rejection_sampling", "sft"
]
State = Literal["queued", "starting", "running", "succeeded", "failed", "stopped", "killed", "died"]
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
# operations with no tool of their own, done through another tool: operation -> (the tool, how the
# operation's argument names map to the tool's)
MCP_INDIRECT_OPERATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "create_campaign": ("launch_run", {"slug": "campaign"}),  # launching names the campaign
}
# operations only the shell offers (no MCP tool does them): operation -> the command template
MCP_SHELL_OPERATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "pull_model": ("uv run rlhf-lab models pull {name}", ("name",)),
    "list_models": ("uv run rlhf-lab models list", ()),
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
    if step.operation in MCP_INDIRECT_OPERATIONS:
        tool, renames = MCP_INDIRECT_OPERATIONS[step.operation]
        unknown = set(step.args) - set(renames)
        if unknown:
            raise KeyError(f"{step.operation}: no MCP rendering for {sorted(unknown)}")
        inner = ", ".join(f"{renames[k]}={_json_value(v)}" for k, v in step.args.items())
        text = f"{tool}({inner})"
    elif step.operation in MCP_SHELL_OPERATIONS:
        template, names = MCP_SHELL_OPERATIONS[step.operation]
        unknown = set(step.args) - set(names)
        if unknown:
            raise KeyError(f"{step.operation}: no MCP rendering for {sorted(unknown)}")
        values = {n: step.args.get(n, f"<{n}>") for n in names}
        text = "in a shell (no tool does this): " + template.format(**values)
    elif step.operation in MCP_RESOURCE_OPERATIONS:
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
            "rlhf-lab, not in the request; the server's stderr log has the traceback. Retry once; "
            "if it fails again, report it with that log."
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
