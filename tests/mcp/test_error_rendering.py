"""Typed errors per surface: every NextStep the lab can raise renders on the CLI as a command and
on the MCP server as a tool call; each surface names only its own syntax (the CLI never an MCP
tool, the MCP server never a CLI flag or command), checked on real errors."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest
from mcp import Client
from typer.testing import CliRunner

from rlhf_lab import api, cli, mcp_server
from rlhf_lab.errors import Conflict, InvalidArgument, LabError, NextStep
from tests.conftest import live_run_on
from tests.mcp._fixtures import asyncio_backend, fresh_lab  # noqa: F401  (pytest fixtures)

ROOT = Path(__file__).resolve().parents[2]
MISSING = "dpo-20990101-000000-dead"
HOLDER = "dpo-20260301-110000-cccc"
QUICK = ["data.max_samples=64", "train.batch_size=8", "train.max_steps=4"]
# a CLI flag (`--queue`, `-n 5`) or an `rlhf-lab <command>` line
CLI_SYNTAX = re.compile(r"(?<![\w-])--?[a-z][\w-]*|rlhf-lab [a-z]")
# an MCP tool or a lab operation name (they share the snake_case names)
MCP_NAMES = re.compile(
    "|".join(sorted({*mcp_server.TOOL_NAMES, *mcp_server.MCP_OPERATIONS}, key=len, reverse=True))
)

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("lab_root")]


# ---------------------------------------------------------------- every NextStep in the source


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return "value"  # a computed value: any value renders the same way


def steps_in_source() -> list[tuple[str, NextStep]]:
    """Every ``NextStep("operation", {...})`` written under rlhf_lab/, as (where, step)."""
    found = []
    for path in sorted((ROOT / "rlhf_lab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "NextStep"):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert node.args and isinstance(node.args[0], ast.Constant), (
                f"{where}: name the operation with a string literal so this test can check it"
            )
            args_node = node.args[1] if len(node.args) > 1 else None
            for kw in node.keywords:
                if kw.arg == "args":
                    args_node = kw.value
            args = {}
            if isinstance(args_node, ast.Dict):
                args = {
                    _literal(k): _literal(v)
                    for k, v in zip(args_node.keys, args_node.values, strict=True)
                }
            found.append((where, NextStep(node.args[0].value, args)))
    return found


def test_every_next_step_in_the_lab_renders_on_both_surfaces():
    steps = steps_in_source()
    operations = {s.operation for _, s in steps}
    assert {"list_recipes", "launch_run", "run_status", "shrink_config"} <= operations
    for where, step in steps:
        for render in (cli.render_step, mcp_server.render_step):
            try:
                render(step)
            except KeyError as err:
                pytest.fail(f"{where}: {render.__module__} cannot render {step}: {err}")


def test_an_operation_or_argument_without_a_rendering_is_refused():
    for render in (cli.render_step, mcp_server.render_step):
        with pytest.raises(KeyError):
            render(NextStep("no_such_operation"))
        with pytest.raises(KeyError):
            render(NextStep("run_status", {"no_such_argument": 1}))


# ------------------------------------------------------------------------ the renderings


def test_cli_renders_steps_as_commands():
    assert cli.render_step(NextStep("resume_run", {"run_id": "x"})) == "`rlhf-lab resume x`"
    assert (
        cli.render_step(NextStep("launch_run", {"queue": True})) == "`rlhf-lab launch ... --queue`"
    )
    assert (
        cli.render_step(NextStep("launch_run", {"recipe": "dpo", "overrides": ["a=1", "b=2"]}))
        == "`rlhf-lab launch dpo --set a=1 --set b=2`"
    )
    assert (
        cli.render_step(NextStep("show_campaign", {"campaign": "c"}))
        == "`rlhf-lab campaign show c`"
    )
    assert cli.render_step(NextStep("list_runs", note="all of them")) == (
        "`rlhf-lab runs` (all of them)"
    )
    assert cli.render_step(NextStep("compare_runs", {"run_ids": ["a", "b"]})) == (
        "`rlhf-lab compare a b`"
    )


def test_mcp_renders_steps_as_tool_calls():
    assert mcp_server.render_step(NextStep("resume_run", {"run_id": "x"})) == (
        'resume_run(run_id="x")'
    )
    assert mcp_server.render_step(NextStep("launch_run", {"queue": True})) == (
        "launch_run(queue=true)"
    )
    assert mcp_server.render_step(NextStep("list_runs", note="all of them")) == (
        "list_runs() (all of them)"
    )
    assert mcp_server.render_step(NextStep("show_campaign", {"campaign": "c"})) == (
        "read ledger://c"
    )


def test_the_cli_table_names_real_commands_and_options():
    commands = {}
    for info in cli.app.registered_commands:
        commands[info.name or info.callback.__name__.replace("_", "-")] = info.callback
    for group in cli.app.registered_groups:
        for info in group.typer_instance.registered_commands:
            commands[f"{group.name} {info.name}"] = info.callback
    import typer.main

    click_app = typer.main.get_command(cli.app)
    for operation, command in cli.CLI_OPERATIONS.items():
        assert command.words in commands, f"{operation}: no command {command.words!r}"
        click_cmd = click_app
        for word in command.words.split():
            click_cmd = click_cmd.commands[word]
        options = {opt for p in click_cmd.params for opt in p.opts}
        for flag in command.flags.values():
            assert flag in options, f"{operation}: {command.words} has no {flag}"


async def test_the_mcp_table_names_real_tools_and_arguments():
    async with Client(mcp_server.server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    for operation, (tool, args) in mcp_server.MCP_OPERATIONS.items():
        assert tool in tools, f"{operation}: no tool {tool!r}"
        assert args == set(tools[tool].input_schema.get("properties", {})), operation


def test_error_line_is_one_line_with_the_steps():
    err = Conflict("device cpu is busy", next=[NextStep("launch_run", {"queue": True})])
    line = cli.error_line(err)
    assert line == "error: device cpu is busy (next: `rlhf-lab launch ... --queue`)"
    assert cli.error_line(InvalidArgument("bad\nthing")) == "error: bad thing"


def test_with_next_keeps_an_errors_own_steps_and_kind():
    own = NextStep("list_runs")
    err = Conflict("x", next=own)
    assert err.with_next(NextStep("list_recipes")) is err
    bare = LabError("y", kind="not_found").with_next(NextStep("list_runs"))
    assert bare.kind == "not_found" and bare.next_steps == (own,)


# --------------------------------------------------------------------------- real errors


def _busy_cpu(lab_root: Path, machine) -> subprocess.Popen:
    """A run that holds the CPU now (a live process), and no room beside it."""
    api.create_campaign("busy-holder", "Who holds the CPU?")
    campaign = api.experiments_dir() / api.campaign_name("busy-holder")
    holder = live_run_on(campaign / "runs" / HOLDER, "cpu")
    machine(free_ram_gb=0.001)
    return holder


CASES = {
    "unknown recipe": (["launch", "dpoo", "--model", "tiny"], ("launch_run", {"recipe": "dpoo"})),
    "unknown run id": (["status", MISSING], ("run_status", {"run_id": MISSING})),
    "bad slug": (
        ["launch", "dpo", "--model", "tiny", "--campaign", "Not A Slug"],
        ("launch_run", {"recipe": "dpo", "model": "tiny", "campaign": "Not A Slug"}),
    ),
    "busy device": (
        [
            "launch",
            "dpo",
            "--model",
            "tiny",
            "--device",
            "cpu",
            *sum((["--set", o] for o in QUICK), []),
        ],
        ("launch_run", {"recipe": "dpo", "model": "tiny", "device": "cpu", "overrides": QUICK}),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_errors_name_no_mcp_tool(case, lab_root, machine):
    holder = _busy_cpu(lab_root, machine) if case == "busy device" else None
    try:
        result = CliRunner().invoke(cli.app, CASES[case][0])
    finally:
        if holder:
            holder.kill()
            holder.wait()
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not MCP_NAMES.search(lines[0]), lines[0]
    if case == "busy device":
        assert HOLDER in lines[0] and "`rlhf-lab launch ... --queue`" in lines[0]
        assert f"`rlhf-lab status {HOLDER}`" in lines[0]


@pytest.mark.parametrize(
    "case",
    sorted(CASES),
)
async def test_mcp_errors_name_no_cli_flag_or_command(case, lab_root, machine):
    holder = _busy_cpu(lab_root, machine) if case == "busy device" else None
    tool, args = CASES[case][1]
    try:
        async with Client(mcp_server.server) as client:
            result = await client.call_tool(tool, args)
    finally:
        if holder:
            holder.kill()
            holder.wait()
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    assert result.is_error and "Next:" in text, text
    assert not CLI_SYNTAX.search(text), text
    if case == "busy device":
        assert "launch_run(queue=true)" in text and f'run_status(run_id="{HOLDER}")' in text


def test_the_refused_busy_launch_is_a_typed_conflict(lab_root, machine):
    holder = _busy_cpu(lab_root, machine)
    try:
        with pytest.raises(Conflict) as err:
            api.launch(api.RunRequest(recipe="dpo", overrides=QUICK, model="tiny", device="cpu"))
    finally:
        holder.kill()
        holder.wait()
    assert err.value.kind == "conflict" and HOLDER in err.value.message
    assert [s.operation for s in err.value.next_steps] == ["run_status", "launch_run", "launch_run"]
    assert [p.name for p in lab_root.glob("experiments/*/runs/*")] == [HOLDER], "nothing written"


async def test_a_bug_is_reported_as_such_without_cli_syntax(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(api, "list_campaigns", boom)
    async with Client(mcp_server.server) as client:
        result = await client.call_tool("list_campaigns", {})
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    assert result.is_error and "bug in rlhf-lab" in text and "disk on fire" in text
    assert not CLI_SYNTAX.search(text), text
