"""Slurm runs in the lab's run model: submit a new run, resubmit one to resume it, and the state
and stop hooks :mod:`rlhf_lab.runs.state` calls for a run whose run.json has a ``slurm`` block.
Torch-free. (What is Slurm's own, the script and the commands, is :mod:`rlhf_lab.runs.slurm`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlhf_lab.errors import LabError
from rlhf_lab.runs.records import (
    LaunchResult,
    _atomic_write_json,
    _info,
    _now,
    _read_record,
    _source_dir,
)
from rlhf_lab.runs.slurm import (
    SlurmOptions,
    check_slurm_available,
    checked_options,
    job_script,
    slurm_block,
    submit,
)

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.runs.launcher import NewRun

__all__ = ["resubmit", "resume_if_slurm", "submit_slurm_run"]


def submit_slurm_run(run: NewRun, options: SlurmOptions) -> LaunchResult:
    """Create the run folder, write its job script and submit it with sbatch (state ``queued``
    while Slurm holds it pending). Slurm missing or bad options are refused before anything is
    written; a failed sbatch marks the run failed with sbatch's words."""
    from rlhf_lab.runs.devices import Placement
    from rlhf_lab.runs.launcher import _mark_failed, prepare_run
    from rlhf_lab.runs.process import _run_lock

    checked_options(options)
    check_slurm_available()
    placement = Placement(nproc=options.ranks_per_node, distributed=True)
    update = {"placement": placement, "slurm": slurm_block(options, None)}
    info = prepare_run(run.model_copy(update=update), state="queued")
    run_dir = Path(info.run_dir)
    script = job_script(info.id, run.family, run_dir, options, source_dir=_source_dir())
    try:
        job_id = submit(run_dir, script)
    except LabError as err:
        _mark_failed(run_dir, f"sbatch failed: {err.message}")
        raise
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        record.update(slurm=slurm_block(options, job_id), submitted_at=_now())
        _atomic_write_json(run_dir / "run.json", record)
    where = f"{options.nodes} node(s) × {options.ranks_per_node} rank(s)"
    return LaunchResult(
        run=_info(run_dir, record),
        state="queued",
        queued=True,
        device="slurm",
        message=f"submitted {info.id} to Slurm as job {job_id} ({where}); script {run_dir}/job.sh",
    )


def resubmit(run_id: str, from_step: int) -> LaunchResult:
    """Resume a Slurm run: archive the last attempt (as a local resume does) and submit the job
    script again with ``--resume`` (a new job; run.json keeps every job id)."""
    from rlhf_lab.paths import find_run
    from rlhf_lab.runs.process import _run_lock
    from rlhf_lab.runs.resume import _archive_attempt, read_still_resumable

    run_dir = find_run(run_id)
    check_slurm_available()
    with _run_lock(run_dir):
        record = read_still_resumable(run_id, run_dir)
        previous = dict(record.get("slurm") or {})
        known = set(SlurmOptions.model_fields)
        options = SlurmOptions(**{k: v for k, v in previous.items() if k in known})
        record = _archive_attempt(run_dir, record, from_step, ["slurm"])
        record.pop("devices", None)
        record.update(state="queued", device="slurm")
        script = job_script(
            run_id, record["family"], run_dir, options, source_dir=_source_dir(), resume=True
        )
        job_id = submit(run_dir, script)
        record["slurm"] = slurm_block(options, job_id, previous)
        _atomic_write_json(run_dir / "run.json", record)
    return LaunchResult(
        run=_info(run_dir, record),
        state="queued",
        queued=True,
        device="slurm",
        message=f"resubmitted {run_id} as Slurm job {job_id}; it resumes from checkpoint step "
        f"{from_step}",
    )


def resume_if_slurm(run_id: str) -> LaunchResult | None:
    """Resubmit ``run_id`` when it is a Slurm run that can be resumed (the local resume's rule:
    died, stopped, killed or failed, with a checkpoint); None for a local run."""
    from rlhf_lab.paths import find_run
    from rlhf_lab.runs.records import _read_run_json
    from rlhf_lab.runs.resume import _check_resumable
    from rlhf_lab.runs.state import _status

    run_dir = find_run(run_id)
    if not (_read_run_json(run_dir) or {}).get("slurm"):
        return None
    steps = _check_resumable(run_id, _status(run_dir).state, run_dir)
    return resubmit(run_id, from_step=steps[-1])
