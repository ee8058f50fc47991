"""An identical launch: one whose resolved config (the seed included) equals that of a queued,
starting or running run of the same family. It would repeat that run's work rather than add a
sample, so the lab refuses it naming the run (another seed, or ``force``, launches it).
Torch-free; only the unfinished runs' ``config.yaml`` files are read."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlhf_lab.errors import Conflict, NextStep

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = ["check_not_identical", "identical_runs"]


def identical_runs(family: str, config: TrainerConfig) -> list[tuple[str, str]]:
    """(id, state) of the queued, starting or running runs of ``family`` whose resolved config
    (the seed included) equals ``config``, oldest first. Only unfinished runs are read
    (:func:`rlhf_lab.runs.state.unfinished_runs`)."""
    from rlhf_lab.planning.trainer_config import read_run_config
    from rlhf_lab.runs.state import unfinished_runs

    out = []
    for status in unfinished_runs():
        if status.family != family:
            continue
        if read_run_config(Path(status.run_dir), config.family) == config:
            out.append((status.id, status.state))
    return out


def check_not_identical(family: str, config: TrainerConfig, *, force: bool = False) -> None:
    """Refuse (Conflict) a launch whose resolved config and seed equal those of a queued or
    running run: it would repeat that run's work, not add a seed. ``force`` launches it
    anyway."""
    if force:
        return
    same = identical_runs(family, config)
    if not same:
        return
    run_id, state = same[0]
    more = f" (and {len(same) - 1} more)" if len(same) > 1 else ""
    seed = config.get("seed")
    raise Conflict(
        f"run {run_id} is {state} with the same resolved config and seed ({seed}){more}: an "
        "identical launch repeats its work; change the seed for another sample, or force it",
        next=[
            NextStep("run_status", {"run_id": run_id}, note="follow the identical run"),
            NextStep("launch_run", {"overrides": [f"seed={_other_seed(seed)}"]}),
            NextStep("launch_run", {"force": True}, note="run it anyway"),
        ],
    )


def _other_seed(seed: object) -> int:
    return seed + 1 if isinstance(seed, int) and not isinstance(seed, bool) else 1
