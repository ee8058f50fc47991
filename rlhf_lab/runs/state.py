"""A run's state, derived from its folder and the live process table; status, listing, stop and
waiting. Torch-free.

States: ``queued -> starting -> running -> succeeded | failed | stopped | killed | died`` (the
set of :mod:`trainers.core.runfolder`). ``stopped`` means a stop was honoured: the trainer wrote
its checkpoint and outcome ``stopped`` (or ended on SIGTERM before it had done anything).
``killed`` means a stop gave up waiting for that (``stop_run``'s grace period) and sent SIGKILL:
work since the last checkpoint is lost. ``died`` means the processes are gone with no exit status
(``exit.json`` missing: SIGKILL to the group, OOM killer, reboot) or the trainer was killed by
SIGKILL while nobody asked it to stop. Every state is derived from disk, so a status query works
from any process, long after the launcher is gone; run.json's recorded state is updated
(atomically, under the run's lock) when the derived one differs.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from rlhf_lab.errors import Corrupt, InvalidArgument, LabError, NextStep
from rlhf_lab.paths import check_slug, experiments_dir, find_run
from rlhf_lab.runs.devices import resolve_device
from rlhf_lab.runs.folder import (
    last_train_eval,
    live_clock,
    phase_count_text,
    read_exit,
    read_process,
    read_progress,
    read_summary,
    tail_metric_rows,
)
from rlhf_lab.runs.log import tail_log
from rlhf_lab.runs.process import _alive, _run_lock
from rlhf_lab.runs.records import (
    ACTIVE_STATES,
    STATES,
    TERMINAL_STATES,
    UNFINISHED_STATES,
    RunStatus,
    _atomic_write_json,
    _checked_run_file,
    _now,
    _parse_time,
    _read_record,
    _read_run_json,
)
from rlhf_lab.runs.supervisor import supervisor
from trainers.core.runfolder import ExitFile, ProcessFile, ProgressFile, SummaryFile

__all__ = [
    "active_runs",
    "follow_run",
    "list_runs",
    "queued_runs",
    "run_state",
    "unfinished_runs",
    "wait_for_end",
]

KILLED_ERROR = (
    "the trainer did not end within the stop's grace period after SIGTERM and was killed "
    "(SIGKILL); work since its last checkpoint is lost"
)


# ---------------------------------------------------------------------------------------------
# Deriving the state
# ---------------------------------------------------------------------------------------------


def _state_from_exit(
    exit_info: ExitFile, outcome: str | None, stop: bool
) -> tuple[str, str | None]:
    """(state, error) of a run whose wrapper wrote how the trainer process ended."""
    sig, code = exit_info.signal, exit_info.exit_code
    if sig == signal.SIGKILL and not stop:
        return "died", "the trainer was killed by SIGKILL (signal 9; the OOM killer does this)"
    if outcome == "stopped" or (stop and (sig or code not in (0, None))):
        return "stopped", None
    if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        return "stopped", f"ended by signal {sig}"
    if code == 0 and not sig:
        return "succeeded", None
    if sig:
        return "failed", f"the trainer ended by signal {sig}"
    return "failed", None


def _derive_state(
    record: dict,
    alive: bool,
    exit_info: ExitFile | None,
    summary: SummaryFile | None,
    proc_info: ProcessFile | None = None,
) -> tuple[str, str | None]:
    """(state, error) from what is on disk and whether the processes live. A ``starting`` run
    with no pid whose wrapper wrote process.json or exit.json was started (its launcher died
    before recording the pid): those files decide, not the start timeout."""
    state = record.get("state")
    if state not in STATES:
        state = "died"
    if state in TERMINAL_STATES or state == "queued":
        return state, None
    if alive:
        return "running", None
    if state == "starting" and not record.get("pid") and proc_info is None and exit_info is None:
        created = _parse_time(record.get("starting_at") or record.get("created_at"))
        watch = supervisor()  # its start timeout and clock
        if created is not None and watch.clock() - created > watch.starting_timeout_s:
            return "died", "the launcher exited before it started the process"
        return "starting", None

    outcome = summary.outcome if summary else None
    stop = bool(record.get("stop_requested_at"))
    if record.get("killed_at") and outcome != "stopped":
        return "killed", KILLED_ERROR
    if exit_info is not None:
        return _state_from_exit(exit_info, outcome, stop)
    if outcome in ("succeeded", "failed", "stopped"):
        return outcome, None
    if stop:
        return "stopped", None
    return "died", "the process ended without an exit status (SIGKILL, OOM killer or reboot)"


def run_state(run_id: str) -> RunStatus:
    """The run's state derived from run.json, exit.json, summary.json and the process table;
    run.json's state is updated (atomically) when it changed."""
    return _status(find_run(run_id))


