"""One entry point: every CLI command and every MCP tool is an adapter over ONE function of
rlhf_lab.api. Each is called here with that function replaced by a stub that refuses with a
sentinel error: the sentinel must come back through the surface (so the table is the truth)."""

from __future__ import annotations

import ast

import pytest
import typer.main
from mcp import Client
from typer.testing import CliRunner

from rlhf_lab import api, cli, mcp_server
from rlhf_lab.errors import InvalidArgument
from tests._helpers.imports import python_output

RUN = "dpo-20260101-120000-ab12"

# a minimal valid command line per command
CLI_ARGV: dict[str, list[str]] = {
    "recipes": ["recipes"],
    "plan": ["plan", "dpo sanity check"],
    "shrink": ["shrink", "dpo"],
    "launch": ["launch", "dpo"],
    "pipeline": ["pipeline", "rlhf"],
    "sweep": ["sweep", "dpo,ipo"],
    "status": ["status", RUN],
    "runs": ["runs"],
    "tail": ["tail", RUN],
    "metrics": ["metrics", RUN],
    "stop": ["stop", RUN],
    "resume": ["resume", RUN],
    "record": ["record", RUN],
    "compare": ["compare", RUN],
    "eval": ["eval", RUN],
    "campaign new": ["campaign", "new", "x", "--question", "q"],
    "campaign show": ["campaign", "show", "x"],
    "campaign list": ["campaign", "list"],
    "query": ["query", "--where", "state=died"],
    "index rebuild": ["index", "rebuild"],
    "gpu": ["gpu"],
    "models list": ["models", "list"],
    "models pull": ["models", "pull", "tiny"],
    "demo": ["demo"],
    "skills install": ["skills", "install"],
}
# a minimal valid argument set per tool
MCP_ARGS: dict[str, dict] = {
    "list_recipes": {},
    "plan_experiment": {"request": "dpo sanity check"},
    "shrink_config": {"recipe": "dpo"},
    "estimate_memory": {"recipe": "dpo"},
    "check_resources": {},
    "launch_run": {"recipe": "dpo"},
    "run_pipeline": {"name": "rlhf"},
    "run_status": {"run_id": RUN},
    "tail_logs": {"run_id": RUN},
    "get_metrics": {"run_id": RUN},
    "stop_run": {"run_id": RUN},
    "resume_run": {"run_id": RUN},
    "list_runs": {},
    "compare_runs": {"run_ids": [RUN]},
    "record_results": {"run_id": RUN},
    "list_campaigns": {},
    "query_runs": {"where": ["state=died"]},
    "sweep_runs": {"recipes": ["dpo", "ipo"]},
    "evaluate_model": {"target": RUN},
}


pytestmark = pytest.mark.usefixtures("lab_root")


def refusing(name: str):
    def stub(*args, **kwargs):
        raise InvalidArgument(f"SENTINEL {name}")

    return stub


def cli_commands() -> set[str]:
    """Every command path the CLI registers ("launch", "campaign new", ...)."""
    root = typer.main.get_command(cli.app)
    found = set()
    for name, command in root.commands.items():
        sub = getattr(command, "commands", None)
        if sub:
            found |= {f"{name} {s}" for s in sub}
        else:
            found.add(name)
    return found


def test_every_cli_command_is_listed_with_an_api_function():
    assert cli_commands() == set(cli.COMMAND_OPERATIONS) | {"mcp", "version"}
    assert set(CLI_ARGV) == set(cli.COMMAND_OPERATIONS)
    for command, function in cli.COMMAND_OPERATIONS.items():
        assert callable(getattr(api, function)), f"{command}: api.{function} is missing"


@pytest.mark.parametrize("command", sorted(cli.COMMAND_OPERATIONS))
def test_each_cli_command_calls_its_api_function(command, monkeypatch):
    function = cli.COMMAND_OPERATIONS[command]
    monkeypatch.setattr(api, function, refusing(function))
    result = CliRunner().invoke(cli.app, CLI_ARGV[command])
    assert result.exit_code == 2, result.output
    assert f"error: SENTINEL {function}" in result.output


def test_status_without_a_run_adapts_the_active_run_views(monkeypatch):
    monkeypatch.setattr(api, "active_run_views", refusing("active_run_views"))
    result = CliRunner().invoke(cli.app, ["status"])
    assert result.exit_code == 2 and "SENTINEL active_run_views" in result.output


def test_every_mcp_tool_is_listed_with_an_api_function():
    assert set(mcp_server.TOOL_OPERATIONS) == set(mcp_server.TOOL_NAMES) == set(MCP_ARGS)
    for tool, function in mcp_server.TOOL_OPERATIONS.items():
        assert callable(getattr(api, function)), f"{tool}: api.{function} is missing"


@pytest.mark.anyio
@pytest.mark.parametrize("tool", sorted(MCP_ARGS))
async def test_each_mcp_tool_calls_its_api_function(tool, monkeypatch):
    function = mcp_server.TOOL_OPERATIONS[tool]
    monkeypatch.setattr(api, function, refusing(function))
    async with Client(mcp_server.server) as client:
        result = await client.call_tool(tool, MCP_ARGS[tool])
    text = "\n".join(c.text for c in result.content if getattr(c, "text", None))
    assert result.is_error and f"SENTINEL {function}" in text, text
    assert "Next:" in text, "an error without next steps gets the tool's own default hint"


def test_every_exported_name_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError):
        api.no_such_operation  # noqa: B018


