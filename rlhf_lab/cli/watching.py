"""`rlhf-lab` commands that watch runs: status, runs, tail, metrics, stop, resume. The reading
ones (`status`, `runs`) also have a fast path that starts without typer or pydantic
(:mod:`rlhf_lab.cli.fast`); the two must print the same."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from rlhf_lab import api
from rlhf_lab.cli.commands import (
    JsonOpt,
    app,
    emit,
    flags,
)
from rlhf_lab.cli.render import fmt as _fmt
from rlhf_lab.cli.render import table as _table
from rlhf_lab.cli.steps import lab_errors

# ------------------------------------------------------------------------------------- watching


def _print_status(view: Any) -> None:
    s = view.status
    steps = f"{s.step or 0}/{s.total_steps}" if s.total_steps else (s.step or "-")
    eta = f"  eta {s.eta_s:.0f}s" if s.eta_s else ""
    if eta and s.eta_basis == "phase":
        eta += " (this phase)"
    phase = f" ({s.phase_progress or s.phase})" if s.phase and not s.terminal else ""
    elapsed = f"  elapsed {s.elapsed_s:.0f}s" if s.elapsed_s and not s.terminal else ""
    typer.echo(f"{s.id}  [{s.state}]  step {steps}{phase}{elapsed}{eta}  campaign {s.campaign}")
    if s.slurm_job:
        typer.echo(f"  Slurm job {s.slurm_job} ({s.slurm_state or '?'})")
    elif len(s.devices) > 1 or s.nproc:
        typer.echo(f"  devices {', '.join(s.devices)}" + (f", {s.nproc} ranks" if s.nproc else ""))
    if s.after:
        stage = f"stage {s.stage}, " if s.stage else ""
        typer.echo(f"  {stage}after {', '.join(s.after)}")
    if getattr(view, "headline", None):  # held-out first
        typer.echo(f"  {view.headline}")
    meta = ("step", "time_s", "phase")
    for label, row in (("held-out", s.last_eval), ("training", s.last_train)):
        shown = {k: v for k, v in row.items() if k not in meta}
        if shown:
            items = "  ".join(f"{k}={_fmt(v)}" for k, v in list(shown.items())[:8])
            typer.echo(f"  {label}: {items}")
    if s.time_split:
        typer.echo(f"  time: {s.time_split}")
    if s.error:
        typer.echo(f"  error: {s.error}")
    if s.wandb_url:
        typer.echo(f"  wandb: {s.wandb_url}")
    for alert in view.alerts:
        typer.echo(f"  ! {alert.severity} {alert.kind}: {alert.message} — {alert.hint}")


@app.command()
@lab_errors
def status(
    run: Annotated[str | None, typer.Argument(help="run id (default: active runs)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """State, step / total, ETA, latest metrics and alerts of a run (or of every active run)."""
    if run is not None:
        view = api.run_status(run)
        if as_json:
            typer.echo(view.model_dump_json(indent=2, exclude={"advice"}))
        else:
            _print_status(view)
        return
    views = api.active_run_views()
    if as_json:
        shown = [v.model_dump(mode="json", exclude={"advice"}) for v in views]
        typer.echo(json.dumps(shown, indent=2))
    elif not views:
        typer.echo("no active runs (see `rlhf-lab runs` for finished ones)")
    for view in views if not as_json else []:
        _print_status(view)


@dataclass(kw_only=True)
class RunsFlags:
    campaign: Annotated[str | None, typer.Option(help="campaign slug or name")] = None
    state: Annotated[str | None, typer.Option(help="only runs in this state")] = None
    limit: Annotated[
        int | None, typer.Option(help="the newest N (default 50, or 10 with --detail)")
    ] = None
    detail: Annotated[bool, typer.Option("--detail", help="each run's full status")] = False
    offset: Annotated[int, typer.Option(help="skip the newest N (the next page)")] = 0
    family: Annotated[str | None, typer.Option(help="only runs of this family")] = None
    algorithm: Annotated[str | None, typer.Option(help="only runs of this algorithm")] = None
    as_json: JsonOpt = False


@app.command()
@lab_errors
@flags(RunsFlags)
def runs(o: RunsFlags) -> None:
    """List runs, newest last, with each run's own headline metric (final, best)."""

    def human(listed: Any) -> None:
        rows = [
            [
                r.id,
                r.state,
                f"{r.step or 0}/{r.total_steps or '?'}",
                f"{r.metric} {_fmt(r.value)} (best {_fmt(r.best)})" if r.value is not None else "",
                r.campaign,
            ]
            for r in listed.runs
        ]
        _table("runs", ["run", "state", "step", "headline", "campaign"], rows)
        if listed.note:
            typer.echo(listed.note)

    listed = api.run_list(o.campaign, o.state, o.limit, o.detail, o.offset, o.family, o.algorithm)
    for warning in listed.warnings:
        typer.echo(f"warning: {warning}", err=True)
    emit(listed, o.as_json, human)


