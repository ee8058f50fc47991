"""The pipeline operations: ``run_pipeline`` (a chain of runs in one campaign, each stage queued
after the stages whose output it takes) and ``list_pipelines``. Torch-free.

The definitions and their ordering live in :mod:`rlhf_lab.runs.pipelines`; each stage is launched
with :func:`rlhf_lab.api.launch`, so a stage gets exactly the checks, run folder,
ledger row and queue entry a single launch gets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.errors import LabError, NextStep

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "PipelineInfo",
    "PipelineList",
    "PipelineResult",
    "PipelineStageRun",
    "list_pipelines",
    "run_pipeline",
]


class PipelineStageRun(BaseModel):
    stage: str
    recipe: str
    run_id: str
    state: str
    after: list[str] = Field(default_factory=list, description="stages it waits for")
    handoff: list[str] = Field(
        default_factory=list,
        description="where its final model goes, e.g. final_model → reward.model of ppo",
    )
    check: str | None = Field(default=None, description="what to check in its result")


class PipelineResult(BaseModel):
    pipeline: str
    campaign: str = Field(description="YYYY-MM-DD-<slug>; its ledger is ledger://<campaign>")
    stages: list[PipelineStageRun]
    message: str
    warnings: list[str] = Field(default_factory=list)


class PipelineInfo(BaseModel):
    name: str
    description: str
    stages: list[str] = Field(description="<stage>: <recipe> (after <stages>)")
    available: bool = Field(description="every stage's recipe exists here")
    missing: list[str] = Field(default_factory=list, description="recipes not found")


class PipelineList(BaseModel):
    pipelines: list[PipelineInfo]


def _recipe_exists(recipe: str) -> bool:
    from rlhf_lab.planning.catalog import find_recipe

    try:
        find_recipe(recipe)
    except LabError:
        return False
    return True


@operation
def list_pipelines() -> PipelineList:
    """The shipped pipelines: stages, recipes, and whether every recipe exists here."""
    from rlhf_lab.runs.pipelines import list_pipeline_defs, plan_stages

    out = []
    for defn in list_pipeline_defs():
        stages = plan_stages(defn)
        missing = [s.recipe for s in stages if not _recipe_exists(s.recipe)]
        out.append(
            PipelineInfo(
                name=defn.name,
                description=" ".join(defn.description.split()),
                stages=[
                    f"{s.name}: {s.recipe}" + (f" (after {', '.join(s.after)})" if s.after else "")
                    for s in stages
                ],
                available=not missing,
                missing=missing,
            )
        )
    return PipelineList(pipelines=out)


def _undo_launched(launched: dict[str, str], why: str) -> str:
    """A later stage could not be launched: the stages already queued are cancelled, one the
    queue worker already started is stopped (a pipeline runs whole or not at all). Says so."""
    from rlhf_lab.runs import find_run, stop_run
    from rlhf_lab.runs.deps import cancel

    cancelled, stopped = [], []
    for stage, run_id in launched.items():
        try:
            if cancel(find_run(run_id), why):
                cancelled.append(stage)
            else:
                stop_run(run_id)
                stopped.append(stage)
        except LabError:
            continue
    parts = [f"stages {', '.join(cancelled)} were cancelled"] if cancelled else []
    parts += [f"stages {', '.join(stopped)} were stopped"] if stopped else []
    return f" ({'; '.join(parts)})" if parts else ""


def _write_gate(run_id: str, upstream: str, gate: Any) -> None:
    """Record a stage's gate in its queued run's run.json (the queue worker checks it when the
    upstream runs have succeeded: rlhf_lab/results/gates.py)."""
    from rlhf_lab.paths import find_run
    from rlhf_lab.runs.process import _run_lock
    from rlhf_lab.runs.records import _atomic_write_json, _read_run_json

    run_dir = find_run(run_id)
    with _run_lock(run_dir):
        record = _read_run_json(run_dir) or {}
        entry = {"run": upstream, "stage": gate.stage, "metric": gate.metric, "above": gate.above}
        record["gates"] = [*record.get("gates", []), entry]
        _atomic_write_json(run_dir / "run.json", record)


@operation
def run_pipeline(
    name: str,
    model: str | None = None,
    campaign: str | None = None,
    overrides: list[str] | None = None,
    *,
    shrink: bool = True,
    device: str = "auto",
    question: str | None = None,
) -> PipelineResult:
    """Queue every stage of pipeline ``name`` in one campaign (default ``<name>-pipeline``),
    each after the stages whose output it takes; the queue worker runs them in order. Every
    stage is checked first (nothing is written when one is refused). ``overrides`` name their
    stage: ``ppo.train.max_steps=3`` (``*.key=value``: every stage). ``model`` swaps the model of
    the stages that do not start from another stage's output."""
    from rlhf_lab.api.launching import launch
    from rlhf_lab.api.request import RunRequest
    from rlhf_lab.paths import campaign_name
    from rlhf_lab.runs.pipelines import (
        check_stages,
        find_pipeline,
        handoffs,
        plan_stages,
        with_run_ids,
    )

    defn = find_pipeline(name)
    slug = campaign if campaign is not None else f"{defn.name}-pipeline"
    dated = campaign_name(slug)
    stages = plan_stages(defn, model, list(overrides or []))
    for s in stages:
        if not _recipe_exists(s.recipe):
            raise LabError(
                f"pipeline {defn.name}: stage {s.name} needs recipe {s.recipe!r}, which this "
                "checkout does not have",
                next=NextStep("list_pipelines"),
                kind="unavailable",
            )
    from rlhf_lab.api import _check_memory
    from rlhf_lab.runs import resolve_device

    def fits(family: str, algorithm: str, config: TrainerConfig) -> None:  # queued: the total
        _check_memory(family, algorithm, config, resolve_device(device, config), queue=True)

    check_stages(stages, shrink=shrink, also=fits)  # every stage, before anything is written
    given = handoffs(stages)
    launched: dict[str, str] = {}
    rows: list[PipelineStageRun] = []
    warnings: list[str] = []
    for s in stages:
        try:
            request = RunRequest(
                recipe=s.recipe,
                overrides=with_run_ids(s.overrides, launched),
                shrink=shrink,
                model=s.model,
                campaign=slug,
                question=question or " ".join(defn.question.split()),
                device=device,
                queue=True,
                after=[launched[up] for up in s.after],
                pipeline=defn.name,
                stage=s.name,
            )
            result = launch(request)
        except LabError as err:
            undone = _undo_launched(
                launched, f"pipeline launch stopped at stage {s.name}: {err.message}"
            )
            raise type(err)(
                f"pipeline {defn.name}, stage {s.name}: {err.message}{undone}",
                next=list(err.next_steps),
                kind=err.kind,
            ) from None
        launched[s.name] = result.run.id
        if s.gate is not None:
            _write_gate(result.run.id, launched[s.gate.stage], s.gate)
        warnings += [f"{s.name}: {w}" for w in result.warnings]
        rows.append(
            PipelineStageRun(
                stage=s.name,
                recipe=s.recipe,
                run_id=result.run.id,
                state=result.state,
                after=s.after,
                handoff=given[s.name],
                check=" ".join(s.check.split()) if s.check else None,
            )
        )
    chain = " → ".join(s.name for s in stages)
    return PipelineResult(
        pipeline=defn.name,
        campaign=dated,
        stages=rows,
        message=f"queued pipeline {defn.name} ({chain}) in campaign {dated}: each stage starts "
        "when the stages it needs have succeeded; a failed stage cancels the later ones",
        warnings=list(dict.fromkeys(warnings)),
    )
