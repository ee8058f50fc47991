"""The run-folder contract: one schema per file, shared by the writers (trainers, the lab's
launcher and wrapper) and the one reader (the lab). Torch-free: pydantic and the stdlib only.

    run.json       RunFile       the lab, before launch and on every state change
    process.json   ProcessFile   the wrapper, while the trainer runs
    exit.json      ExitFile      the wrapper, when the trainer process ended
    progress.json  ProgressFile  the wrapper when it starts the trainer (phase ``starting``), then
                                 the trainer, from its first second (with a phase)
    summary.json   SummaryFile   the trainer, at the end (succeeded, failed or stopped)
    eval.json      EvalFile      an evaluation job (trainers/evaluation), at its end
    metrics.jsonl  MetricRow     the trainer, one row per log event

Every schema accepts fields it does not know (``extra="allow"``): a file written by a newer
version still reads, and family-specific fields (``epoch``, ``stage``, ``tokens_seen``) ride
along. A file from an older version or a damaged one is read with :func:`read_file`, which never
raises: it returns the model (or ``None``) and a one-line warning for the reader to show.

Run states (:data:`RunState`) live here too, so the lab's listing, status, ledger and diagnosis
use one set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# --------------------------------------------------------------------------------------------
# States and phases
# --------------------------------------------------------------------------------------------

RunState = Literal[
    "queued",  # waiting for a device (or for an upstream run)
    "starting",  # the launcher created the folder; the process is coming up
    "running",  # the process is alive
    "succeeded",
    "failed",  # the trainer reported an error, or exited non-zero
    "stopped",  # the trainer honoured a stop: it wrote its checkpoint and outcome "stopped"
    "killed",  # a stop had to SIGKILL the trainer: work since the last checkpoint is lost
    "died",  # the process vanished without writing how it ended (SIGKILL, OOM killer, reboot)
    "cancelled",  # a dependent run whose upstream run did not succeed; it never started
]
RUN_STATES: tuple[str, ...] = RunState.__args__
ACTIVE_STATES: frozenset[str] = frozenset({"queued", "starting", "running"})
LIVE_STATES: frozenset[str] = frozenset({"starting", "running"})  # a process exists or is coming
TERMINAL_STATES: frozenset[str] = frozenset(
    {"succeeded", "failed", "stopped", "killed", "died", "cancelled"}
)

Outcome = Literal["succeeded", "failed", "stopped"]

# What a trainer is doing right now (progress.json). Families may report a finer ``stage``
# besides (rejection sampling: generate / score / select ...).
Phase = Literal[
    "starting",  # the trainer process is starting (imports); written by the lab's wrapper
    "loading_model",
    "tokenizing",
    "reference_logprobs",
    "training",
    "evaluating",
    "generating",
    "saving",
    "done",
]
PHASES: tuple[str, ...] = Phase.__args__

METRIC_PHASES: tuple[str, ...] = ("train", "eval", "rollout")


class _FileModel(BaseModel):
    # defer_build: a schema is built on its first use, not at import (the CLI starts faster)
    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


class RunFile(_FileModel):
    """``run.json``: who the run is, how it was started, what state the lab last saw."""

    id: str
    family: str
    algorithm: str
    campaign: str
    device: str = "cpu"
    config_source: str | None = None
    overrides: list[str] = Field(default_factory=list)
    argv: list[str] = Field(default_factory=list, description="the trainer's command line")
    wrapper_argv: list[str] = Field(default_factory=list)
    cwd: str | None = None
    pid: int | None = Field(default=None, description="wrapper pid (the process-group leader)")
    pgid: int | None = None
    create_time: float | None = Field(default=None, description="psutil create time of pid")
    host: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    state: RunState = "starting"
    created_at: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    stop_requested_at: str | None = None
    killed_at: str | None = Field(
        default=None, description="when a stop gave up waiting and sent SIGKILL"
    )
    exit_code: int | None = None
    signal: int | None = None
    wandb_url: str | None = None
    cpu_threads: int | None = None
    resumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="one entry per resume: how the attempt before it ended",
    )
    after: list[str] = Field(
        default_factory=list,
        description="upstream run ids: the run stays queued until every one has succeeded, and "
        "is cancelled when one ends any other way",
    )
    references: dict[str, str] = Field(
        default_factory=dict,
        description="config key -> upstream run id of each run:<id> value (config.yaml holds "
        "the upstream's final_model path)",
    )
    pipeline: str | None = Field(default=None, description="the pipeline that made this run")
    stage: str | None = Field(default=None, description="this run's stage in that pipeline")
    predicted_time: dict[str, Any] | None = Field(
        default=None,
        description="the lab's wall-time prediction at launch (rlhf_lab.planning.time: total_s, "
        "per_step_s, steps, text, calibration), for the ledger's predicted vs actual",
    )


class ProcessFile(_FileModel):
    """``process.json``: the wrapper and trainer processes (pid + create time)."""

    wrapper_pid: int | None = None
    wrapper_create_time: float | None = None
    trainer_pid: int | None = None
    trainer_create_time: float | None = None
    started_at: str | None = None


class ExitFile(_FileModel):
    """``exit.json``: how the trainer process ended, written by the wrapper."""

    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    ended_at: str | None = None
    trainer_pid: int | None = None
    error: str | None = None
    slurm_time_limit_signal: bool = False  # Slurm's SIGTERM before the time limit came


class ProgressFile(_FileModel):
    """``progress.json``: replaced in place; exists from the trainer's first second."""

    step: int = 0
    total_steps: int | None = None
    phase: Phase | None = None
    elapsed_s: float | None = None
    updated_at: float | None = None
    tokens_seen: int | None = None
    epoch: int | float | None = None
    stage: str | None = None
    started_at: float | None = None
    """When the trainer process started (epoch seconds): the lab computes a live run's elapsed
    time from it at read time, so the elapsed time moves through long phases."""
    phase_started_at: float | None = None
    """When the current phase began (epoch seconds)."""
    phase_done: int | None = None
    """Items done within a long phase (reference log-probs 120 of 640, prompts evaluated ...):
    written at a bounded rate (``rundir.PHASE_COUNT_EVERY_S``) and at the phase's end."""
    phase_total: int | None = None


