"""The launch checks of a run on several devices or ranks (torchrun) and of a Slurm job: the
world size against the config's batches, and the per-rank memory estimate against EACH device's
free memory (on the CPU the ranks share the RAM: ranks × per-rank estimate). Torch-free.

Free and total memory come from :func:`rlhf_lab.runs.machine.this_machine` at the call; the
refusal beside a busy run comes from the caller (:func:`rlhf_lab.api.device_busy_error`, passed
in so that this module does not import the API back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf_lab.errors import Conflict, InvalidArgument, LabError, NextStep
from rlhf_lab.runs.devices import Placement

__all__ = [
    "check_placement",
    "per_rank_estimate_gb",
    "pick_devices",
    "slurm_options",
]


def per_rank_estimate_gb(
    family: str, algorithm: str, data: dict, device: str, world_size: int
) -> tuple[float | None, str]:
    """(peak GiB of ONE rank on ``device`` or None, why there is none): the FSDP2 estimate of
    :func:`rlhf_lab.planning.memory.estimate_memory` with ``world_size``."""
    from rlhf_lab.planning.memory import estimate_memory
    from rlhf_lab.planning.trainer_config import TrainerConfig

    try:
        kind = "cpu" if device == "cpu" else "cuda"
        config = TrainerConfig(family, data)
        est = estimate_memory(family, algorithm, config, device=kind, world_size=world_size)
        return est.total_gb, ""
    except LabError as err:
        return None, f"no memory estimate ({err.message})"


def pick_devices(placement: Placement) -> Placement:
    """A placement whose GPUs the lab picks, with them picked now: the freest GPUs no lab run
    holds, else the freest GPUs (the busy-device check then names the run holding them)."""
    from rlhf_lab.runs.devices import freest_gpus
    from rlhf_lab.runs.launcher import _held_devices

    if placement.devices:
        return placement
    wanted = placement.gpus_wanted or 1
    chosen = freest_gpus(wanted, _held_devices()) or freest_gpus(wanted, set()) or []
    return placement.model_copy(update={"devices": chosen, "gpus_wanted": 0})


def check_placement(
    family: str,
    algorithm: str,
    data: dict,
    placement: Placement,
    *,
    queue: bool,
    busy_error: Callable[..., Exception],
) -> tuple[bool | None, list[str]]:
    """The memory and busy-device rule of :func:`rlhf_lab.api._check_memory` for a run on
    several devices or ranks: every device must fit one rank's estimate (the CPU: all ranks');
    returns (``fits_together``, warnings). A run whose GPUs are picked at start (queued) is
    checked against the largest GPU's total memory. ``busy_error`` makes the refusal beside a
    busy run (:func:`rlhf_lab.api.device_busy_error`)."""
    from rlhf_lab.planning.memory import fits
    from rlhf_lab.runs import active_runs, visible_gpus
    from rlhf_lab.runs.machine import this_machine

    world = placement.nproc if placement.distributed else 1
    devices = placement.devices
    if not devices:  # picked when it starts: the largest GPU decides whether it ever can
        gpus = sorted(visible_gpus(), key=lambda g: -g.total_gb)
        devices = [f"cuda:{gpus[0].index}"] if gpus else ["cpu"]
        queue = True
    kind = devices[0]
    estimate, why = per_rank_estimate_gb(family, algorithm, data, kind, world)
    warnings = [f"{why}: the memory fit was not checked"] if estimate is None else []
    if estimate is None:
        return None, warnings
    ranks_here = world if kind == "cpu" else 1  # CPU ranks share one RAM
    need = estimate * ranks_here
    label = f"~{estimate:.2f} GiB per rank" + (f" × {ranks_here} ranks" if ranks_here > 1 else "")
    together = False
    for device in dict.fromkeys(devices):
        if queue:
            total = this_machine().device_total_gb(device)
            if total is not None and not fits(need, total):
                raise _refusal(device, label, total, "all the memory", queued=True)
            continue
        busy = active_runs(device)
        free = this_machine().device_free_gb(device)
        ok = None if free is None else fits(need, free)
        if busy:
            if not ok:
                raise busy_error(device, busy, ok, estimate_gb=need, free_gb=free)
            together = True
        elif ok is False:
            raise _refusal(device, label, free, "the free memory")
    return (True if together else None), warnings


def _refusal(device: str, label: str, have: float, what: str, queued: bool = False) -> Conflict:
    where = "RAM" if device == "cpu" else f"memory of {device}"
    tail = "queued, it could never start" if queued else "it would likely run out of memory"
    return Conflict(
        f"the memory estimate of this run ({label}) does not fit {what} of the {where} "
        f"({have:.2f} GiB, 10% margin kept); {tail}",
        next=[
            NextStep("estimate_memory", note="per rank, for more devices or ranks"),
            NextStep(
                "shrink_config",
                note="lower train.batch_size or data.max_length, "
                "model.gradient_checkpointing=true, or a smaller model",
            ),
            NextStep("launch_run", {"force": True}, note="start anyway, at the risk of an OOM"),
        ],
    )


def slurm_options(slurm: dict[str, Any]) -> Any:
    """The Slurm options of a launch, or one InvalidArgument naming the bad ones."""
    from pydantic import ValidationError

    from rlhf_lab.runs.slurm import SlurmOptions, checked_options

    try:
        return checked_options(SlurmOptions.model_validate(slurm))
    except ValidationError as err:
        bad = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'slurm'}: {e['msg']}" for e in err.errors()
        )
        raise InvalidArgument(f"bad Slurm options ({bad})") from None


def slurm_job_preview(recipe: str, slurm: dict[str, Any]) -> str:
    """The job script a Slurm launch of ``recipe`` would write and submit, with ``<run-dir>``
    and ``<run-id>`` standing for the run folder and id it gets (nothing is written)."""
    from rlhf_lab.api.recipes import find_known_recipe
    from rlhf_lab.runs.records import _source_dir
    from rlhf_lab.runs.slurm import job_script

    options = slurm_options(slurm)
    family = find_known_recipe(recipe).family
    return job_script("<run-id>", family, "<run-dir>", options, source_dir=_source_dir())