@app.command()
@lab_errors
def tail(
    run: Annotated[str, typer.Argument(help="run id")],
    n: Annotated[int, typer.Option("-n", help="last N lines")] = 50,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="keep printing")] = False,
    cursor: Annotated[int | None, typer.Option(help="byte cursor from a previous call")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The run's train.log: capped, progress bars folded, with a cursor for the next call."""
    chunk = api.tail_log(run, lines=n, cursor=cursor)
    if as_json:
        typer.echo(chunk.model_dump_json(indent=2))
        return
    sys.stdout.write(chunk.text)
    if follow:
        for text in api.follow_log(run, chunk.cursor):
            sys.stdout.write(text)
            sys.stdout.flush()
    else:
        typer.echo(f"\n[cursor {chunk.cursor}]", err=True)


@app.command()
@lab_errors
def metrics(
    run: Annotated[str, typer.Argument(help="run id")],
    keys: Annotated[str | None, typer.Option(help="comma list of metric names")] = None,
    phase: Annotated[str | None, typer.Option(help="train, eval or rollout")] = None,
    max_points: Annotated[int | None, typer.Option(help="at most this many rows per phase")] = None,
    max_bytes: Annotated[
        int, typer.Option("--max-bytes", help="down-sample until the rows' JSON fits")
    ] = 8_000,
    as_json: JsonOpt = False,
) -> None:
    """Metric series from metrics.jsonl, down-sampled evenly per phase to a bounded size."""
    wanted = [k.strip() for k in keys.split(",")] if keys else None
    series = api.get_metrics(run, wanted, phase, max_points, max_bytes)

    def human(s: Any) -> None:
        cols = [
            "step",
            "phase",
            *(wanted or sorted({k for r in s.rows for k in r} - {"step", "phase", "time_s"}))[:8],
        ]
        _table(f"{run} metrics", cols, [[_fmt(r.get(c)) for c in cols] for r in s.rows])
        if s.note:
            typer.echo(s.note)

    emit(series, as_json, human)


@app.command()
@lab_errors
def stop(
    run: Annotated[str, typer.Argument(help="run id")],
    grace: Annotated[
        float, typer.Option(help="seconds to wait for the trainer's checkpoint before SIGKILL")
    ] = 60.0,
    as_json: JsonOpt = False,
) -> None:
    """Stop a run: the trainer checkpoints its last completed step and exits (returns then);
    after --grace seconds it is sent SIGKILL and the run is `killed`."""
    emit(api.stop_run(run, grace), as_json, lambda s: typer.echo(s.message))


@app.command()
@lab_errors
def resume(
    run: Annotated[str, typer.Argument(help="run id of a died, stopped or failed run")],
    device: Annotated[
        str | None, typer.Option(help="auto, cpu or cuda:N (default: the run's device)")
    ] = None,
    force: Annotated[bool, typer.Option(help="start even if the device is busy")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Continue a died, stopped or failed run from its last checkpoint, in the same run folder."""
    emit(api.resume_run(run, device=device, force=force), as_json, lambda r: typer.echo(r.message))
