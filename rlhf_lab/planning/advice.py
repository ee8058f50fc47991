"""What a plan tells the reader to do and check: the launch steps (plain, reward model then
scorer, an evaluation after training), each algorithm's key metrics, acceptance and watch items
(shared ones once), and the runs' warnings merged. Torch-free."""

from __future__ import annotations

from rlhf_lab.planning.catalog import acceptance_for, key_metrics_for, watch_for
from rlhf_lab.planning.plan_models import Criteria, PlannedRun


def scorer_steps(runs: list[PlannedRun], dated: str) -> list[str]:
    rm = [r.name for r in runs if r.family == "reward_models"]
    dependent = [r.name for r in runs if r.after]
    free = [r.name for r in runs if not r.after and r.family != "reward_models"]
    ids = ", ".join(f"<{n}-run-id>" for n in rm)
    return [
        f"1. launch the reward models {', '.join(rm)} (and {', '.join(free)}, which needs no "
        "reward model) with their launch_command; note each run id launch prints",
        f"2. launch {', '.join(dependent)} with their launch_command, replacing {ids} with those "
        f"run ids: each is queued and starts once its reward model has succeeded (wait until "
        f"{' and '.join(rm)} have succeeded; a failed one cancels its dependents)",
        "3. record_results on every run, then compare the rejection-sampling runs together "
        "(compare_runs) and the reward models together",
    ]


def evaluation_steps(runs: list[PlannedRun], number: int) -> list[str]:
    """An evaluation after every training run, with its cost (rlhf_lab.evaluation.cost)."""
    from rlhf_lab.evaluation.cost import plan_evaluation_step

    step = plan_evaluation_step(runs, number)
    return [step] if step else []


def plain_steps(runs: list[PlannedRun]) -> list[str]:
    names = ", ".join(r.name for r in runs)
    if len(runs) == 1:
        return [f"1. launch {names} with its launch_command, then poll its status until it ends"]
    return [
        f"1. launch {names} with their launch_command: each queues behind the jobs already on "
        "its device (one training job per device), so they run one after another",
        "2. record_results on every run, then compare_runs on them together",
    ]


def criteria_for(runs: list[PlannedRun]) -> list[Criteria]:
    """Each algorithm's key metrics, acceptance and watch items, those its family shares in the
    plan listed once for all of them."""
    by_family: dict[str, list[str]] = {}
    for run in runs:
        algos = by_family.setdefault(run.family, [])
        if run.algorithm not in algos:
            algos.append(run.algorithm)
    out: list[Criteria] = []
    for family, algos in by_family.items():
        own = {
            a: Criteria(
                algorithms=[a],
                key_metrics=key_metrics_for(family, a),
                acceptance=acceptance_for(family, a),
                watch=watch_for(family, a),
            )
            for a in algos
        }
        first = own[algos[0]]
        shared = Criteria(
            algorithms=algos,
            **{
                field: [
                    x
                    for x in getattr(first, field)
                    if all(x in getattr(c, field) for c in own.values())
                ]
                for field in ("key_metrics", "acceptance", "watch")
            },
        )
        if len(algos) > 1 and shared:
            out.append(shared)
            for a, c in own.items():
                rest = Criteria(
                    algorithms=[a],
                    **{
                        field: [x for x in getattr(c, field) if x not in getattr(shared, field)]
                        for field in ("key_metrics", "acceptance", "watch")
                    },
                )
                if rest:
                    out.append(rest)
        else:
            out.extend(own.values())
    return out


def merged_warnings(per_run: list[tuple[str, list[str]]]) -> list[str]:
    """Each warning once: as it is when every run has it, else prefixed with the runs it
    concerns."""
    seen: dict[str, list[str]] = {}
    for name, warnings in per_run:
        for w in warnings:
            seen.setdefault(w, []).append(name)
    return [
        text if len(per_run) == 1 or len(names) == len(per_run) else f"{', '.join(names)}: {text}"
        for text, names in seen.items()
    ]
