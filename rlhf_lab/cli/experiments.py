"""`rlhf-lab` commands that plan and start work: recipes, plan, shrink, launch (and
following a run in the foreground), pipeline, sweep."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from rlhf_lab import api
from rlhf_lab.cli.commands import (
    GpusOpt,
    JsonOpt,
    NprocOpt,
    SetOpt,
    SlurmFlags,
    app,
    emit,
    flags,
)
from rlhf_lab.cli.interrupts import Interrupts, sigint_restored
from rlhf_lab.cli.render import table as _table
from rlhf_lab.cli.steps import lab_errors

NoCalibrateOpt = Annotated[
    bool,
    typer.Option(
        "--no-calibrate",
        help="measure nothing before planning: no difficulty probe of the base model, times only from a cached throughput calibration",
    ),
]

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


@dataclass(kw_only=True)
class PlanFlags:
    request: Annotated[str | None, typer.Argument(help='e.g. "small SimPO sanity check"')] = None
    algorithm: Annotated[str | None, typer.Option(help="algorithm, recipe or YAML")] = None
    model: Annotated[str | None, typer.Option(help="swap the model, e.g. tiny")] = None
    campaign: Annotated[str | None, typer.Option(help="ledger slug")] = None
    set_: SetOpt = None
    job: SlurmFlags
    no_calibrate: NoCalibrateOpt = False
    as_json: JsonOpt = False


@app.command()
@lab_errors
@flags(PlanFlags)
def plan(o: PlanFlags) -> None:
    """Plan an experiment: recipe, shrunk config, memory vs free memory, predicted wall time,
    commands, what to watch. With --slurm, also the job script each run would be submitted with.
    Runs that learn from their own samples are calibrated (a probe of the base model picks the
    task and generation limit), and the model's throughput is measured once for the time
    estimates; both are cached. --no-calibrate measures nothing (cached results only)."""
    job = o.job.options()

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
            for line in run.calibration_table:
                typer.echo(line)
            for fit in run.devices:
                est = f"{fit.estimate_gb:.2f}" if fit.estimate_gb is not None else "?"
                typer.echo(
                    f"memory on {fit.device}: need ~{est} GiB, free {fit.free_gb:.1f} GiB, "
                    f"fits: {fit.fits}"
                )
            if run.time is not None:
                typer.echo(
                    run.time.text if run.time.text.startswith("time:") else f"time: {run.time.text}"
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
        if p.time_total:
            typer.echo(
                p.time_total
                if p.time_total.startswith("time:")
                else f"time, all runs: {p.time_total}"
            )
        typer.echo("")
        for step in p.steps:
            typer.echo(step)
        for note in p.notes:
            typer.echo(f"note: {note}")
        for w in p.warnings:
            typer.echo(f"warning: {w}")
        for choice in p.offline_choices:
            typer.echo(f"offline choice: {choice}")

    with api.listening(_say_on_stderr):
        planned = api.plan_experiment(
            o.request, o.algorithm, o.model, o.campaign, o.set_ or [], calibrate=not o.no_calibrate
        )
    emit(planned, o.as_json, human)


def _say_on_stderr(message: str) -> None:
    """A slow planning step starting (a throughput calibration, a probe): on stderr, so that
    stdout keeps only the answer (``--json`` stays parseable)."""
    typer.echo(message, err=True)


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


def _follow(run_id: str, interrupts: Interrupts) -> int:
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
            interrupts.follow()  # a Ctrl-C noted while launching raises here
            final = api.wait_and_stream(run_id, on_progress, on_log)
        except KeyboardInterrupt:
            progress.stop()
            return _interrupted(run_id)
    typer.echo(f"{run_id}: {final.state}")
    return 0 if final.state == "succeeded" else 1


def _interrupted(run_id: str) -> int:
    """Ctrl-C during a foreground launch: stop the run, or detach (asked at a terminal)."""
    if _stop_or_detach(sys.stdin.isatty(), _ask) == "detach":
        typer.echo(f"detached: {run_id} goes on (rlhf-lab status {run_id}; rlhf-lab stop)")
        return 0
    typer.echo(f"stopping {run_id} (the trainer checkpoints, then exits) ...")
    stopped = api.stop_run(run_id)
    typer.echo(stopped.message)
    return 1


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


@dataclass(kw_only=True)
class LaunchFlags:
    recipe: Annotated[str, typer.Argument(help="recipe name or YAML file")]
    set_: SetOpt = None
    shrink_: Annotated[bool, typer.Option("--shrink", help="shrink to a sanity run")] = False
    model: Annotated[str | None, typer.Option(help="swap the model (implies --shrink)")] = None
    campaign: Annotated[str | None, typer.Option(help="campaign slug")] = None
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N")] = "auto"
    force: Annotated[
        bool,
        typer.Option(help="skip the memory and busy-device checks: start even if it may not fit"),
    ] = False
    queue: Annotated[bool, typer.Option(help="queue behind the device's current job")] = False
    foreground: Annotated[
        bool,
        typer.Option(help="stream the log with a progress bar; Ctrl-C asks: stop or detach"),
    ] = False
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after", help="run id it waits for (repeatable): starts once they all succeeded"
        ),
    ] = None
    gpus: GpusOpt = None
    nproc: NprocOpt = None
    job: SlurmFlags
    no_calibrate: NoCalibrateOpt = False
    as_json: JsonOpt = False

    def request(self) -> Any:
        """The :class:`~rlhf_lab.api.RunRequest` these flags ask for."""
        return api.RunRequest(
            recipe=self.recipe,
            overrides=self.set_ or [],
            shrink=self.shrink_,
            model=self.model,
            campaign=self.campaign,
            device=self.device,
            force=self.force,
            queue=self.queue,
            after=self.after or [],
            gpus=self.gpus,
            nproc=self.nproc,
            slurm=self.job.options(self.nproc),
            calibrate=not self.no_calibrate,
        )


@app.command()
@lab_errors
@sigint_restored
@flags(LaunchFlags)
def launch(o: LaunchFlags) -> None:
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
    interrupts = Interrupts().install() if o.foreground else Interrupts()  # before the run starts
    with api.listening(_say_on_stderr):
        result = api.launch(o.request())
    if o.as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        run_dir = result.run.run_dir
        typer.echo(result.message)
        typer.echo(f"run id:  {result.run.id}")
        typer.echo(f"log:     {run_dir}/train.log")
        typer.echo(f"watch:   rlhf-lab status {result.run.id}   (or: tail -f {run_dir}/train.log)")
        for warning in result.warnings:
            typer.echo(f"warning: {warning}")
    if o.foreground and not result.queued:
        raise typer.Exit(_follow(result.run.id, interrupts))
    if interrupts.noted:  # a queued run: stopped (cancelled) as a followed one would be
        raise typer.Exit(_interrupted(result.run.id))


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


@dataclass(kw_only=True)
class SweepFlags:
    recipes_: Annotated[str, typer.Argument(metavar="RECIPES", help="comma list: dpo,ipo,simpo")]
    set_: SetOpt = None
    model: Annotated[str | None, typer.Option(help="swap the model, e.g. tiny")] = None
    campaign: Annotated[str | None, typer.Option(help="campaign slug")] = None
    no_shrink: Annotated[bool, typer.Option("--no-shrink", help="full configs")] = False
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N")] = "auto"
    seeds: Annotated[int, typer.Option(help="runs per recipe, seeds base, base+1, ...")] = 1
    base_seed: Annotated[
        int | None, typer.Option(help="first seed (default: the first recipe's seed)")
    ] = None
    as_json: JsonOpt = False


@app.command()
@lab_errors
@flags(SweepFlags)
def sweep(o: SweepFlags) -> None:
    """Queue matched runs of several recipes in one campaign; they run one after another.
    Every recipe runs with the same seeds (``--seeds K``: K matched runs each)."""
    names = [r.strip() for r in o.recipes_.split(",") if r.strip()]
    request = api.SweepRequest(
        recipes=names,
        overrides=o.set_ or [],
        shrink=not o.no_shrink,
        model=o.model,
        campaign=o.campaign,
        device=o.device,
        seeds=o.seeds,
        base_seed=o.base_seed,
    )
    result = api.sweep(request)

    def human(r: Any) -> None:
        typer.echo(f"campaign: {r.campaign}   seeds: {', '.join(map(str, r.seeds))}")
        for item in r.launches:
            typer.echo(f"  {item.run.id}: {item.message}")

    emit(result, o.as_json, human)
