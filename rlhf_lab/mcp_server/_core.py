"""The MCP server object and how any failure of a tool becomes the tool error its caller reads,
in one place (:meth:`LabServer.call_tool`): a malformed argument as one line per argument, a lab
error as its message and its next steps rendered as tool calls (:func:`render_step`), anything
else as a bug report. Torch-free.

What every client sees is kept small (:class:`LabServer`; tests/mcp/test_output_sizes.py):
tools/list advertises input schemas without pydantic's titles and output schemas cut to their
top-level fields and types (nested models typed ``object``, no descriptions: the results carry
their fields, the docs describe them), a result's text is its compact JSON (not indented), an
argument the SDK rejects reads ``argument `x`: got ...; expected ...`` (no pydantic wording, no
URL), and resources/list names each campaign's ledger.
"""

import copy
import json
import logging
import math
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, Resource, TextContent
from pydantic import BaseModel, ValidationError

from rlhf_lab import api
from rlhf_lab.api.operations import OPERATIONS, operation_named
from rlhf_lab.errors import LabError, NextStep

SERVER_NAME = "rlhf-lab"
DEFAULT_PORT = 8765
LISTED_CAMPAIGNS = 100  # resources/list names this many campaign ledgers (newest first)

log = logging.getLogger("rlhf_lab.mcp")

INSTRUCTIONS = """\
rlhf-lab runs small RLHF experiments (SFT, reward models, DPO-style direct alignment, policy
gradients, rejection sampling) and records them in dated markdown ledgers.
Workflow: plan_experiment -> shrink_config -> estimate_memory -> launch_run (returns at once) ->
poll run_status every 10-30 s and read new output with tail_logs(cursor=...) -> record_results ->
report from the ledger (resource ledger://{campaign}). One training job per device unless
estimate_memory says both fit. Without Hugging Face access use model="tiny".
"""


# ---------------------------------------------------------------------------------------------
# What the client sees: compact schemas, compact results, readable argument errors
# ---------------------------------------------------------------------------------------------


def _without_titles(schema: Any) -> Any:
    """``schema`` without pydantic's generated ``title`` strings (a property named "title" is a
    dict under ``properties`` and stays) and without ``"default": null`` (an argument left out
    is null already)."""
    if isinstance(schema, dict):
        return {
            k: _without_titles(v)
            for k, v in schema.items()
            if not (k == "title" and isinstance(v, str)) and not (k == "default" and v is None)
        }
    if isinstance(schema, list):
        return [_without_titles(v) for v in schema]
    return schema


# what an output schema leaves out: the result shows its fields; the docs and the API's models
# describe them (clients send input schemas to the model, not output schemas)
_DROPPED = frozenset(
    {"title", "description", "default", "examples", "$defs", "required", "enum", "pattern"}
)


def compact_output_schema(schema: dict[str, Any], depth: int = 1) -> dict[str, Any]:
    """An output schema that lists ``depth`` levels of fields: the top-level fields keep their
    types; a model nested below them is typed ``object`` (an array of them ``array``
    of ``object``) without its fields, which the result itself shows. ``$ref``s are inlined;
    titles, descriptions, defaults, enums, patterns and ``required`` dropped. Every value the full schema
    accepts, the compact one accepts too (it only says less)."""
    defs = schema.get("$defs", {})

    def node(s: dict[str, Any], level: int) -> dict[str, Any]:
        ref = s.get("$ref")
        if isinstance(ref, str):
            target = defs.get(ref.rsplit("/", 1)[-1], {})
            s = {**target, **{k: v for k, v in s.items() if k != "$ref"}}
        if 0 < level and level >= depth and "properties" in s:  # a nested model: its fields go
            return {"type": "object"}
        out: dict[str, Any] = {}
        for key, value in s.items():
            if key in _DROPPED or (key == "additionalProperties" and value is True):
                continue  # (additionalProperties: true is JSON Schema's default)
            if key == "properties":
                out[key] = {name: node(p, level + 1) for name, p in value.items()}
            elif key in ("anyOf", "oneOf", "allOf"):  # (no `type` arrays: less portable)
                out[key] = [node(x, level) for x in value]
            elif key == "items" and isinstance(value, dict):
                out[key] = node(value, level)
            elif key == "additionalProperties" and isinstance(value, dict):
                out[key] = node(value, level + 1)
            else:
                out[key] = value
        return out

    return node(schema, 0)


def reply(model: BaseModel) -> CallToolResult:
    """A tool's result: its fields (non-finite floats as null) as structured content, and the
    same as one line of compact JSON for clients that read only the text."""
    text = json.dumps(
        _finite(model.model_dump()), ensure_ascii=False, separators=(",", ":"), default=str
    )
    data = json.loads(text)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


