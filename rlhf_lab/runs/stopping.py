"""Stopping a run: SIGTERM to its process group so the trainer checkpoints its last completed
step and ends ``stopped``; SIGKILL after a grace period (the run is then ``killed``); a queued
run is only marked; a Slurm run is cancelled through Slurm. Torch-free."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from pydantic import Field

from rlhf_lab.paths import find_run
from rlhf_lab.runs.folder import (
    read_exit,
    read_process,
    read_summary,
)
from rlhf_lab.runs.process import _alive, _run_lock, _signal_run
from rlhf_lab.runs.records import (
    TERMINAL_STATES,
    RunStatus,
    _atomic_write_json,
    _now,
    _read_record,
    _read_run_json,
)
from rlhf_lab.runs.state import KILLED_ERROR, _status

# How long a stop waits for the trainer to checkpoint and exit before it sends SIGKILL: long
# enough for a small model's checkpoint; a big model's may need more (stop_run's grace_s).
STOP_GRACE_S = 60.0


class StopResult(RunStatus):
    """What a stop did: the run's status afterwards, in words, and what a resume continues
    from."""

    message: str = Field(description="what happened to the run and what was saved or lost")
    last_checkpoint_step: int | None = Field(
        default=None, description="the step a resume continues from (None: no checkpoint)"
    )


def stop_run(run_id: str, grace_s: float = STOP_GRACE_S) -> StopResult:
    """SIGTERM to the run's process group: the trainer checkpoints its last completed step,
    writes outcome ``stopped`` and exits (within seconds, wherever it is). Returns as soon as
    the process is gone; after ``grace_s`` seconds it sends SIGKILL and the run is ``killed``
    (work since the last checkpoint lost) unless the trainer had written outcome ``stopped``.
    A queued run is just marked stopped; a finished run is returned unchanged."""
    run_dir = find_run(run_id)
    status = _status(run_dir)
    if status.terminal:  # already over (this also notices a run that just ended)
        return _stop_result(run_dir, status, grace_s, already=True)
    if status.slurm_job or (_read_run_json(run_dir) or {}).get("slurm"):
        return _stop_slurm(run_dir, status, grace_s)
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        if record.get("state") in TERMINAL_STATES:
            return _stop_result(run_dir, _status(run_dir), grace_s, already=True)
        record["stop_requested_at"] = _now()
        if record.get("state") == "queued" or (
            record.get("state") == "starting" and not record.get("pid")
        ):
            record.update(state="stopped", ended_at=record["stop_requested_at"])
        _atomic_write_json(run_dir / "run.json", record)
    if record.get("state") == "stopped":
        return _stop_result(run_dir, _status(run_dir), grace_s, never_started=True)

    proc_info, _ = read_process(run_dir)
    _signal_run(run_dir, record, proc_info, signal.SIGTERM)
    deadline = time.time() + max(grace_s, 0.0)
    while time.time() < deadline and _alive(run_dir, record, proc_info):
        time.sleep(0.1)
    if _alive(run_dir, record, read_process(run_dir)[0]):
        with _run_lock(run_dir):  # recorded first: whoever derives the state next sees it
            record = _read_record(run_dir)
            record["killed_at"] = _now()
            _atomic_write_json(run_dir / "run.json", record)
        _signal_run(run_dir, record, read_process(run_dir)[0], signal.SIGKILL)
        end = time.time() + 5.0
        while time.time() < end and _alive(run_dir, record, proc_info):
            time.sleep(0.05)
        _settle_killed(run_dir)
    return _stop_result(run_dir, _status(run_dir), grace_s)


def _stop_slurm(run_dir: Path, status: RunStatus, grace_s: float) -> StopResult:
    """Stop a Slurm run: a pending job is cancelled (``stopped``, it never started); a running
    one gets SIGTERM in its steps and, after ``grace_s``, is cancelled (``killed``)."""
    from rlhf_lab.runs.slurm import job_state, stop_slurm_run

    job_id = status.slurm_job or ""
    slurm_state = job_state(job_id)[0] if job_id else None  # Unavailable: nothing written yet
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        record["stop_requested_at"] = _now()
        _atomic_write_json(run_dir / "run.json", record)
    pending = status.state == "queued"
    cancelled = stop_slurm_run(job_id, slurm_state, grace_s)
    if pending or cancelled:
        with _run_lock(run_dir):
            record = _read_record(run_dir)
            if cancelled:
                record.update(killed_at=_now(), state="killed", error=KILLED_ERROR)
            else:
                record["state"] = "stopped"
            record["ended_at"] = _now()
            _atomic_write_json(run_dir / "run.json", record)
    final = _status(run_dir)
    deadline = time.time() + 30
    while not final.terminal and time.time() < deadline:  # the job is leaving Slurm's queue
        time.sleep(0.5)
        final = _status(run_dir)
    return _stop_result(run_dir, final, grace_s, never_started=pending)


def _settle_killed(run_dir: Path) -> None:
    """After the stop's SIGKILL: ``killed`` unless the trainer wrote outcome ``stopped`` (it
    had checkpointed and was only slow to exit). A reader that settled the run as ``stopped``
    between the grace period and the kill is corrected here."""
    summary, _ = read_summary(run_dir)
    if summary is not None and summary.outcome == "stopped":
        return
    with _run_lock(run_dir):
        record = _read_record(run_dir)
        if record.get("state") in ("killed", "succeeded", "failed", "died"):
            return
        exit_info, _ = read_exit(run_dir)
        record.update(state="killed", error=KILLED_ERROR)
        record["ended_at"] = exit_info.ended_at if exit_info and exit_info.ended_at else _now()
        if exit_info is not None:
            record["exit_code"], record["signal"] = exit_info.exit_code, exit_info.signal
        _atomic_write_json(run_dir / "run.json", record)


def _last_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest complete checkpoint (``checkpoints/step-<N>`` with a state.pt, the
    rule resume uses), or None."""
    steps = [
        int(p.name.removeprefix("step-"))
        for p in (run_dir / "checkpoints").glob("step-*")
        if p.name.removeprefix("step-").isdigit() and (p / "state.pt").is_file()
    ]
    return max(steps, default=None)


def _stop_result(
    run_dir: Path,
    status: RunStatus,
    grace_s: float,
    *,
    already: bool = False,
    never_started: bool = False,
) -> StopResult:
    """The status after a stop, with a sentence on what was saved or lost."""
    last = _last_checkpoint_step(run_dir)
    resume = (
        f"resume continues from checkpoint step {last}"
        if last is not None
        else "there is no checkpoint: launch it again to train"
    )
    if never_started:
        message = f"{status.id} had not started; it will not run (state stopped)"
    elif already:
        message = f"{status.id} had already ended ({status.state}); nothing was done"
    elif status.state == "killed":
        lost = (
            f"work after checkpoint step {last} is lost"
            if last is not None
            else "no checkpoint was written: everything it did is lost"
        )
        message = (
            f"{status.id} killed: the trainer did not end within {grace_s:g} s of SIGTERM and "
            f"was sent SIGKILL; {lost}; {resume}"
        )
    elif status.state == "stopped":
        summary, _ = read_summary(run_dir)
        said = (
            summary.detail
            if summary is not None and summary.detail
            else "the trainer ended on SIGTERM before it wrote how it stopped (still starting)"
        )
        message = f"{status.id} stopped: {said}; {resume}"
    else:
        message = f"{status.id} ended {status.state}" + (
            f": {status.error}" if status.error else ""
        )
    return StopResult(**status.model_dump(), message=message, last_checkpoint_step=last)
