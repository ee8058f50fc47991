"""Resuming a run: a died, stopped, killed or failed run starts again from its last checkpoint in
the same folder (the trainer runs with ``--resume``), the previous attempt's files kept under
``attempts/<n>/``; a cancelled run (it never started) is queued again once its upstream runs
are no longer failed. The device rule of :func:`rlhf_lab.runs.launcher.start_or_queue` applies.
Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlhf_lab.errors import Conflict, NextStep, NotFound, NotReady
from rlhf_lab.paths import find_run
from rlhf_lab.runs.devices import resolve_device
from rlhf_lab.runs.launcher import (
    _busy_error,
    _busy_on,
    _ensure_queue_worker,
    _mark_failed,
    _start,
)
from rlhf_lab.runs.process import _devices_hold, _run_lock
from rlhf_lab.runs.records import (
    LaunchResult,
    _atomic_write_json,
    _info,
    _now,
    _read_record,
)
from rlhf_lab.runs.state import _status, held_devices

__all__ = ["RESUMABLE_STATES", "resume_run"]

RESUMABLE_STATES = ("died", "stopped", "killed", "failed")
_ATTEMPT_FILES = ("exit.json", "process.json", "summary.json")


def _checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints (``checkpoints/step-<N>``; temp folders are partial)."""
    steps = []
    for path in (run_dir / "checkpoints").glob("step-*"):
        tail = path.name.removeprefix("step-")
        if path.is_dir() and tail.isdigit() and (path / "state.pt").is_file():
            steps.append(int(tail))
    return sorted(steps)


def _check_resumable(run_id: str, state: str, run_dir: Path) -> list[int]:
    """The run's checkpoint steps, or a typed error when it cannot be resumed."""
    if state not in RESUMABLE_STATES:
        if state == "succeeded":
            raise Conflict(
                f"run {run_id} is succeeded; only a died, stopped or failed run can be resumed "
                "(it finished; launch a new run to train further)",
                next=NextStep("launch_run", note="a new run"),
            )
        if state == "queued":
            raise NotReady(
                f"run {run_id} is queued; only a died, stopped or failed run can be resumed "
                "(it has not started yet)",
                next=NextStep("run_status", {"run_id": run_id}),
            )
        raise NotReady(
            f"run {run_id} is {state}; only a died, stopped or failed run can be resumed "
            "(stop it first)",
            next=NextStep("stop_run", {"run_id": run_id}),
        )
    steps = _checkpoint_steps(run_dir)
    if not steps:
        raise NotFound(
            f"run {run_id} has no checkpoint in {run_dir / 'checkpoints'} (it ended before the "
            "first one; `checkpoint.save_every` sets how often they are written); launch it "
            "again instead",
            next=NextStep("launch_run", note="the same config, as a new run"),
        )
    return steps


def read_still_resumable(run_id: str, run_dir: Path) -> dict:
    """run.json read again under the run's lock, or Conflict when the run left the resumable
    states since it was checked (a resume that raced another one, or a relaunch)."""
    record = _read_record(run_dir)
    if record.get("state") not in RESUMABLE_STATES:
        raise Conflict(
            f"run {run_id} became {record.get('state')} meanwhile; not resumed",
            next=NextStep("run_status", {"run_id": run_id}),
        )
    return record


def _archive_attempt(run_dir: Path, record: dict, from_step: int, devices: list[str]) -> dict:
    """Record how the previous attempt ended (run.json ``resumes``), move its exit/process/
    summary files to ``attempts/<n>/`` and mark the run ``starting`` again. Returns the record."""
    previous = {
        k: record.get(k)
        for k in ("state", "started_at", "ended_at", "exit_code", "signal", "error")
    }
    previous.update(from_step=from_step, resumed_at=_now())
    resumes = [*record.get("resumes", []), previous]
    keep = run_dir / "attempts" / str(len(resumes))
    keep.mkdir(parents=True, exist_ok=True)
    for name in _ATTEMPT_FILES:  # a stale exit/summary must not decide the new state
        if (run_dir / name).exists():
            os.replace(run_dir / name, keep / name)
    for key in (
        "pid",
        "pgid",
        "create_time",
        "ended_at",
        "exit_code",
        "signal",
        "error",
        "stop_requested_at",
        "killed_at",
        "started_at",
    ):
        record.pop(key, None)
    record.update(state="starting", starting_at=_now(), device=devices[0], resumes=resumes)
    if len(devices) > 1 or record.get("devices"):
        record["devices"] = list(devices)
    _atomic_write_json(run_dir / "run.json", record)
    return record


