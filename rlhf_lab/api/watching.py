"""Watching runs: status with alerts and advice, log tails with the run's state, metric series,
run lists. The lab API functions behind the CLI's ``status``/``tail``/``metrics``/``runs`` and the
MCP tools ``run_status``/``tail_logs``/``get_metrics``/``list_runs``. Torch-free.

Alerts of a finished run are cached here (keyed by the size and mtime of the files
:func:`rlhf_lab.logs.diagnose` reads): a finished run's folder no longer changes, so polling it
again need not re-read its whole log. Running runs are always diagnosed afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.api.results import State
from rlhf_lab.errors import LabError, NextStep
from rlhf_lab.logs import Alert, LogChunk, MetricSeries, diagnose, read_metrics, tail_log
from rlhf_lab.runs import RunStatus, follow_run, list_runs, run_state, unfinished_runs

FINISHED_STATES: frozenset[str] = frozenset({"succeeded", "failed", "stopped", "killed", "died"})


class RunView(BaseModel):
    """A run's status plus the alerts its logs and metrics raise."""

    status: RunStatus
    headline: str | None = Field(
        default=None, description="the held-out headline metric first, the training signal after"
    )
    alerts: list[Alert] = Field(default_factory=list)


class RunStatusResult(RunView):
    advice: str = Field(description="what to do next given the state and alerts")


class LogTail(LogChunk):
    state: State | None = Field(default=None, description="the run's state at read time")
    note: str | None = Field(default=None, description="why the text is empty, when it is")


class MetricsResult(MetricSeries):
    note: str | None = Field(default=None, description="why there are no rows, when there are none")


class RunList(BaseModel):
    runs: list[RunStatus] = Field(description="oldest first (the newest `limit` runs)")
    total: int = Field(description="matching runs before the limit")
    note: str | None = None


# ------------------------------------------------------------------------------ alert cache

_ALERT_CACHE: dict[str, tuple[tuple, list[Alert]]] = {}
_ALERT_CACHE_SIZE = 256
_DIAGNOSED_FILES = (
    "run.json",
    "exit.json",
    "summary.json",
    "train.log",
    "metrics.jsonl",
    "samples.jsonl",
)