def _status(run_dir: Path) -> RunStatus:
    record = _read_record(run_dir)
    _checked_run_file(run_dir, record)
    if record.get("slurm"):
        return _slurm_status(run_dir, record)
    proc_info, _ = read_process(run_dir)
    alive = record.get("state") in ACTIVE_STATES and _alive(run_dir, record, proc_info)
    # Read exit.json / summary.json only after the liveness check: the wrapper writes exit.json
    # before it exits, so "gone and no exit.json" really means no exit status.
    exit_info, _ = read_exit(run_dir)
    summary, _ = read_summary(run_dir)
    state, error = _derive_state(record, alive, exit_info, summary, proc_info)
    if state != record.get("state"):
        record, state, error = _update_record(run_dir, alive, exit_info, summary, proc_info)
    progress, _ = read_progress(run_dir)
    try:
        files = TrainerFiles(proc_info, exit_info, summary, progress)
        return _build_status(run_dir, record, state, alive, files, error)
    except ValidationError as err:  # valid JSON holding a value of the wrong type (hand-edited)
        where = ".".join(str(part) for part in err.errors()[0]["loc"])
        raise Corrupt(
            f"{run_dir}: a run file holds a value of the wrong type for {where!r} "
            f"({err.errors()[0]['msg']}); fix run.json, progress.json, exit.json or summary.json"
        ) from None


def _slurm_status(run_dir: Path, record: dict) -> RunStatus:
    """The status of a Slurm run: Slurm says whether the job waits or runs; once it is over,
    Slurm's final state (a time limit, a node failure ...) or else the lab's exit record and
    the trainer's summary decide (:func:`rlhf_lab.runs.slurm.slurm_run_state`). The state seen is
    written to run.json, with Slurm's in its ``slurm`` block."""
    from rlhf_lab.runs.slurm import slurm_run_state

    proc_info, _ = read_process(run_dir)
    exit_info, _ = read_exit(run_dir)
    summary, _ = read_summary(run_dir)
    ended = {**record, "state": "running", "pid": record.get("pid") or -1}
    local = _derive_state(ended, False, exit_info, summary, proc_info)
    warned = exit_info is not None and exit_info.slurm_time_limit_signal
    state, error, alive, slurm_state = slurm_run_state(record, exit_info is not None, local, warned)
    block = record.get("slurm") or {}
    if state != record.get("state") or (slurm_state and slurm_state != block.get("state")):
        with _run_lock(run_dir):
            record = _read_run_json(run_dir) or record
            record["slurm"] = {**(record.get("slurm") or {}), "state": slurm_state}
            if state in TERMINAL_STATES and record.get("state") not in TERMINAL_STATES:
                record["ended_at"] = _ended_at(run_dir, exit_info)
                if exit_info is not None:
                    record["exit_code"], record["signal"] = exit_info.exit_code, exit_info.signal
                if error:
                    record["error"] = error
            if record.get("state") != "running" and state == "running":
                record["started_at"] = record.get("started_at") or _now()
            record["state"] = state
            try:
                _atomic_write_json(run_dir / "run.json", record)
            except OSError:
                pass
    progress, _ = read_progress(run_dir)
    files = TrainerFiles(proc_info, exit_info, summary, progress)
    status = _build_status(run_dir, record, state, alive, files, error)
    if error and state == "failed" and (slurm_state in _slurm_failures() or warned):
        status.error = error  # Slurm's reason comes first (the trainer only saw a SIGTERM)
    status.slurm_job = str(block.get("job_id")) if block.get("job_id") else None
    status.slurm_state = slurm_state
    return status


def _slurm_failures() -> set[str]:
    from rlhf_lab.runs.slurm import FAILED_BY_SLURM

    return set(FAILED_BY_SLURM)


def _ended_at(run_dir: Path, exit_info: ExitFile | None) -> str:
    """When a run ended: the wrapper's word, else train.log's last write, else now."""
    if exit_info is not None and exit_info.ended_at:
        return exit_info.ended_at
    try:
        mtime = (run_dir / "train.log").stat().st_mtime
    except OSError:
        return _now()
    return dt.datetime.fromtimestamp(mtime, dt.UTC).isoformat(timespec="milliseconds")


