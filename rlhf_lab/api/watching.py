"""Watching runs: status with alerts and advice, log tails with the run's state, metric series,
run lists. The lab API functions behind the CLI's ``status``/``tail``/``metrics``/``runs`` and the
MCP tools ``run_status``/``tail_logs``/``get_metrics``/``list_runs``. Torch-free.

Alerts of a finished run are cached here (keyed by the size and mtime of the files
:func:`rlhf_lab.results.diagnosis.diagnose` reads): a finished run's folder no longer changes, so polling it
again need not re-read its whole log. Running runs are always diagnosed afresh.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.api.results import State
from rlhf_lab.errors import InvalidArgument, LabError, NextStep
from rlhf_lab.results.diagnosis import (
    Alert,
    LogChunk,
    MetricSeries,
    diagnose,
    read_metrics,
    tail_log,
)
from rlhf_lab.results.metrics import evenly_per_phase, metric_names, phase_indices
from rlhf_lab.runs import RunStatus, follow_run, run_state

FINISHED_STATES: frozenset[str] = frozenset(
    {"succeeded", "failed", "stopped", "killed", "died", "cancelled"}
)


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
    note: str | None = Field(
        default=None,
        description="why there are no rows, or how to see more when some were left out",
    )


class RunRow(BaseModel):
    """A run in a list: where it stands and its own held-out headline metric."""

    id: str
    campaign: str
    state: str
    step: int | None = None
    total_steps: int | None = None
    metric: str | None = Field(default=None, description="the run's own headline metric (held-out)")
    value: float | None = Field(default=None, description="its final value (null: not yet)")
    best: float | None = Field(default=None, description="its best value over the run")
    status: RunStatus | None = Field(default=None, description="the full status (detail=true)")


class RunList(BaseModel):
    runs: list[RunRow] = Field(description="oldest first (the newest `limit` runs)")
    total: int = Field(description="matching runs before the limit")
    note: str | None = None
    warnings: list[str] = Field(
        default_factory=list, description="the run index was rebuilt or re-read (and why)"
    )


METRICS_BUDGET_BYTES = 8_000  # the rows get_metrics returns by default fit in this
METRICS_DIGITS = 6  # significant digits of a metric value in get_metrics


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
    if s.state == "queued" and s.after:
        return (
            f"waits for upstream run(s) {', '.join(s.after)} to succeed (it is cancelled if one "
            "does not): poll run_status again in 10-30 s"
        )
    if s.state in ("queued", "starting"):
        return "not training yet: poll run_status again in 10-30 s"
    if s.state == "cancelled":
        return (
            f"never started: {s.error or 'an upstream run did not succeed'}; resume_run on the "
            "upstream run re-arms it"
        )
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
    from rlhf_lab.results.diagnosis import status_headline

    status = run_state(run_id)
    view = RunView(status=status, headline=status_headline(status), alerts=_alerts(run_id, status))
    return RunStatusResult(**view.model_dump(), advice=advice_for(view))


@operation
def active_run_views() -> list[RunStatusResult]:
    """run_status of every queued, starting or running run (what a bare `status` shows)."""
    from rlhf_lab.index import unfinished_run_ids

    ids, _ = unfinished_run_ids()
    return [run_status(run_id) for run_id in ids]


@operation
def run_list(
    campaign: str | None = None,
    state: str | None = None,
    limit: int | None = None,
    detail: bool = False,
    offset: int = 0,
    family: str | None = None,
    algorithm: str | None = None,
) -> RunList:
    """The newest ``limit`` matching runs after the newest ``offset`` (shown oldest first) as
    rows of id, campaign, state, step/total and the run's own headline metric, final and best
    (``detail``: with the full status; the default limit is then smaller), their total, and a
    note when empty or cut. Read from the run index (filters, order and the page in one SQL
    query), which is checked against the run folders first."""
    from rlhf_lab.api.listing import RunQuery, run_page

    page = run_page(RunQuery(campaign, state, limit, detail, offset, family, algorithm))
    rows = [RunRow(**r) for r in page.pop("runs")]
    if detail:
        rows = [r.model_copy(update={"status": run_state(r.id)}) for r in rows]
    return RunList(runs=rows, **page)


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


def _rounded(value: Any) -> Any:
    """A metric value to :data:`METRICS_DIGITS` significant digits (non-floats unchanged)."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{METRICS_DIGITS}g}")
    return value


def _rows_size(rows: list[dict[str, Any]]) -> int:
    return len(json.dumps(rows, separators=(",", ":"), default=str))


@operation
def get_metrics(
    run_id: str,
    keys: list[str] | None = None,
    phase: str | None = None,
    max_points: int | None = None,
    max_bytes: int = METRICS_BUDGET_BYTES,
) -> MetricsResult:
    """A run's metric rows, bounded by size: each phase down-sampled evenly (its last row always
    kept) to ``max_points`` rows, then further until the rows' JSON fits in ``max_bytes``;
    values to 6 significant digits. The note says why there are no rows, or how to see more."""
    if max_bytes < 256:
        raise InvalidArgument("max_bytes must be at least 256")
    full = read_metrics(run_id, keys, phase, None)
    rows = [{k: _rounded(v) for k, v in r.items()} for r in full.rows]
    longest = max((len(v) for v in phase_indices(rows).values()), default=0)
    points = min(longest, max_points) if max_points else longest
    picked = evenly_per_phase(rows, points)
    if _rows_size(picked) > max_bytes:  # the largest per-phase count that fits (binary search)
        low, high = 1, points
        while low < high:
            mid = (low + high + 1) // 2
            if _rows_size(evenly_per_phase(rows, mid)) <= max_bytes:
                low = mid
            else:
                high = mid - 1
        points, picked = low, evenly_per_phase(rows, low)
        while len(picked) > 1 and _rows_size(picked) > max_bytes:  # one row per phase too big
            picked = picked[1:]
    note = None
    if not picked:
        note = (
            "no matching rows yet: the trainer writes one after each logged step"
            if not keys
            else f"no rows hold {', '.join(keys)}; call without keys to see the names"
        )
    elif len(picked) < len(rows):
        note = (
            f"{len(picked)} of {len(rows)} rows (down-sampled evenly per phase, last row kept) to "
            f"stay under {max_bytes} bytes; for more points pass keys=[...] with fewer metrics, "
            "a phase, or a larger max_bytes"
        )
    return MetricsResult(
        run_id=run_id,
        phase=phase,
        keys=metric_names(picked) if picked else full.keys,
        rows=picked,
        total_rows=full.total_rows,
        downsampled=len(picked) < len(rows),
        note=note,
    )
