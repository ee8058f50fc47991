"""The reward models of a ``best_of_n`` evaluation job, as the lab resolves them. Torch-free.

``best_of_n.orm`` and ``best_of_n.prm`` take a reward-model run of this lab (``run:<id>`` or a
bare id) or a folder. A run is checked like any reference (failed runs and runs that keep no
final model are refused, :func:`rlhf_lab.runs.lineage.check_ref`) and must be a reward-model run of
that kind; its ``final_model`` folder goes into the job's config, and the job waits for the run
when it has not ended yet. A folder is passed on as is: the job checks it before writing
anything (``trainers.evaluation.best_of_n_suite.reward_model_folder``). ``best_of_n.samples_from``
takes an earlier best_of_n evaluation (a run reference, or its folder): its completions are
scored again by other reward models (e.g. other training seeds) instead of sampling anew.
"""

from __future__ import annotations

from typing import Any

from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = ["SCORER_KINDS", "named_run_id", "resolve_scorer_refs"]

SCORER_KINDS: tuple[str, ...] = ("orm", "prm")
SUITE = "best_of_n"


def named_run_id(name: str) -> str | None:
    """The run id ``name`` names (``run:<id>``, or a bare id of an existing run), else None
    (a model name or a folder). Evaluation jobs read their target, baseline and judge with it."""
    from rlhf_lab.errors import LabError
    from rlhf_lab.paths import RUN_ID_RE, find_run
    from rlhf_lab.runs.lineage import is_ref, ref_id

    if is_ref(name):
        return ref_id(name)
    if not RUN_ID_RE.fullmatch(name):
        return None
    try:
        find_run(name)
    except LabError:
        return None
    return name


def _checked_final_model(kind: str, run_id: str) -> str:
    from rlhf_lab.runs.lineage import check_ref

    key = f"{SUITE}.{kind}"
    up = check_ref(key, run_id)
    if up.family != "reward_models" or up.algorithm != kind:
        raise InvalidArgument(
            f"{key}=run:{run_id}: that run is {up.algorithm} ({up.family}), not a {kind} "
            "reward model",
            next=NextStep("list_runs", {"state": "succeeded"}, note=f"{kind} reward-model runs"),
        )
    from rlhf_lab.paths import find_run

    return str(find_run(run_id) / "final_model")


def _checked_samples_job(run_id: str) -> str:
    """The folder of the best_of_n evaluation job whose completions are to be scored again."""
    from rlhf_lab.paths import find_run
    from rlhf_lab.runs.lineage import upstream

    up = upstream(run_id)  # NotFound for an unknown id
    if up.family != "evaluation" or up.algorithm != SUITE:
        raise InvalidArgument(
            f"{SUITE}.samples_from=run:{run_id}: that run is {up.algorithm} ({up.family}), not "
            "a best_of_n evaluation",
            next=NextStep("list_runs", {"state": "succeeded"}, note="best_of_n evaluations"),
        )
    if up.state in ("failed", "stopped", "killed", "died", "cancelled"):
        raise InvalidArgument(
            f"{SUITE}.samples_from=run:{run_id}: that evaluation is {up.state} and left no "
            "samples; evaluate again without reusing its samples",
            next=NextStep("run_status", {"run_id": run_id}, note="why it ended"),
        )
    return str(find_run(run_id))


def resolve_scorer_refs(job_data: dict[str, Any]) -> list[str]:
    """Replace run references in ``job_data["best_of_n"]`` (an evaluation job's validated data,
    before its view is built) by their folders (in place: a reward model's final_model, an
    earlier best_of_n job's run folder for ``samples_from``) and return the run ids the job must
    wait for; nothing for another suite."""
    if job_data.get("suite") != SUITE:
        return []
    section = job_data.get(SUITE) or {}
    runs = []
    drawn = section.get("samples_from")
    drawn_id = named_run_id(drawn.strip()) if isinstance(drawn, str) and drawn.strip() else None
    if drawn_id is not None:
        section["samples_from"] = _checked_samples_job(drawn_id)
        runs.append(drawn_id)
    for kind in SCORER_KINDS:
        value = section.get(kind)
        run_id = named_run_id(value.strip()) if isinstance(value, str) and value.strip() else None
        if run_id is None:
            continue
        section[kind] = _checked_final_model(kind, run_id)
        runs.append(run_id)
    return runs