def _update_record(
    run_dir: Path,
    alive: bool,
    exit_info: ExitFile | None,
    summary: SummaryFile | None,
    proc_info: ProcessFile | None = None,
) -> tuple[dict, str, str | None]:
    """Re-derive the state from a fresh run.json under the run's lock (a stop may have been
    requested since it was read) and write it when it changed."""
    with _run_lock(run_dir):
        record = _read_run_json(run_dir) or {}
        state, error = _derive_state(record, alive, exit_info, summary, proc_info)
        if state == record.get("state"):
            return record, state, error
        record["state"] = state
        if state in TERMINAL_STATES:
            record["ended_at"] = exit_info.ended_at if exit_info and exit_info.ended_at else _now()
            if exit_info is not None:
                record["exit_code"] = exit_info.exit_code
                record["signal"] = exit_info.signal
            url = summary.wandb_url if summary else None
            if url:
                record["wandb_url"] = url
            if error and not record.get("error"):
                record["error"] = error
        try:
            _atomic_write_json(run_dir / "run.json", record)
        except OSError:
            pass  # a read-only view still answers
        return record, state, error


def _eta(step: Any, total: Any, elapsed: Any, rows: list[dict]) -> float | None:
    """Seconds left: the time per step measured between logged train rows when there are two
    (it leaves out start-up), else progress.json's elapsed_s / step."""
    if not (isinstance(step, int | float) and isinstance(total, int | float)) or step <= 0:
        return None
    timed = [
        (r["step"], r["time_s"])
        for r in rows
        if r.get("phase") == "train"
        and isinstance(r.get("step"), int | float)
        and isinstance(r.get("time_s"), int | float)
    ]
    per_step = None
    if len(timed) >= 2 and timed[-1][0] > timed[0][0]:
        per_step = (timed[-1][1] - timed[0][1]) / (timed[-1][0] - timed[0][0])
    elif isinstance(elapsed, int | float):
        per_step = elapsed / step
    if per_step is None:
        return None
    return round(max(per_step, 0.0) * max(total - step, 0), 1)


def _live_times(
    progress: ProgressFile, step_eta: float | None
) -> tuple[float | None, float | None, str | None]:
    """(elapsed, ETA, its basis) of a live run at read time: the elapsed time from the
    trainer's start; the step ETA when steps have been timed, else (before the first step)
    the counted phase's time left."""
    clock = live_clock(progress, supervisor().clock())
    if step_eta is not None:
        return clock.elapsed_s, step_eta, "steps"
    if clock.phase_eta_s is not None:
        return clock.elapsed_s, clock.phase_eta_s, "phase"
    return clock.elapsed_s, None, None


def _run_error(
    error: str | None, record: dict, exit_info: ExitFile | None, summary: SummaryFile | None
) -> str | None:
    """The error a status shows: the trainer's (summary), else the wrapper's, else the lab's."""
    if summary is not None and summary.error:
        return str(summary.error)
    if exit_info is not None and exit_info.error:
        return str(exit_info.error)
    return error or record.get("error")


class TrainerFiles(NamedTuple):
    """What the wrapper and the trainer wrote into a run folder (None: not there yet)."""

    process: ProcessFile | None
    exit: ExitFile | None
    summary: SummaryFile | None
    progress: ProgressFile | None


