"""`rlhf-lab` commands on campaigns and the run index: record, eval, compare, campaign
new/show/list, query, index rebuild."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from rlhf_lab import api
from rlhf_lab.cli.commands import (
    JsonOpt,
    SetOpt,
    app,
    campaign_app,
    emit,
    flags,
    index_app,
)
from rlhf_lab.cli.render import fmt as _fmt
from rlhf_lab.cli.render import table as _table
from rlhf_lab.cli.steps import lab_errors

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


@dataclass(kw_only=True)
class EvalFlags:
    target: Annotated[str, typer.Argument(help="run id (its final model) or model name")]
    suite: Annotated[
        list[str] | None,
        typer.Option(
            "--suite",
            help="reasoning, math, winrate, generation, pair_accuracy or best_of_n "
            "(repeatable; default reasoning)",
        ),
    ] = None
    baseline: Annotated[
        str | None,
        typer.Option(
            help="auto (a run's starting model; the default for a run), none, a run id or a model"
        ),
    ] = None
    judge: Annotated[str | None, typer.Option(help="winrate: a reward-model run id")] = None
    set_: SetOpt = None
    campaign: Annotated[str | None, typer.Option(help="campaign slug (default: the run's)")] = None
    device: Annotated[str | None, typer.Option(help="default: the run's device")] = None
    as_json: JsonOpt = False


@app.command("eval")
@lab_errors
@flags(EvalFlags)
def eval_(o: EvalFlags) -> None:
    """Evaluate a run's final model (or a model) in the background: one job per suite, with
    its starting model on the same prompts and seed, and intervals; recorded in the campaign's
    Evaluation section when it ends (trainers/evaluation/README.md)."""
    result = api.evaluate_model(
        o.target,
        suite=o.suite or None,
        baseline=o.baseline,
        judge=o.judge,
        overrides=o.set_ or [],
        campaign=o.campaign,
        device=o.device,
    )
    if o.as_json:
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
    runs_: Annotated[
        list[str] | None, typer.Argument(metavar="[RUN...]", help="run ids of one family")
    ] = None,
    record_in: Annotated[str | None, typer.Option(help="campaign to record the table in")] = None,
    campaign: Annotated[
        str | None, typer.Option(help="compare this campaign's runs (succeeded/stopped/running)")
    ] = None,
    family: Annotated[
        str | None, typer.Option(help="with --campaign: the family to compare, when it has several")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """The family's comparison table for several runs, or for a campaign's runs."""
    cmp = api.compare_runs(runs_ or [], record_in, campaign=campaign, family=family)
    emit(cmp, as_json, lambda c: typer.echo(c.markdown))


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