class LabServer(MCPServer):
    """The SDK's server with the lab's surface rules (see the module docstring)."""

    _compact_tools: dict[str, Any] | None = None

    async def list_tools(self):  # type: ignore[override]
        tools = await super().list_tools()
        if self._compact_tools is None or set(self._compact_tools) != {t.name for t in tools}:
            self._compact_tools = {
                t.name: t.model_copy(
                    update={
                        "input_schema": _without_titles(t.input_schema),
                        "output_schema": (
                            compact_output_schema(t.output_schema) if t.output_schema else None
                        ),
                    }
                )
                for t in tools
            }
        return [copy.copy(self._compact_tools[t.name]) for t in tools]

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            raise await self._tool_error(name, exc) from exc.__cause__

    async def _tool_error(self, name: str, exc: ToolError) -> ToolError:
        """What the caller of tool ``name`` reads when it failed with ``exc`` (the SDK's error,
        whose cause is what the arguments' validation or the tool raised)."""
        cause = exc.__cause__
        if type(exc) is ToolError and isinstance(cause, ValidationError):  # the arguments
            errors = cause.errors(include_url=False)
            raised = api.raised_lab_error(errors)  # e.g. an override that is no key=value
            if raised is not None:
                return ToolError(f"Error executing tool {name}: {_rendered(raised, name)}")
            schemas = {t.name: t.input_schema for t in await super().list_tools()}
            properties = (schemas.get(name) or {}).get("properties") or {}
            text = api.argument_errors_text(errors, properties)
            return ToolError(
                f"{text}\nNext: call {name} again with the argument fixed (see its input schema)"
            )
        if isinstance(cause, LabError):
            return ToolError(f"Error executing tool {name}: {_rendered(cause, name)}")
        if cause is None or type(exc) is ToolError:  # the SDK's own (an unknown tool)
            return exc
        # a bug, not the caller's mistake: say so, keep the traceback local
        log.error("tool %s failed unexpectedly", name, exc_info=cause)
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        return ToolError(
            f"Error executing tool {name}: unexpected {type(cause).__name__} in {name}: {first}"
            "\nNext: this is a bug in rlhf-lab, not in the request; the server's stderr log has "
            "the traceback. Retry once; if it fails again, report it with that log."
        )

    async def list_resources(self) -> list[Resource]:
        """The static resources, then each campaign's ledger (newest first, at most
        :data:`LISTED_CAMPAIGNS`; ``ledger://index`` lists them all)."""
        listed = await super().list_resources()
        try:
            campaigns = api.list_campaigns(limit=LISTED_CAMPAIGNS).campaigns
        except LabError:  # an unreadable ledger folder must not hide the static resources
            return listed
        for camp in campaigns:
            listed.append(
                Resource(
                    uri=f"ledger://{camp.id}",
                    name=f"ledger-{camp.id}",
                    title=f"Campaign {camp.id}",
                    description=f"{camp.status}: {camp.question}"[:200],
                    mime_type="text/markdown",
                )
            )
        return listed


server = LabServer(SERVER_NAME, instructions=INSTRUCTIONS, version=api.LAB_VERSION)


# ---------------------------------------------------------------------------------------------
# Errors: a LabError's next steps rendered as tool calls
# ---------------------------------------------------------------------------------------------

# lab operation -> (the tool that performs it, the tool's argument names): a tool per row of the
# API's operation table, whose argument names are the API's, so a next step's arguments pass
# through unrenamed; an operation or argument missing here cannot be rendered
# (tests/mcp/test_error_rendering.py walks them all).
MCP_OPERATIONS: dict[str, tuple[str, frozenset[str]]] = {
    op.name: (op.name, frozenset(op.fields())) for op in OPERATIONS
}
# operations with no tool of their own, done through another tool: operation -> (the tool, how the
# operation's argument names map to the tool's)
MCP_INDIRECT_OPERATIONS: dict[str, tuple[str, dict[str, str]]] = {
    "create_campaign": ("launch_run", {"slug": "campaign"}),  # launching names the campaign
    "list_pipelines": ("list_recipes", {}),  # its result lists the pipelines too
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


def _rendered(err: LabError, tool: str) -> str:
    """A lab error as tool ``tool`` reports it: its own next steps, else the tool's hint."""
    return render_error(err, operation_named(tool).hint)


def render_error(err: LabError, default_next: str) -> str:
    """The error's message and its next steps as tool calls; ``default_next`` when the error
    names none."""
    if err.next_steps:
        return err.render(render_step)
    return f"{err.message}\nNext: {default_next}"


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