def _build_status(
    run_dir: Path, record: dict, state: str, alive: bool, files: TrainerFiles, error: str | None
) -> RunStatus:
    """The RunStatus of a run from its files, its derived state and its liveness."""
    proc_info, exit_info, summary, progress = files
    step = progress.step if progress else None
    total = progress.total_steps if progress else None
    elapsed = progress.elapsed_s if progress else None
    eta = basis = None
    metrics = run_dir / "metrics.jsonl"
    if state in ACTIVE_STATES:  # the ETA needs every timed row of the window
        rows = tail_metric_rows(metrics)
        last_train = next((r for r in reversed(rows) if r.get("phase") == "train"), {})
        last_eval = next((r for r in reversed(rows) if r.get("phase") == "eval"), {})
        eta = _eta(step, total, elapsed, rows)
        if alive and progress is not None:  # moving between the trainer's writes
            elapsed, eta, basis = _live_times(progress, eta)
        elif eta is not None:
            basis = "steps"
    else:
        last_train, last_eval = last_train_eval(metrics)
    sig = exit_info.signal if exit_info else None
    exit_code = exit_info.exit_code if exit_info else record.get("exit_code")
    return RunStatus(
        id=record.get("id") or run_dir.name,
        campaign=record.get("campaign") or run_dir.parent.parent.name,
        family=record.get("family"),
        algorithm=record.get("algorithm"),
        device=record.get("device"),
        devices=held_devices(record),
        nproc=record.get("nproc") if isinstance(record.get("nproc"), int) else None,
        state=state,
        run_dir=str(run_dir),
        alive=alive,
        pid=record.get("pid"),
        pgid=record.get("pgid"),
        trainer_pid=proc_info.trainer_pid if proc_info else None,
        step=step,
        total_steps=total,
        phase=progress.phase if progress else None,
        elapsed_s=elapsed,
        eta_s=eta,
        eta_basis=basis,
        phase_done=progress.phase_done if progress and state in ACTIVE_STATES else None,
        phase_total=progress.phase_total if progress and state in ACTIVE_STATES else None,
        phase_progress=phase_count_text(progress.phase, progress.phase_done, progress.phase_total)
        if progress and state in ACTIVE_STATES
        else None,
        progress_updated_at=progress.updated_at if progress else None,
        last_train=last_train,
        last_eval=last_eval,
        time_split=_time_split(last_train),
        outcome=summary.outcome if summary else None,
        exit_code=exit_code,
        signal=sig if sig is not None else record.get("signal"),
        signal_name=exit_info.signal_name if exit_info else None,
        error=_run_error(error, record, exit_info, summary),
        wandb_url=(summary.wandb_url if summary else None) or record.get("wandb_url"),
        created_at=record.get("created_at"),
        started_at=record.get("started_at"),
        ended_at=record.get("ended_at"),
        stop_requested=bool(record.get("stop_requested_at")),
        after=[str(a) for a in record.get("after") or [] if isinstance(record.get("after"), list)],
        stage=record.get("stage") if isinstance(record.get("stage"), str) else None,
    )


# ---------------------------------------------------------------------------------------------
# Listing
# ---------------------------------------------------------------------------------------------


def _all_run_dirs(recorded: frozenset[str] | None = None) -> list[Path]:
    """Run folders; with ``recorded``, only those whose run.json holds one of these states
    (a cheap first pass: only their full status is computed)."""
    root = experiments_dir()
    if not root.is_dir():
        return []
    if recorded is not None and recorded <= UNFINISHED_STATES:
        indexed = _indexed_unfinished(root, recorded)
        if indexed is not None:
            return indexed
    dirs = [p for p in root.glob("*/runs/*") if p.is_dir() and (p / "run.json").is_file()]
    if recorded is not None:
        dirs = [p for p in dirs if (_read_run_json(p) or {}).get("state") in recorded]
    return dirs


def _indexed_unfinished(root: Path, recorded: frozenset[str]) -> list[Path] | None:
    """The folders of the unfinished runs in ``recorded`` states from the run index (checked
    against the folders first; an unfinished run is read again on every use), instead of
    reading every run.json; None when the index cannot answer here (not loaded in this process,
    reading folders in this context, or failing): the caller then scans."""
    import sqlite3

    from rlhf_lab.index.hook import indexed_unfinished

    try:
        rows = indexed_unfinished()
    except (sqlite3.Error, OSError):
        return None
    if rows is None:
        return None
    dirs = [
        root / campaign / "runs" / run_id for run_id, campaign, state in rows if state in recorded
    ]
    return [p for p in dirs if (p / "run.json").is_file()]


def _created_key(status: RunStatus) -> tuple[str, str]:
    return (status.created_at or "", status.id)


def list_runs(campaign: str | None = None, state: str | None = None) -> list[RunStatus]:
    """Every run (oldest first), optionally of one campaign (its dated name or its slug) and/or
    in one state."""
    if state is not None and state not in STATES:
        raise InvalidArgument(
            f"unknown state {state!r}; states: {', '.join(STATES)}",
            next=NextStep("list_runs", {"state": None}, note="every state"),
        )
    return _collect(_all_run_dirs(), campaign, state)


def _in_campaign(run_dir: Path, campaign: str) -> bool:
    """The run's campaign folder is ``campaign`` (dated name) or has it as its slug."""
    name = run_dir.parent.parent.name
    return name == campaign or re.sub(r"^\d{4}-\d{2}-\d{2}-", "", name) == campaign


def _collect(dirs: list[Path], campaign: str | None, state: str | None) -> list[RunStatus]:
    if campaign is not None:
        check_slug(campaign)
        dirs = [p for p in dirs if _in_campaign(p, campaign)]
    out = []
    for path in dirs:
        try:
            status = _status(path)
        except LabError as err:
            status = _unreadable_run(path, str(err))
        if state is None or status.state == state:
            out.append(status)
    return sorted(out, key=_created_key)


