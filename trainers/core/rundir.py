"""The run directory a trainer writes (docs/architecture.md, "The run folder"). Torch-free.

Files: ``config.yaml`` (resolved config), ``metrics.jsonl`` and ``samples.jsonl`` (one whole JSON
object per line, appended), ``progress.json`` and ``summary.json`` (replaced atomically).
JSON files are written to a temporary name in the same folder and renamed into place, so a reader
never sees half a file and a kill never leaves one behind.
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainers.core.runfolder import MetricRow, Phase, ProgressFile, SummaryFile, read_file


def _jsonable(value: Any) -> Any:
    """Turn tensors / numpy scalars into plain numbers; NaN and inf become strings JSON can hold."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf"
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; run files are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n")


def append_jsonl(path: str | Path, obj: Any) -> None:
    """Append one JSON object as one line with a single write call (whole lines only)."""
    line = json.dumps(_jsonable(obj)) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every whole line of a JSONL file; a truncated last line is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


SIGTERM_ENV = "RLHF_LAB_SIGTERM_AT"
_reached: dict[str, int] = {}


def sigterm_self_at(point: str) -> None:
    """Fault injection for the stop tests (like ``RLHF_LAB_FAULT_AT_STEP``): with
    ``RLHF_LAB_SIGTERM_AT=<point>[:<n>]`` the trainer sends itself SIGTERM the ``n``-th time
    (default: the first) it reaches ``point``: a phase it enters (``loading_model``,
    ``tokenizing``, ``reference_logprobs``, ``evaluating``, ``generating``, ``training`` ...) or a
    stop check (``micro_batch``, ``eval_batch``, ``token``, ``reference_batch``, and
    ``step_end``: the end of an optimizer step, where the loop checkpoints and stops)."""
    spec = os.environ.get(SIGTERM_ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name.strip() != point:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == (int(nth) if nth.strip().isdigit() else 1):
        os.kill(os.getpid(), signal.SIGTERM)


def reset_sigterm_hook() -> None:
    """Count the points of :func:`sigterm_self_at` from zero again (a new trainer run)."""
    _reached.clear()


# How often a long phase's item count may be written (a write is a small JSON file replaced).
PHASE_COUNT_EVERY_S = 2.0
_ACTIVE: RunDir | None = None
# progress.json fields each write sets again (not carried into the next phase)
_RUN_CLOCK = ("started_at", "phase_started_at", "phase_done", "phase_total")


def phase_progress(done: int, total: int) -> None:
    """Report ``done`` of ``total`` items of the current long phase (reference log-probs, a
    held-out evaluation ...) to this process's run folder (:meth:`RunDir.phase_count`, rate
    bounded); nothing outside a run. Loops that do not hold the RunDir call this."""
    if _ACTIVE is not None:
        _ACTIVE.phase_count(done, total)


def set_active_run(run: RunDir | None) -> None:
    """Make ``run`` the run folder :func:`phase_progress` reports to (each new :class:`RunDir`
    makes itself that folder); None: no folder, so counts go nowhere."""
    global _ACTIVE
    _ACTIVE = run


class RunDir:
    """Writer for one run directory. Create it once per process; it never deletes anything.

    ``writer=False`` (ranks other than 0 under torchrun): the same calls, nothing written; the
    rows a step logged are still counted, so every rank agrees on them. ``clock``: what every
    time it writes is read from (seconds since the epoch); ``count_every_s``: how often a long
    phase's item count may be written (:meth:`phase_count`)."""

    def __init__(
        self,
        path: str | Path,
        *,
        writer: bool = True,
        clock: Callable[[], float] = time.time,
        count_every_s: float = PHASE_COUNT_EVERY_S,
    ) -> None:
        self.path = Path(path)
        self.writer = writer
        self.clock = clock
        self.count_every_s = count_every_s
        if writer:
            self.path.mkdir(parents=True, exist_ok=True)
            self.samples_path.touch()  # present even when a run samples nothing
        self.start_time = self.clock()
        self.phase: str | None = None  # the phase progress.json shows (last written)
        self._rows_logged: dict[int, tuple[int, int]] = {}  # step -> (metrics, samples) rows
        self._progress: dict[str, Any] = {}  # the last progress.json payload written
        self._phase_started_at = self.start_time
        self._count_written_at = 0.0
        set_active_run(self)  # phase_progress() reports through the process's run folder

    # paths -----------------------------------------------------------------------------------
    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def samples_path(self) -> Path:
        return self.path / "samples.jsonl"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    # writers ---------------------------------------------------------------------------------
    def write_config(self, yaml_text: str) -> None:
        if self.writer:
            atomic_write_text(self.path / "config.yaml", yaml_text)

    def elapsed(self) -> float:
        return self.clock() - self.start_time

    def log_metrics(self, step: int, phase: str, metrics: dict[str, Any]) -> dict[str, Any]:
        """Append one row (``MetricRow``: step, time_s, phase, then the metrics)."""
        row = {"step": step, "time_s": round(self.elapsed(), 3), "phase": phase, **metrics}
        MetricRow.model_validate(row)
        if self.writer:
            append_jsonl(self.metrics_path, row)
        metrics, samples = self.rows_at(step)
        self._rows_logged[step] = (metrics + 1, samples)
        return row

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        for sample in samples if self.writer else []:
            append_jsonl(self.samples_path, {"step": step, **sample})
        metrics, count = self.rows_at(step)
        self._rows_logged[step] = (metrics, count + len(samples))

    def write_progress(
        self, step: int, total_steps: int | None, *, phase: Phase | None = None, **extra: Any
    ) -> None:
        """Replace progress.json (schema ``ProgressFile``); family fields (``epoch``,
        ``tokens_seen``, ``stage``, ``data`` ...) ride along. ``total_steps`` None: not known
        yet (the data is not loaded)."""
        payload: dict[str, Any] = {"step": step, "total_steps": total_steps}
        if phase is not None:
            payload["phase"] = phase
            if phase != self.phase:
                self._phase_started_at = self.clock()
        payload.update(
            elapsed_s=round(self.elapsed(), 3),
            updated_at=self.clock(),
            started_at=round(self.start_time, 3),
            phase_started_at=round(self._phase_started_at, 3),
            **extra,
        )
        ProgressFile.model_validate(payload)
        if self.writer:
            atomic_write_json(self.path / "progress.json", payload)
        self._progress = payload
        if phase is not None and phase != self.phase:
            self.phase = phase
            sigterm_self_at(phase)

    def phase_count(self, done: int, total: int) -> None:
        """Show ``done`` of ``total`` items of the current phase in progress.json (``phase_done``
        / ``phase_total``), at most every ``count_every_s`` seconds and always at the
        phase's last item, keeping everything else progress.json shows."""
        now = self.clock()
        if done < total and now - self._count_written_at < self.count_every_s:
            return
        self._count_written_at = now
        payload = {
            "step": 0,
            **self._progress,
            "phase_done": int(done),
            "phase_total": int(total),
            "elapsed_s": round(self.elapsed(), 3),
            "updated_at": now,
        }
        ProgressFile.model_validate(payload)
        if self.writer:
            atomic_write_json(self.path / "progress.json", payload)

    def update_phase(self, phase: Phase, total_steps: int | None = None) -> None:
        """Say what the trainer does now, keeping what progress.json already shows (step and
        family fields): the phases before the loop's first step, when a resumed run has not yet
        reloaded its step. ``total_steps`` replaces the shown total once it is known."""
        if not self.writer:  # nothing to read back; the phase still counts (sigterm_self_at)
            self.write_progress(0, total_steps, phase=phase)
            return
        previous, _ = read_file(self.path / "progress.json", ProgressFile)
        fields = previous.model_dump(exclude_unset=True) if previous is not None else {}
        for name in ("step", "total_steps", "phase", "elapsed_s", "updated_at", *_RUN_CLOCK):
            fields.pop(name, None)
        step = previous.step if previous is not None else 0
        total = total_steps if total_steps is not None else getattr(previous, "total_steps", None)
        self.write_progress(step, total, phase=phase, **fields)

    def write_summary(self, outcome: str, **fields: Any) -> None:
        """outcome: succeeded | failed | stopped (schema ``SummaryFile``). Also called from the
        failure path."""
        payload = {"outcome": outcome, "wall_time_s": round(self.elapsed(), 3), **fields}
        SummaryFile.model_validate(payload)
        if self.writer or outcome == "failed":  # any rank's crash ends the run (harness)
            atomic_write_json(self.path / "summary.json", payload)

    def write_summary_file(self, summary: SummaryFile) -> None:
        """Write a typed summary; its wall time is this process's (set here)."""
        fields = summary.model_dump(exclude_unset=True, exclude={"outcome", "wall_time_s"})
        self.write_summary(summary.outcome, **fields)

    def truncate_metrics_after(
        self, step: int, keep_at_step: tuple[int, int] | None = None
    ) -> None:
        """On resume: drop metric/sample rows logged after the checkpoint's step (they will be
        logged again), so the files hold exactly one history. ``keep_at_step`` (metrics rows,
        samples rows): of the rows at ``step`` itself keep only the first so many (a run stopped
        during the evaluation after ``step``: what that evaluation wrote goes, it runs again)."""
        if not self.writer:
            return
        for i, path in enumerate((self.metrics_path, self.samples_path)):
            if not path.exists():
                continue
            kept, at_step = [], 0
            for r in read_jsonl(path):
                at = r.get("step", 0)
                if at == step and keep_at_step is not None:
                    at_step += 1
                    if at_step > keep_at_step[i]:
                        continue
                if at <= step:
                    kept.append(r)
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

    def rows_at(self, step: int) -> tuple[int, int]:
        """How many metrics and samples rows this process logged at ``step`` (see
        :meth:`truncate_metrics_after`)."""
        metrics, samples = self._rows_logged.get(step, (0, 0))
        return metrics, samples