def _fingerprint(status: RunStatus) -> tuple | None:
    """What a finished run's diagnosis depends on (None for a run still going: never cached)."""
    if not status.terminal:
        return None
    stats: list[tuple] = []
    for name in _DIAGNOSED_FILES:
        try:
            st = (Path(status.run_dir) / name).stat()
            stats.append((name, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((name, None, None))
    return (status.state, status.exit_code, status.signal, status.stop_requested, *stats)


def _alerts(run_id: str, status: RunStatus) -> list[Alert]:
    """diagnose(), with the alerts of an unchanged finished run reused."""
    key = _fingerprint(status)
    cached = _ALERT_CACHE.get(run_id)
    if key is not None and cached is not None and cached[0] == key:
        return [a.model_copy() for a in cached[1]]
    alerts = diagnose(run_id, status=status)
    if key is not None:
        if len(_ALERT_CACHE) >= _ALERT_CACHE_SIZE:
            _ALERT_CACHE.pop(next(iter(_ALERT_CACHE)))
        _ALERT_CACHE[run_id] = (key, alerts)
    return alerts


# ------------------------------------------------------------------------------------ status


def advice_for(view: RunView) -> str:
    """One sentence on what to do next with a run, from its state and its first error alert.
    Operations are named by their lab API names (run_status, tail_logs, record_results)."""
    s = view.status
    errors = [a for a in view.alerts if a.severity == "error"]
    if s.state in ("queued", "starting"):
        return "not training yet: poll run_status again in 10-30 s"
    if s.state == "running":
        if errors:
            return f"running with an alert ({errors[0].kind}): {errors[0].hint}"
        return (
            "running: poll again in 10-30 s; tail_logs with the last cursor shows new output, "
            "get_metrics the curves"
        )
    if s.state == "succeeded":
        return (
            "finished: call record_results to write its ledger row, then judge it against the "
            "family's acceptance criteria (list_recipes)"
        )
    if s.state == "stopped":
        return "stopped on request: record_results keeps what it reached"
    if s.state == "killed":
        return (
            "killed by a stop that ran out of grace: work since its last checkpoint is lost; "
            "resume_run continues from that checkpoint, record_results records it"
        )
    hint = errors[0].hint if errors else "read the end of the log with tail_logs(lines=80)"
    return (
        f"{s.state}: {s.error or 'see alerts'}. {hint}; record_results still records the "
        "failure mode"
    )


@operation
def run_status(run_id: str) -> RunStatusResult:
    """A run's state, step, ETA, latest metrics, diagnosed alerts and advice."""
    from rlhf_lab.logs import status_headline

    status = run_state(run_id)
    view = RunView(status=status, headline=status_headline(status), alerts=_alerts(run_id, status))
    return RunStatusResult(**view.model_dump(), advice=advice_for(view))


@operation
def active_run_views() -> list[RunStatusResult]:
    """run_status of every queued, starting or running run (what a bare `status` shows)."""
    return [run_status(s.id) for s in unfinished_runs()]


@operation
def run_list(campaign: str | None = None, state: str | None = None, limit: int = 50) -> RunList:
    """The newest ``limit`` matching runs (oldest first), their total and a note when empty."""
    runs = list_runs(campaign, state)
    note = None
    if not runs:
        note = "no runs match" + ("" if campaign or state else " (none launched yet: launch_run)")
    return RunList(runs=runs[-limit:], total=len(runs), note=note)


def wait_and_stream(
    run_id: str,
    on_progress: Callable[[RunStatus], None],
    on_log: Callable[[str], None],
) -> RunStatus:
    """Follow a run to its end, calling back with each status and each piece of new log."""
    return follow_run(run_id, on_progress, on_log)


# --------------------------------------------------------------------------------------- logs


@operation
def tail_logs(
    run_id: str, lines: int = 50, cursor: int | None = None, max_bytes: int = 8_000
) -> LogTail:
    """The run's train.log: the last ``lines`` lines, or what was written since ``cursor``,
    capped at ``max_bytes``, with the run's state and a note when the text is empty or capped."""
    state = run_state(run_id).state
    final = state in FINISHED_STATES
    try:
        chunk = tail_log(run_id, lines=lines, cursor=cursor, max_bytes=max_bytes, final=final)
    except LabError as err:
        if cursor is None:
            raise
        note = "without a cursor, or with the one the previous call returned"
        raise err.with_next(NextStep("tail_logs", {"run_id": run_id}, note=note)) from None
    note = None
    if not chunk.text:
        if chunk.size == 0:
            note = f"train.log is empty or not created yet (run {state})"
        else:
            note = f"no new output since cursor {chunk.cursor} (run {state})"
    elif chunk.truncated:
        note = "capped at max_bytes: call again with the returned cursor for the rest"
    return LogTail(**chunk.model_dump(), state=state, note=note)


def follow_log(run_id: str, cursor: int | None, poll_s: float = 1.0) -> Iterator[str]:
    """New log text of a run, piece by piece, until the run ends (the last piece is read with
    ``final=True`` so a partial last line is not held back)."""
    while True:
        if run_state(run_id).terminal:
            yield tail_log(run_id, cursor=cursor, final=True).text
            return
        time.sleep(poll_s)
        chunk = tail_log(run_id, cursor=cursor)
        cursor = chunk.cursor
        yield chunk.text


# ------------------------------------------------------------------------------------ metrics


@operation
def get_metrics(
    run_id: str,
    keys: list[str] | None = None,
    phase: str | None = None,
    max_points: int = 200,
) -> MetricsResult:
    """read_metrics plus a note saying why there are no rows, when there are none."""
    series = read_metrics(run_id, keys, phase, max_points)
    note = None
    if not series.rows:
        note = (
            "no matching rows yet: the trainer writes one after each logged step"
            if not keys
            else f"no rows hold {', '.join(keys)}; call without keys to see the names"
        )
    return MetricsResult(**series.model_dump(), note=note)