def _unreadable_run(run_dir: Path, error: str) -> RunStatus:
    """A run folder whose run.json cannot be read is listed as died with the reason, so a
    damaged run never silently drops out of a listing."""
    return RunStatus(
        id=run_dir.name,
        campaign=run_dir.parent.parent.name,
        state="died",
        run_dir=str(run_dir),
        alive=False,
        error=error,
    )


def held_devices(record: dict) -> list[str]:
    """Every device of this machine a run holds: run.json ``devices`` (a torchrun run on several
    GPUs), else its ``device``; none for a Slurm job (it runs on the cluster's) or a run whose
    GPU is still to be picked (``auto``)."""
    if record.get("slurm"):
        return []
    devices = record.get("devices")
    if isinstance(devices, list) and devices:
        return [str(d) for d in devices]
    device = record.get("device")
    return [str(device)] if device and device != "auto" else []


def active_runs(device: str | None = None) -> list[RunStatus]:
    """Runs starting or running now (holding ``device`` when given; a run on several devices
    holds each of them)."""
    dev = None if device is None else resolve_device(device)
    out = []
    for status in _collect(_all_run_dirs(ACTIVE_STATES), None, None):
        if status.state in ACTIVE_STATES and (dev is None or dev in status.devices):
            out.append(status)
    return out


def queued_runs() -> list[RunStatus]:
    """Queued runs in the order the worker will start them (creation order)."""
    return _collect(_all_run_dirs(frozenset({"queued"})), None, "queued")


def unfinished_runs() -> list[RunStatus]:
    """Queued, starting and running runs, oldest first: what ``list_runs()`` filtered to those
    states returns, but only runs whose run.json records one of them are examined (a recorded
    finished state never changes back), so a status overview does not read every finished run."""
    found = _collect(_all_run_dirs(UNFINISHED_STATES), None, None)
    return [s for s in found if s.state in UNFINISHED_STATES]


def describe_run(status: RunStatus) -> str:
    """``<id> (pid P, step s/t, ETA e, campaign c)``: enough to recognise a run holding a device."""
    step = "?" if status.step is None else status.step
    total = "?" if status.total_steps is None else status.total_steps
    eta = "" if status.eta_s is None else f", ETA {status.eta_s:.0f}s"
    return f"{status.id} (pid {status.pid}, step {step}/{total}{eta}, campaign {status.campaign})"


# ---------------------------------------------------------------------------------------------
# Waiting
# ---------------------------------------------------------------------------------------------


def wait_for_end(run_id: str, poll_s: float = 1.0, timeout_s: float | None = None) -> RunStatus:
    """Poll until the run reaches a terminal state (or ``timeout_s`` passes)."""
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        status = run_state(run_id)
        if status.terminal or (deadline is not None and time.time() > deadline):
            return status
        time.sleep(poll_s)


def _drain_log(run_id: str, cursor: int, on_log: Callable[[str], None]) -> int:
    """Pass every new piece of train.log after ``cursor`` to ``on_log``; the new cursor."""
    while True:
        chunk = tail_log(run_id, cursor=cursor, max_bytes=64_000)
        if chunk.text:
            on_log(chunk.text)
        moved = chunk.cursor != cursor
        cursor = chunk.cursor
        if chunk.eof or not moved:
            return cursor


def follow_run(
    run_id: str,
    on_progress: Callable[[RunStatus], None],
    on_log: Callable[[str], None] | None = None,
    *,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
) -> RunStatus:
    """Block until the run ends: ``on_log(text)`` gets each new piece of train.log (folded
    progress bars), ``on_progress(status)`` fires whenever progress.json or the state changes.
    Returns the final status (or the current one after ``timeout_s``). No UI here."""
    cursor = 0
    seen: tuple = ()
    deadline = None if timeout_s is None else time.time() + timeout_s
    while True:
        status = run_state(run_id)
        if on_log is not None:
            cursor = _drain_log(run_id, cursor, on_log)
        key = (status.state, status.step, status.progress_updated_at)
        if key != seen:
            seen = key
            on_progress(status)
        if status.terminal:
            if on_log is not None:  # the wrapper's last line lands after the state changes
                chunk = tail_log(run_id, cursor=cursor, max_bytes=64_000, final=True)
                if chunk.text:
                    on_log(chunk.text)
            return status
        if deadline is not None and time.time() > deadline:
            return status
        time.sleep(poll_s)


def _time_split(last_train: dict) -> str | None:
    """Where the last train row's step went (rlhf_lab.results.stages.time_split)."""
    from rlhf_lab.results.stages import time_split

    return time_split(last_train)
