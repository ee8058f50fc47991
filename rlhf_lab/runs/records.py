"""What the runs modules share: the run models (RunInfo, RunStatus, LaunchResult), the run
states, timestamps, atomic writes of run.json, and the run's record as the lab reads it.
Torch-free.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlhf_lab.errors import Corrupt, NextStep, NotFound
from rlhf_lab.paths import experiments_dir
from rlhf_lab.runs.folder import filled_record, read_record, record_as_run_file
from trainers.core.runfolder import (
    ACTIVE_STATES as _QUEUED_OR_LIVE,
)
from trainers.core.runfolder import (
    LIVE_STATES,
    RUN_STATES,
    TERMINAL_STATES,
    RunFile,
    RunState,
)

__all__ = [
    "ACTIVE_STATES",
    "LIVE_STATES",
    "LaunchResult",
    "RunInfo",
    "RunState",
    "RunStatus",
    "STATES",
    "TERMINAL_STATES",
    "UNFINISHED_STATES",
]

STATES: tuple[str, ...] = RUN_STATES
# A process exists or is coming up. The runs modules always called these "active"; the run-folder
# contract calls them live (its ACTIVE_STATES adds queued, see UNFINISHED_STATES).
ACTIVE_STATES: frozenset[str] = LIVE_STATES
UNFINISHED_STATES: frozenset[str] = _QUEUED_OR_LIVE


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class RunInfo(RunFile):
    """What ``run.json`` holds (the contract's :class:`RunFile`) plus the folder. Written by the
    lab only; keys the contract does not name are left out."""

    model_config = ConfigDict(extra="ignore")

    run_dir: str = Field(description="absolute path of the run folder")
    devices: list[str] = Field(default_factory=list)
    nproc: int | None = None
    slurm: dict[str, Any] | None = None


class RunStatus(BaseModel):
    """A run's state derived from its folder and the live process table."""

    id: str
    campaign: str
    family: str | None = None
    algorithm: str | None = None
    device: str | None = None
    devices: list[str] = Field(default_factory=list)
    nproc: int | None = None
    slurm_job: str | None = None
    slurm_state: str | None = None
    state: RunState
    run_dir: str
    alive: bool = Field(description="the wrapper or trainer process is running now")
    pid: int | None = None
    pgid: int | None = None
    trainer_pid: int | None = None
    step: int | None = None
    total_steps: int | None = None
    phase: str | None = Field(
        default=None,
        description="what the trainer is doing (progress.json): starting, loading_model, "
        "tokenizing, reference_logprobs, training, evaluating, generating, saving, done",
    )
    elapsed_s: float | None = Field(default=None, description="trainer's elapsed time")
    eta_s: float | None = Field(
        default=None,
        description="seconds left: time per step (train rows) × steps left; before the first "
        "step, the current counted phase's time left (eta_basis says which)",
    )
    eta_basis: str | None = Field(default=None, description="steps | phase")
    phase_done: int | None = Field(default=None, description="items done in a long phase")
    phase_total: int | None = None
    phase_progress: str | None = Field(
        default=None, description='e.g. "reference log-probs 120/640"'
    )
    progress_updated_at: float | None = None
    last_train: dict[str, Any] = Field(default_factory=dict, description="last train row")
    last_eval: dict[str, Any] = Field(default_factory=dict, description="last eval row")
    time_split: str | None = Field(
        default=None, description="where the last train row's step went: stage shares, MFU"
    )
    outcome: str | None = Field(default=None, description="summary.json outcome")
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    error: str | None = None
    wandb_url: str | None = None
    created_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    stop_requested: bool = False
    after: list[str] = Field(
        default_factory=list, description="upstream runs it waits for (run:<id> references too)"
    )
    stage: str | None = Field(default=None, description="pipeline stage (pipeline runs)")

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class LaunchResult(BaseModel):
    run: RunInfo
    state: RunState
    queued: bool = False
    queue_position: int | None = Field(default=None, description="1 = next to start")
    device: str
    devices: list[str] = Field(default_factory=list)
    sharing_device_with: list[str] = Field(
        default_factory=list, description="runs already on the device (force / fits_together)"
    )
    message: str
    warnings: list[str] = Field(
        default_factory=list,
        description="what the checks before the launch found doubtful (e.g. a learning rate "
        "outside the plausible range); the run was launched anyway",
    )
    rearmed: list[str] = Field(
        default_factory=list,
        description="cancelled dependent runs a resume queued again (they wait for this run)",
    )


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------


def _now() -> str:
    """The current UTC time as ISO 8601 with milliseconds (run.json's timestamps)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _parse_time(text: str | None) -> float | None:
    """An ISO timestamp of run.json as epoch seconds (None when absent or malformed)."""
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except (TypeError, ValueError):
        return None


def _source_dir() -> Path:
    """The checkout holding the `trainers` and `rlhf_lab` packages (the trainer's cwd)."""
    return Path(__file__).resolve().parents[2]


def _lab_dir() -> Path:
    """``experiments/.lab``: the lab's locks and the queue worker's log."""
    path = experiments_dir() / ".lab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _atomic_write_text(path: Path, text: str) -> None:
    from trainers.core.rundir import atomic_write_text

    atomic_write_text(path, text)


def _atomic_write_json(path: Path, obj: Any) -> None:
    from trainers.core.rundir import atomic_write_json

    atomic_write_json(path, obj)
    if path.name == "run.json" and isinstance(obj, dict):  # a state change: tell the run index
        from rlhf_lab.index.hook import run_record_written

        run_record_written(path.parent, obj)


def _read_run_json(run_dir: Path) -> dict | None:
    """run.json's object as written (None when missing or unreadable)."""
    return read_record(run_dir).data


def _read_record(run_dir: Path) -> dict:
    """run.json's object for an update; a typed error when the folder has none or it is
    damaged."""
    found = read_record(run_dir)
    if found.data is not None:
        return found.data
    if found.warning is not None:
        raise Corrupt(f"{run_dir}: {found.warning}")
    raise NotFound(
        f"{run_dir / 'run.json'} is missing; this folder was not created by the lab",
        next=NextStep("launch_run", note="a run folder is created when a run is launched"),
    )


def _checked_run_file(run_dir: Path, record: dict) -> None:
    """Raise a typed error when run.json holds a value of the wrong type (hand-edited)."""
    run, warning = record_as_run_file(run_dir, record)
    if run is None:
        reason = (warning or "run.json does not fit the schema").removesuffix("; it was skipped")
        raise Corrupt(f"{run_dir}: {reason}; fix run.json by hand")


def _info(run_dir: Path, record: dict) -> RunInfo:
    """The RunInfo of a record (identity the file lacks comes from the folder)."""
    return RunInfo.model_validate({**filled_record(run_dir, record), "run_dir": str(run_dir)})
