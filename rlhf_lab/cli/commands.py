"""The typer application behind `rlhf-lab`: the app and its sub-apps, the options several
commands share, :func:`emit`, and :data:`COMMAND_OPERATIONS`. The commands live by group in
:mod:`~rlhf_lab.cli.experiments` (plan and start work), :mod:`~rlhf_lab.cli.watching` (runs),
:mod:`~rlhf_lab.cli.campaigns` (ledgers and the run index) and :mod:`~rlhf_lab.cli.admin` (the
lab itself), imported at the end of this module in that order (the order `--help` lists them).
A new flag goes on its command in its group module; a new command also gets its line in
:data:`COMMAND_OPERATIONS`. A command with many flags takes them as one dataclass
(:func:`flags`): typer still sees one parameter per flag, with the same help. Importing this module costs typer and rich; the reading commands
start without it (:mod:`rlhf_lab.cli.fast`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

__all__ = ["COMMAND_OPERATIONS", "SlurmFlags", "app", "emit", "flags"]

app = typer.Typer(
    help="Plan, launch, watch and record small RLHF experiments.",
    no_args_is_help=True,
    add_completion=False,
)
campaign_app = typer.Typer(help="Create, show and list campaigns (ledgers).", no_args_is_help=True)
models_app = typer.Typer(help="Built-in presets, cached models, pulling a real model.")
skills_app = typer.Typer(help="Claude Code skills and the .mcp.json entry.", no_args_is_help=True)
app.add_typer(campaign_app, name="campaign")
app.add_typer(models_app, name="models")
app.add_typer(skills_app, name="skills")
index_app = typer.Typer(help="The run index (SQLite beside experiments/).", no_args_is_help=True)
app.add_typer(index_app, name="index")

JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="dotted override key=value (repeatable), e.g. train.batch_size=8"),
]


def emit(obj: Any, as_json: bool, human: Callable[[Any], None]) -> None:
    """Print a pydantic model (or list of them) as JSON, or call ``human(obj)``."""
    if as_json:
        if isinstance(obj, list):
            typer.echo(json.dumps([o.model_dump(mode="json") for o in obj], indent=2))
        else:
            typer.echo(obj.model_dump_json(indent=2))
    else:
        human(obj)


GpusOpt = Annotated[
    str | None, typer.Option(help="GPU ids (0,1,2,3) or a count (4): one torchrun rank per GPU")
]
NprocOpt = Annotated[int | None, typer.Option(help="CPU ranks under torchrun (gloo)")]
SlurmOpt = Annotated[bool, typer.Option("--slurm", help="submit as a Slurm job (sbatch)")]
NodesOpt = Annotated[int, typer.Option(help="Slurm: nodes")]
GpusPerNodeOpt = Annotated[int, typer.Option(help="Slurm: GPUs per node (0: CPU job)")]
PartitionOpt = Annotated[str | None, typer.Option(help="Slurm: partition")]
TimeOpt = Annotated[str | None, typer.Option(help="Slurm: time limit (minutes or H:MM:SS)")]
AccountOpt = Annotated[str | None, typer.Option(help="Slurm: account")]


@dataclasses.dataclass(kw_only=True)
class SlurmFlags:
    """The Slurm flags of ``plan`` and ``launch``."""

    slurm: SlurmOpt = False
    nodes: NodesOpt = 1
    gpus_per_node: GpusPerNodeOpt = 0
    partition: PartitionOpt = None
    time: TimeOpt = None
    account: AccountOpt = None

    def options(self, nproc: int | None = None) -> dict | None:
        """The Slurm options as the API takes them (None without --slurm)."""
        if not self.slurm:
            return None
        options = {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "nproc_per_node": nproc,
        }
        options.update(partition=self.partition, time=self.time, account=self.account)
        return {k: v for k, v in options.items() if v is not None}


T = TypeVar("T")


def _flag_parameters(cls: type) -> list[inspect.Parameter]:
    """One keyword parameter per field of the dataclass ``cls`` (its annotation, typer's
    Option or Argument included, and its default); a field that is itself such a dataclass
    stands for its own fields, in place."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[inspect.Parameter] = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            out += _flag_parameters(hint)
            continue
        default = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        out.append(
            inspect.Parameter(
                field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint
            )
        )
    return out


def _build(cls: type[T], values: dict[str, Any]) -> T:
    """``cls`` from the flat flag values (its nested flag dataclasses built from theirs)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    given: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            given[field.name] = _build(hint, values)
        elif field.name in values:
            given[field.name] = values[field.name]
    return cls(**given)


def flags(cls: type[T]) -> Callable[[Callable[[T], Any]], Callable[..., Any]]:
    """A command that takes its flags as one ``cls`` (a dataclass of typer-annotated fields):
    typer sees each field as its own parameter, the command one ``cls``."""
    parameters = _flag_parameters(cls)

    def decorate(fn: Callable[[T], Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def command(**values: Any) -> Any:
            return fn(_build(cls, values))

        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return command

    return decorate


# command -> the lab API function it adapts (tests/lab/test_api_layer.py calls each command with
# that function replaced). `mcp` starts the other surface and `version` only prints.
COMMAND_OPERATIONS: dict[str, str] = {
    "recipes": "list_recipes",
    "plan": "plan_experiment",
    "shrink": "shrink_config",
    "launch": "launch",
    "pipeline": "run_pipeline",
    "sweep": "sweep",
    "status": "run_status",
    "runs": "run_list",
    "tail": "tail_log",
    "metrics": "get_metrics",
    "stop": "stop_run",
    "resume": "resume_run",
    "record": "record_run",
    "compare": "compare_runs",
    "eval": "evaluate_model",
    "campaign new": "create_campaign",
    "campaign show": "show_campaign",
    "campaign list": "list_campaigns",
    "gpu": "check_resources",
    "models list": "list_models",
    "models pull": "pull_model",
    "demo": "run_demo",
    "skills install": "install_skills",
    "query": "query_runs",
    "index rebuild": "rebuild_run_index",
}


# The commands register themselves on import, group by group, in the order `--help` lists them
# (imported last: they use the app defined above).
for _group in ("experiments", "watching", "campaigns", "admin"):
    importlib.import_module(f"rlhf_lab.cli.{_group}")
