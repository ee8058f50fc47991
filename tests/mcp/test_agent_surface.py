"""What a real MCP client (the Inspector, Claude Code) saw as defects of the surface, each pinned:
argument errors in the caller's terms (one line per argument, no pydantic wording or URL), no
CLI flag in any text the lab can send to an MCP client, one typed ConfigChange shape, prompt
arguments described, each campaign ledger listed as a resource, and skills that read
``ledger://`` allowed to use Claude Code's resource tools."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from rlhf_lab import api
from rlhf_lab.ledger.schema import RunRecord
from rlhf_lab.mcp_server import TOOL_NAMES
from rlhf_lab.planning.configs import ConfigChange
from rlhf_lab.skills import parse_skill
from tests.mcp._fixtures import asyncio_backend, fresh_lab, in_memory_client  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("lab_root")]

ROOT = Path(__file__).resolve().parents[2]


async def _error_text(client, tool: str, args: dict) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error, f"{tool}({args}) did not fail"
    return "\n".join(c.text for c in result.content if getattr(c, "text", None))


# ------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    ("tool", "args", "line"),
    [
        (
            "list_runs",
            {"state": "exploded"},
            'argument `state`: got "exploded"; expected one of "queued", "starting", "running"',
        ),
        (
            "get_metrics",
            {"run_id": "dpo-1", "max_points": "many"},
            'argument `max_points`: got "many"; expected an integer from 1 to 2000 or null',
        ),
        ("run_status", {}, "argument `run_id`: missing (required); expected a string"),
        (
            "shrink_config",
            {"recipe": "dpo", "overrides": ["a=1", 3]},
            "argument `overrides[1]`: got 3; expected a string",
        ),
        (
            "tail_logs",
            {"run_id": "dpo-1", "lines": 0},
            "argument `lines`: got 0 (input should be greater than or equal to 1); expected an "
            "integer from 1 to 2000",
        ),
        (
            "estimate_memory",
            {"recipe": "dpo", "device": "tpu"},
            'argument `device`: got "tpu"; expected one of "auto", "cpu", "cuda" or a string '
            "matching ^cuda:\\d{1,3}$",
        ),
    ],
)
async def test_argument_errors_name_the_argument_and_the_expected_type(client, tool, args, line):
    text = await _error_text(client, tool, args)
    first, _, rest = text.partition("\n")
    assert first.startswith(line), text
    assert "pydantic" not in text and "http" not in text and "validation error" not in text
    assert "Input should" not in first and "type=" not in text
    assert rest.startswith("Next: call " + tool), text


async def test_two_bad_arguments_are_two_lines(client):
    text = await _error_text(client, "list_runs", {"state": "x", "limit": "all"})
    lines = text.splitlines()
    assert [ln.split(":")[0] for ln in lines[:2]] == ["argument `state`", "argument `limit`"]


# ---------------------------------------------------------------- no CLI syntax on MCP

# a CLI flag (`--queue`) or an `rlhf-lab <command>` line
CLI_SYNTAX = re.compile(
    r"(?<![\w-])--[a-z][\w-]*|`rlhf-lab [a-z]|rlhf-lab (?:launch|resume|status|tail)\b"
)
BARE_FLAG = re.compile(r"^--[a-z][\w-]*$")  # an argv element (the plan's command builder)
# text that names a shell command on purpose, on both surfaces
SHELL_ON_PURPOSE = ("`uv run rlhf-lab models pull", "`py-spy dump --pid")
# where CLI syntax belongs: the CLI itself, the serving flags of `rlhf-lab mcp`, the queue
# worker's and the demo's own output, the .mcp.json entry, the trainer's argv
CLI_ONLY = {
    "rlhf_lab/cli/__init__.py",
    "rlhf_lab/cli/commands.py",
    "rlhf_lab/cli/experiments.py",
    "rlhf_lab/cli/watching.py",
    "rlhf_lab/cli/campaigns.py",
    "rlhf_lab/cli/admin.py",
    "rlhf_lab/cli/fast.py",
    "rlhf_lab/cli/steps.py",
    "rlhf_lab/mcp_server/__init__.py",
    "rlhf_lab/_queue.py",
    "rlhf_lab/demo.py",
    "rlhf_lab/skills.py",
    "rlhf_lab/planning/families.py",
    "rlhf_lab/runs/launcher.py",
    "rlhf_lab/runs/slurm.py",  # the Slurm job script is shell text
}


def _strings(tree: ast.AST) -> list[ast.Constant]:
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_no_message_of_the_lab_names_a_cli_flag():
    """Errors, hints, notes, warnings and descriptions reach MCP clients as they are: they name
    operations through NextStep (each surface renders its own) or use neutral words."""
    found = []
    for path in sorted((ROOT / "rlhf_lab").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel in CLI_ONLY:
            continue
        for node in _strings(ast.parse(path.read_text())):
            text = node.value
            for allowed in SHELL_ON_PURPOSE:
                text = text.replace(allowed, "")
            if BARE_FLAG.match(text) or not CLI_SYNTAX.search(text):
                continue
            found.append(f"{rel}:{node.lineno}: {node.value[:80]!r}")
    assert not found, "\n".join(found)


async def test_mcp_texts_of_a_plan_and_a_shrink_name_no_cli_flag(client):
    """The plan's prose (warnings, notes, offline choices, steps) is neutral; only its commands
    are shell commands."""
    plan = (
        await client.call_tool("plan_experiment", {"request": "grpo on tiny", "model": "x/nope"})
    ).structured_content
    prose = plan["warnings"] + plan["notes"] + plan["offline_choices"] + plan["steps"]
    assert prose and not [p for p in prose if CLI_SYNTAX.search(p.replace(SHELL_ON_PURPOSE[0], ""))]
    text = await _error_text(
        client, "shrink_config", {"recipe": "dpo", "overrides": ["train.lerning_rate=1"]}
    )
    assert "lerning_rate" in text and not CLI_SYNTAX.search(text), text


# ------------------------------------------------------------------------- one ConfigChange


def test_config_change_is_one_typed_shape():
    from rlhf_lab.planning.plan import PlannedRun
    from rlhf_lab.planning.shrink import ShrinkResult

    for model, field in ((ShrinkResult, "diff"), (PlannedRun, "changes"), (RunRecord, "changes")):
        assert model.model_fields[field].annotation == list[ConfigChange], model
    schema = ConfigChange.model_json_schema()
    assert set(schema["properties"]) == {"key", "shipped", "used"}
    for name in ("shipped", "used"):
        branches = schema["properties"][name]["anyOf"]
        assert all(b.get("type") for b in branches), branches  # every branch typed (no `{}`)
        assert {b["type"] for b in branches} >= {"string", "integer", "number", "boolean", "null"}
    change = api.shrink_config("dpo", [], model="tiny").diff[0]
    assert set(change.model_dump()) == {"key", "shipped", "used"}


# ------------------------------------------------------------------ prompts and resources


async def test_prompt_arguments_are_described(client):
    for prompt in (await client.list_prompts()).prompts:
        for argument in prompt.arguments:
            assert argument.description and len(argument.description) > 10, (
                prompt.name,
                argument.name,
            )


async def test_each_campaign_ledger_is_a_listed_resource(client):
    before = {str(r.uri) for r in (await client.list_resources()).resources}
    assert before == {"ledger://index"}
    made = [api.create_campaign(slug, f"Q {slug}?") for slug in ("first-camp", "second-camp")]
    listed = {str(r.uri): r for r in (await client.list_resources()).resources}
    for camp in made:
        resource = listed[f"ledger://{camp.id}"]
        assert resource.mime_type == "text/markdown" and camp.question in resource.description
        read = await client.read_resource(f"ledger://{camp.id}")
        assert f"id: {camp.id}" in read.contents[0].text


# ----------------------------------------------------------------------------------- skills

# Claude Code's own tool names that a skill may allow (its MCP resource tools among them)
CLAUDE_CODE_TOOLS = {
    "Read",
    "Edit",
    "Write",
    "Grep",
    "Glob",
    "ListMcpResourcesTool",
    "ReadMcpResourceTool",
}


@pytest.mark.parametrize(
    "skill", sorted(p.parent.name for p in (ROOT / "skills").glob("*/SKILL.md"))
)
def test_skills_allow_the_tools_their_text_uses(skill):
    path = ROOT / "skills" / skill / "SKILL.md"
    allowed = parse_skill(path).allowed_tools
    for tool in allowed:
        if tool.startswith("mcp__rlhf-lab__"):
            assert tool.removeprefix("mcp__rlhf-lab__") in TOOL_NAMES, tool
        elif not tool.startswith("Bash("):
            assert tool in CLAUDE_CODE_TOOLS, tool
    text = path.read_text()
    if "ledger://" in text:  # reading a resource needs Claude Code's resource tools
        assert {"ListMcpResourcesTool", "ReadMcpResourceTool"} <= set(allowed), allowed
    for name in re.findall(r"\b(" + "|".join(TOOL_NAMES) + r")\(", text):
        assert f"mcp__rlhf-lab__{name}" in allowed, name
    json.dumps(allowed)
