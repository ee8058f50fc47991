"""The reward models of a ``best_of_n`` evaluation job, as the lab resolves them. Torch-free.

``best_of_n.orm`` and ``best_of_n.prm`` take a reward-model run of this lab (``run:<id>`` or a
bare id) or a folder. A run is checked like any reference (failed runs and runs that keep no
final model are refused, :func:`rlhf_lab.lineage.check_ref`) and must be a reward-model run of
that kind; its ``final_model`` folder goes into the job's config, and the job waits for the run
when it has not ended yet. A folder is passed on as is: the job checks it before writing
anything (``trainers.evaluation.best_of_n.reward_model_folder``).
"""

from __future__ import annotations

from typing import Any

from rlhf_lab.errors import InvalidArgument, NextStep

__all__ = ["SCORER_KINDS", "resolve_scorer_refs"]

SCORER_KINDS: tuple[str, ...] = ("orm", "prm")
SUITE = "best_of_n"


def _run_id(value: str) -> str | None:
    """The run id ``value`` names (``run:<id>``, or a bare id of an existing run), else None."""
    from rlhf_lab.errors import LabError
    from rlhf_lab.lineage import is_ref, ref_id
    from rlhf_lab.paths import RUN_ID_RE, find_run

    value = value.strip()
    if is_ref(value):
        return ref_id(value)
    if not RUN_ID_RE.fullmatch(value):
        return None
    try:
        find_run(value)
    except LabError:
        return None
    return value


def _checked_final_model(kind: str, run_id: str) -> str:
    from rlhf_lab.lineage import check_ref

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


def resolve_scorer_refs(config: dict[str, Any]) -> list[str]:
    """Replace run references in ``config["best_of_n"]`` by their final_model folders (in
    place) and return the run ids the job must wait for; nothing for another suite."""
    if config.get("suite") != SUITE:
        return []
    section = config.get(SUITE) or {}
    runs = []
    for kind in SCORER_KINDS:
        value = section.get(kind)
        run_id = _run_id(value) if isinstance(value, str) and value.strip() else None
        if run_id is None:
            continue
        section[kind] = _checked_final_model(kind, run_id)
        runs.append(run_id)
    return runs
