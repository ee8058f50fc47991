"""The evaluation side of the lab API: ``evaluate_model`` launches evaluation jobs
(:mod:`rlhf_lab.evaluation.jobs`) like runs. Torch-free."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.api.results import LaunchRunResult, launch_run_result
from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = ["EvaluationLaunch", "evaluate_model"]


class EvaluationLaunch(BaseModel):
    """The evaluation jobs one call started (one per suite); run_status follows each."""

    campaign: str
    run_ids: list[str]
    baseline: str | None
    message: str
    next_step: str
    warnings: list[str] = Field(default_factory=list)


def _slug(target_campaign: str | None, campaign: str | None, suite: str) -> str:
    if campaign is not None:
        return campaign
    return target_campaign or f"eval-{suite.replace('_', '-')}"


def _cost_text(job: Any) -> str:
    """``; estimated ~0.9 GiB, <=N sampled tokens`` (rlhf_lab.evaluation.cost), or ""."""
    from rlhf_lab.errors import LabError
    from rlhf_lab.evaluation.cost import estimate_evaluation

    model = f"{job.target.path}/final_model" if job.target.run_id is not None else job.target.path
    try:
        cost = estimate_evaluation(
            model,
            job.suite,
            job.overrides,
            device=job.device,
            baseline=job.config.get("baseline") is not None,
        )
    except LabError:
        return ""
    memory = f"~{cost.memory_gb:.2g} GiB, " if cost.memory_gb is not None else ""
    tokens = (
        f"≤{cost.generated_tokens:,} sampled tokens" if cost.generated_tokens else "no sampling"
    )
    return f"; estimated {memory}{tokens}"


@operation
def evaluate_model(
    target: str,
    suite: list[str] | None = None,
    baseline: str | None = None,
    judge: str | None = None,
    overrides: list[str] | None = None,
    campaign: str | None = None,
    device: str | None = None,
) -> EvaluationLaunch:
    """Evaluate a run's final model (run id or ``run:<id>``) or a model name on each suite:
    one background job per suite, in the target run's campaign (else ``campaign``, default
    ``eval-<suite>``), recorded in its Evaluation section when it ends. ``baseline``: ``auto``
    (default for a run: its starting model, same prompts and seed), ``none``, a run id or a
    model. Everything is checked before anything is written."""
    from rlhf_lab.api.launching import (
        record_now,
        record_when_ended,
        start_or_queue,
        with_predicted_time,
    )
    from rlhf_lab.evaluation.jobs import EVAL_FAMILY, prepare_evaluation
    from rlhf_lab.ledger import create_campaign
    from rlhf_lab.paths import campaign_name
    from rlhf_lab.runs import active_runs
    from rlhf_lab.runs.deps import check_after
    from rlhf_lab.runs.launcher import NewRun

    names = list(dict.fromkeys(suite or ["reasoning"]))
    if not names:
        raise InvalidArgument(
            "suite: name at least one suite", next=NextStep("evaluate_model", {"suite": []})
        )
    jobs = [
        prepare_evaluation(
            target, s, baseline=baseline, judge=judge, overrides=overrides, device=device
        )
        for s in names
    ]
    slug = _slug(jobs[0].target.campaign, campaign, names[0])
    name = campaign_name(slug)
    for job in jobs:
        job.after = check_after(job.after)
    create_campaign(
        slug,
        f"How does {target} do on {', '.join(names)}, against its starting model?",
        model=jobs[0].target.path,
    )
    launched: list[LaunchRunResult] = []
    for i, job in enumerate(jobs):
        busy = bool(active_runs(job.device))
        run = NewRun(
            family=EVAL_FAMILY,
            algorithm=job.suite,
            config=job.config,
            campaign=name,
            source=f"trainers/evaluation/configs/{job.suite}.yaml",
            overrides=job.overrides,
            device=job.device,
            after=job.after,
        )
        result = start_or_queue(with_predicted_time(run), queue=i > 0 or busy)
        warnings = record_now(result.run.id)
        cost = _cost_text(job)
        if not result.queued:
            warnings += record_when_ended(result.run.id)
        update = {"warnings": result.warnings + warnings, "message": result.message + cost}
        launched.append(launch_run_result(result.model_copy(update=update)))
    first = launched[0].run_id
    return EvaluationLaunch(
        campaign=name,
        run_ids=[e.run_id for e in launched],
        baseline=jobs[0].config.get("baseline"),
        message="; ".join(e.message for e in launched),
        warnings=[w for e in launched for w in e.warnings],
        next_step=f"poll run_status('{first}'); when the jobs end their numbers are in the "
        f"Evaluation section of ledger://{name} and in each run folder's eval.json",
    )