def test_importing_the_api_loads_nothing_else_of_the_lab():
    """The CLI imports rlhf_lab.api at start: its names load on first use only."""
    code = (
        "import sys, rlhf_lab.api, rlhf_lab.cli\n"
        "lab = sorted(m for m in sys.modules if m.startswith('rlhf_lab'))\n"
        "print(repr(lab), 'pydantic' in sys.modules)\n"
    )
    listed, pydantic_loaded = python_output(code).strip().rsplit(" ", 1)
    loaded = ast.literal_eval(listed)
    assert pydantic_loaded == "False", "validation is built on the first call, not at import"
    assert loaded == [
        "rlhf_lab",
        "rlhf_lab._lazy",
        "rlhf_lab.api",
        "rlhf_lab.api._operation",
        "rlhf_lab.cli",
        "rlhf_lab.errors",
    ]


def test_run_status_caches_a_finished_runs_alerts_and_advises(monkeypatch):
    """The alert cache and the advice moved from the MCP server into the API layer."""
    from rlhf_lab.api import watching

    calls = []
    status = api.RunStatus(
        id=RUN, campaign="c", state="succeeded", run_dir="/nonexistent", alive=False, exit_code=0
    )
    monkeypatch.setattr(watching, "run_state", lambda run_id: status)
    monkeypatch.setattr(watching, "diagnose", lambda run_id, status: calls.append(run_id) or [])
    monkeypatch.setattr(watching, "_fingerprint", lambda s: ("same",))
    watching._ALERT_CACHE.clear()
    first = watching.run_status(RUN)
    second = watching.run_status(RUN)
    assert calls == [RUN], "the second poll of an unchanged finished run is served from the cache"
    assert "record_results" in first.advice and first.advice == second.advice
    monkeypatch.setattr(watching, "_fingerprint", lambda s: ("changed",))
    watching.run_status(RUN)
    assert calls == [RUN, RUN], "a changed run folder is diagnosed again"


def test_every_surface_function_validates_its_arguments():
    """Typed in: each function a surface calls is an @operation (pydantic-validated)."""
    names = set(cli.COMMAND_OPERATIONS.values()) | set(mcp_server.TOOL_OPERATIONS.values())
    for name in sorted(names | {"active_run_views"}):
        assert getattr(getattr(api, name), "__lab_operation__", False), name


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: api.run_status(5), "argument `run_id`: got 5; expected a string"),
        (
            lambda: api.launch(api.RunRequest(recipe="dpo", overrides=["a=1", 3])),
            "argument `overrides[1]`: got 3; expected a string",
        ),
        (
            lambda: api.stop_run(RUN, grace_s="soon"),
            'argument `grace_s`: got "soon"; expected a number',
        ),
        (lambda: api.tail_logs(RUN, lines="many"), 'argument `lines`: got "many"; expected an int'),
        (lambda: api.get_metrics(), "argument `run_id`: missing (required); expected a string"),
        (
            lambda: api.run_list(limit=[1]),
            "argument `limit`: got [1]; expected an integer or null",
        ),
    ],
)
def test_malformed_arguments_are_a_typed_invalid_argument(call, needle):
    """One line per argument, what is wrong and the expected type; no pydantic wording or URL."""
    with pytest.raises(InvalidArgument) as err:
        call()
    assert needle in err.value.message and err.value.kind == "invalid_argument"
    assert "pydantic" not in err.value.message and "http" not in err.value.message
    assert "\n" not in err.value.message  # one argument, one line


def test_lax_arguments_are_converted_before_the_call(monkeypatch):
    from rlhf_lab import index

    seen = []

    def page(*args, limit, offset):
        seen.append(limit)
        return index.IndexPage(rows=[], total=0, warnings=[])

    monkeypatch.setattr(index, "page_runs", page)
    assert api.run_list(None, None, "3").total == 0  # "3" -> 3, no error
    assert seen == [3]


def test_each_operation_row_matches_the_function_it_calls():
    """A row's arguments are its function's keyword arguments by name, or the one request the
    function takes whole; its result model is what the surface returns."""
    import inspect

    from rlhf_lab.api.operations import OPERATIONS

    assert [op.name for op in OPERATIONS] == list(mcp_server.TOOL_NAMES)
    for op in OPERATIONS:
        fn = inspect.unwrap(getattr(api, op.function))
        params = inspect.signature(fn).parameters
        if op.whole:
            (only,) = params.values()
            taken = only.annotation  # a name under `from __future__ import annotations`
            taken = fn.__globals__[taken] if isinstance(taken, str) else taken
            assert issubclass(op.arguments, taken), op.name
        else:
            assert set(op.fields()) <= set(params), (op.name, set(op.fields()) - set(params))
        assert op.hint and op.description and op.title, op.name
        assert not (op.read_only and op.destructive), op.name


@pytest.mark.anyio
async def test_the_mcp_tools_are_the_rows_of_the_operation_table():
    from rlhf_lab.api.operations import OPERATIONS

    async with Client(mcp_server.server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert list(tools) == [op.name for op in OPERATIONS]
    for op in OPERATIONS:
        tool = tools[op.name]
        assert (tool.title, tool.description) == (op.title, op.description)
        assert list(tool.input_schema.get("properties", {})) == list(op.fields())
        hints = tool.annotations
        assert (hints.read_only_hint, hints.destructive_hint) == (op.read_only, op.destructive)
        assert (hints.idempotent_hint, hints.open_world_hint) == (op.idempotent, op.open_world)