def _rearm_cancelled(run_id: str, run_dir: Path, dev: str) -> LaunchResult:
    """ "Resuming" a cancelled run (it never started): queue it again when none of its upstream
    runs is failed any more (each was resumed or is running), else say which to resume."""
    from rlhf_lab.runs.deps import failed_upstream, rearm

    record = _read_record(run_dir)
    failed = failed_upstream(record)
    if failed:
        up, state = failed
        raise NotReady(
            f"run {run_id} was cancelled because upstream run {up} is {state or 'gone'}; "
            f"resume {up} first (that re-arms {run_id})",
            next=NextStep("resume_run", {"run_id": up}),
        )
    if not rearm(run_dir):
        raise Conflict(
            f"run {run_id} is no longer cancelled; not re-armed",
            next=NextStep("run_status", {"run_id": run_id}),
        )
    _ensure_queue_worker()
    info = _info(run_dir, _read_record(run_dir))
    return LaunchResult(
        run=info,
        state="queued",
        queued=True,
        device=dev,
        message=f"{run_id} never started (cancelled); queued again after {', '.join(info.after)}",
    )


def resume_run(
    run_id: str,
    *,
    device: str | None = None,
    force: bool = False,
    fits_together: bool | None = None,
) -> LaunchResult:
    """Start a died, stopped or failed run again from its last checkpoint, in the same folder.

    The trainer runs with ``--resume``: it loads the model, optimizer, scheduler, RNG and data
    position of the last checkpoint and drops the metrics rows logged after it, so the run ends
    where an uninterrupted one would. How the previous attempt ended is kept in run.json
    (``resumes``) and its exit/process/summary files are moved to ``attempts/<n>/``.
    The device rule of :func:`launch` applies.
    """
    run_dir = find_run(run_id)
    status = _status(run_dir)
    if status.state == "cancelled":
        return _rearm_cancelled(run_id, run_dir, status.device or "cpu")
    steps = _check_resumable(run_id, status.state, run_dir)
    record = _read_record(run_dir)
    if record.get("slurm"):
        raise Conflict(
            f"run {run_id} is a Slurm job: it resumes as a new job (rlhf_lab.api.resume_run)",
            next=NextStep("resume_run", {"run_id": run_id}),
        )
    devices = held_devices(record) if device is None else []
    if len(devices) <= 1:  # a run on several devices resumes on the same set (same world size)
        devices = [resolve_device(device or status.device or "auto")]
    dev = ",".join(devices)
    with _devices_hold():
        busy = _busy_on(devices, exclude=run_id)
        if busy and not force and not fits_together:
            raise _busy_error(dev, busy, None, resuming=run_id)
        with _run_lock(run_dir):
            record = read_still_resumable(run_id, run_dir)
            _archive_attempt(run_dir, record, steps[-1], devices)
        try:
            info = _start(run_id)
        except Exception as err:
            _mark_failed(run_dir, f"could not start: {err}")
            raise
    msg = f"resumed {run_id} from checkpoint step {steps[-1]} on {dev} (pid {info.pid})"
    from rlhf_lab.runs.deps import rearm_dependents

    rearmed = rearm_dependents(run_id)
    if rearmed:
        _ensure_queue_worker()
        msg += f"; its dependents {', '.join(rearmed)} are queued again and wait for it"
    return LaunchResult(
        run=info,
        state="running",
        device=devices[0],
        devices=devices,
        sharing_device_with=[s.id for s in busy],
        message=msg,
        rearmed=rearmed,
    )