class SummaryFile(_FileModel):
    """``summary.json``: the end of a run (also written on a caught failure, with the error)."""

    outcome: Outcome
    wall_time_s: float | None = None
    algorithm: str | None = None
    steps: int | None = None
    total_steps: int | None = None
    final_metrics: dict[str, Any] = Field(default_factory=dict)
    final_eval: dict[str, Any] = Field(default_factory=dict)
    best_metrics: dict[str, Any] = Field(default_factory=dict)
    peak_memory_gb: float | None = None
    tokens_seen: int | None = None
    final_model: str | None = None
    wandb_url: str | None = None
    error: str | None = None
    traceback: str | None = None
    detail: str | None = None


class MetricRow(_FileModel):
    """One line of ``metrics.jsonl``: ``step``, ``time_s``, ``phase`` and then the metrics."""

    step: int
    time_s: float | None = None
    phase: str = "train"

    def metrics(self) -> dict[str, Any]:
        """The metric values of the row (everything but step, time_s and phase)."""
        return dict(self.model_extra or {})


class EvalMetric(_FileModel):
    """One number of ``eval.json``: the value, its two-sided interval (None where there is
    none) and how many independent items (prompts, pairs) it rests on."""

    value: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0


class EvalFile(_FileModel):
    """``eval.json``: what an evaluation job measured (``trainers/evaluation``). ``metrics``
    are the target's, ``baseline_metrics`` the baseline's on the same prompts and seed, and
    ``difference`` target − baseline, paired by prompt. ``settings`` holds the resolved config
    (seed, sampling, prompts ...); ``cache_keys`` a key per evaluated model (its weights + the
    suite + the settings + the prompt set) under which a per-model result may be reused."""

    format_version: int = 1
    suite: str
    headline: str | None = None
    target: str
    target_model: str | None = None
    target_run: str | None = None
    baseline: str | None = None
    baseline_model: str | None = None
    judge: str | None = None
    level: float = 0.95
    settings: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, EvalMetric] = Field(default_factory=dict)
    baseline_metrics: dict[str, EvalMetric] = Field(default_factory=dict)
    difference: dict[str, EvalMetric] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    fingerprints: dict[str, str] = Field(default_factory=dict)
    cache_keys: dict[str, str] = Field(default_factory=dict)
    created_at: str | None = None
    wall_time_s: float | None = None


FILES: dict[str, type[_FileModel]] = {
    "run.json": RunFile,
    "process.json": ProcessFile,
    "exit.json": ExitFile,
    "progress.json": ProgressFile,
    "summary.json": SummaryFile,
    "eval.json": EvalFile,
}

M = TypeVar("M", bound=BaseModel)


def read_file(path: str | Path, model: type[M]) -> tuple[M | None, str | None]:
    """Read one JSON file of the run folder as ``model``; never raises.

    Returns ``(model, None)`` when the file reads and validates, ``(None, None)`` when it does not
    exist, and ``(None, warning)`` when it is unreadable, not JSON or does not fit the schema
    (a file from an older version, or damaged): the warning is one line naming the file and what
    to do."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"{path.name}: cannot be read ({err.strerror or err}); it was skipped"
    except UnicodeDecodeError:  # garbage bytes (a torn or foreign write): still never raises
        return None, f"{path.name}: not UTF-8 text (damaged); it was skipped"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        return None, f"{path.name}: not valid JSON (line {err.lineno}); it was skipped"
    if not isinstance(data, dict):
        return None, f"{path.name}: expected a JSON object, found {type(data).__name__}; skipped"
    return validate_data(data, model, path.name)


def validate_data(data: dict[str, Any], model: type[M], name: str) -> tuple[M | None, str | None]:
    """A file's JSON object as ``model``; never raises. ``(None, warning)`` when it does not fit
    the schema: the warning names the file (``name``), the first bad field and why."""
    try:
        return model.model_validate(data), None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(top level)"
        return None, (
            f"{name}: field {where}: {first.get('msg', 'invalid')} (written by another "
            "version, or damaged); it was skipped"
        )


def parse_metric_line(line: str | bytes) -> MetricRow | None:
    """One ``metrics.jsonl`` line as a row, or None for a torn / foreign line."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return MetricRow.model_validate(data)
    except ValidationError:
        return None


__all__ = [
    "ACTIVE_STATES",
    "EvalFile",
    "EvalMetric",
    "FILES",
    "LIVE_STATES",
    "METRIC_PHASES",
    "PHASES",
    "RUN_STATES",
    "TERMINAL_STATES",
    "ExitFile",
    "MetricRow",
    "Outcome",
    "Phase",
    "ProcessFile",
    "ProgressFile",
    "RunFile",
    "RunState",
    "SummaryFile",
    "parse_metric_line",
    "read_file",
    "validate_data",
]
