"""How the CLI names the lab's next steps: each API operation as an `rlhf-lab` command line
(:data:`CLI_OPERATIONS`, :func:`render_step`), and an expected failure as one stderr line."""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import typer

from rlhf_lab.errors import LabError, NextStep


class Command(NamedTuple):
    """How one lab operation is typed on this command line."""

    words: str  # after `rlhf-lab`, e.g. "campaign new"
    positional: tuple[str, ...] = ()  # API argument names given as positional arguments
    flags: dict[str, str] = {}  # API argument name -> its option


# lab operation (the API function a NextStep names) -> the command that performs it. An
# operation or argument missing here cannot be rendered (tests/mcp/test_error_rendering.py).
CLI_OPERATIONS: dict[str, Command] = {
    "list_recipes": Command("recipes", (), {"family": "--family"}),
    "plan_experiment": Command(
        "plan",
        ("request",),
        {
            "algorithm": "--algorithm",
            "model": "--model",
            "campaign": "--campaign",
            "overrides": "--set",
            "calibrate": "--calibrate",
        },
    ),
    "shrink_config": Command("shrink", ("recipe",), {"model": "--model", "overrides": "--set"}),
    "estimate_memory": Command(
        "plan", (), {"recipe": "--algorithm", "model": "--model", "overrides": "--set"}
    ),
    "check_resources": Command("gpu"),
    "launch_run": Command(
        "launch",
        ("recipe",),
        {
            "overrides": "--set",
            "shrink": "--shrink",
            "model": "--model",
            "campaign": "--campaign",
            "device": "--device",
            "queue": "--queue",
            "force": "--force",
            "after": "--after",
            "gpus": "--gpus",
            "nproc": "--nproc",
        },
    ),
    "sweep": Command(
        "sweep",
        ("recipes",),
        {"overrides": "--set", "model": "--model", "campaign": "--campaign", "device": "--device"},
    ),
    "run_pipeline": Command(
        "pipeline", ("name",), {"model": "--model", "campaign": "--campaign", "overrides": "--set"}
    ),
    "list_pipelines": Command("recipes"),  # it lists the pipelines too (so does `pipeline list`)
    "evaluate_model": Command(
        "eval",
        ("target",),
        {
            "suite": "--suite",
            "baseline": "--baseline",
            "judge": "--judge",
            "overrides": "--set",
            "campaign": "--campaign",
            "device": "--device",
        },
    ),
    "run_status": Command("status", ("run_id",)),
    "tail_logs": Command("tail", ("run_id",), {"lines": "-n", "cursor": "--cursor"}),
    "get_metrics": Command(
        "metrics",
        ("run_id",),
        {
            "keys": "--keys",
            "phase": "--phase",
            "max_points": "--max-points",
            "max_bytes": "--max-bytes",
        },
    ),
    "stop_run": Command("stop", ("run_id",), {"grace_s": "--grace"}),
    "resume_run": Command("resume", ("run_id",), {"device": "--device", "force": "--force"}),
    "list_runs": Command(
        "runs",
        (),
        {"campaign": "--campaign", "state": "--state", "limit": "--limit", "detail": "--detail"},
    ),
    "compare_runs": Command("compare", ("run_ids",), {"record_in": "--record-in"}),
    "record_results": Command("record", ("run_id",), {"note": "--note"}),
    "create_campaign": Command(
        "campaign new", ("slug",), {"question": "--question", "family": "--family"}
    ),
    "show_campaign": Command("campaign show", ("campaign",)),
    "list_campaigns": Command("campaign list"),
    "list_models": Command("models list"),
    "query_runs": Command(
        "query",
        (),
        {
            "where": "--where",
            "sort": "--sort",
            "group_by": "--group-by",
            "best": "--best",
            "limit": "--limit",
        },
    ),
    "rebuild_run_index": Command("index rebuild"),
    "pull_model": Command("models pull", ("name",)),
}
# positional arguments a command cannot do without (shown as "..." when a step leaves them out)
_REQUIRED = {"recipe", "recipes", "run_id", "run_ids", "slug", "campaign", "name", "target"}


def _cli_value(value: Any) -> str:
    """One argument value as typed in a shell (lists of recipes are comma-joined)."""
    if isinstance(value, list | tuple):
        return shlex.quote(",".join(str(v) for v in value))
    return shlex.quote(str(value))


def _positional(command: Command, args: dict[str, Any]) -> list[str]:
    """The positional words of a step: its values, or "..." for a required one it leaves out."""
    words: list[str] = []
    for name in command.positional:
        if name in args:
            value = args[name]
            values = value if isinstance(value, list | tuple) and name == "run_ids" else [value]
            words += [_cli_value(v) for v in values]
        elif name in _REQUIRED:
            words.append("...")
    return words


def _option(flag: str, value: Any) -> list[str]:
    """An option's words: a bare flag for true, nothing for false, repeated for a list."""
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    if isinstance(value, list | tuple):
        return [w for v in value for w in (flag, _cli_value(v))]
    return [flag, _cli_value(value)]


def render_step(step: NextStep) -> str:
    """A next step as a command line, ``rlhf-lab resume x`` / ``rlhf-lab launch ... --queue``;
    raises KeyError for an operation or argument this surface has no rendering for."""
    command = CLI_OPERATIONS[step.operation]
    args = dict(step.args)
    unknown = set(args) - set(command.positional) - set(command.flags)
    if unknown:
        raise KeyError(f"{step.operation}: no CLI rendering for {sorted(unknown)}")
    words = ["rlhf-lab", command.words, *_positional(command, args)]
    for name, value in args.items():
        if name in command.flags:
            words += _option(command.flags[name], value)
    text = f"`{' '.join(words)}`"
    return f"{text} ({step.note})" if step.note else text


def error_line(err: LabError) -> str:
    """The one stderr line of an expected failure: message, then the next steps as commands."""
    message = " ".join(err.message.split("\n"))
    if not err.next_steps:
        return f"error: {message}"
    return f"error: {message} (next: " + "; or ".join(map(render_step, err.next_steps)) + ")"


F = TypeVar("F", bound=Callable[..., Any])


def lab_errors(fn: F) -> F:
    """Turn expected failures into one clear line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LabError as err:
            typer.echo(error_line(err), err=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]
