"""The lab's one reader of a run folder. Torch-free.

Every file a run folder holds is read here and nowhere else in the lab: ``run.json``,
``process.json``, ``exit.json``, ``progress.json`` and ``summary.json`` through the schemas of
:mod:`trainers.core.runfolder`, ``metrics.jsonl`` / ``samples.jsonl`` as whole JSON lines (a run's ``config.yaml`` is read as the
typed view by :func:`rlhf_lab.planning.trainer_config.read_run_config`).
Nothing here raises on a damaged or old file: each reader returns what it could read plus at most
one warning per file, and the caller decides whether that warning is shown, stored in a ledger
row, or turned into a typed error (``run.json`` is the one file a status cannot do without).

``run.json`` is also kept as the JSON object it was written as (``RecordRead.data``): the lab
rewrites it under the run's lock and must keep keys no schema names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainers.core.runfolder import (
    RUN_STATES,
    ExitFile,
    MetricRow,
    ProcessFile,
    ProgressFile,
    RunFile,
    SummaryFile,
    read_file,
    validate_data,
)

__all__ = [
    "TAIL_BYTES",
    "JsonLines",
    "RecordRead",
    "RunFolder",
    "filled_record",
    "last_train_eval",
    "live_clock",
    "phase_count_text",
    "read_exit",
    "read_folder",
    "read_json_lines",
    "read_metric_rows",
    "read_process",
    "read_progress",
    "read_record",
    "read_summary",
    "record_as_run_file",
    "run_eval_rows",
    "tail_lines",
    "tail_metric_rows",
    "tail_text",
]

# How much of the end of metrics.jsonl a status reads (the ETA and the last rows need no more).
TAIL_BYTES = 256 * 1024


# ---------------------------------------------------------------------------------------------
# JSON files
# ---------------------------------------------------------------------------------------------


def read_json_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A file's JSON object and no warning; ``(None, None)`` when the file is absent; ``(None,
    warning)`` when it is unreadable, not JSON or not an object. Never raises."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"{path.name} is unreadable ({err.strerror or err}); its fields are left out"
    try:
        data = json.loads(text)
    except ValueError as err:
        line = getattr(err, "lineno", None)
        where = f" at line {line}" if line else ""
        return None, f"{path.name} is unreadable (not valid JSON{where}); its fields are left out"
    if not isinstance(data, dict):
        return None, (
            f"{path.name} is unreadable (a JSON {type(data).__name__}, not an object); its fields "
            "are left out"
        )
    return data, None


@dataclass(frozen=True)
class RecordRead:
    """``run.json`` as read: its object as written, the typed record when it fits, a warning."""

    data: dict[str, Any] | None
    run: RunFile | None
    warning: str | None


def filled_record(run_dir: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``run.json``'s object with the identity a hand-made or old file left out taken from the
    folder (id, campaign) or read "?" (family, algorithm), null values dropped, and an unknown
    state read as ``died``, as the lab always treated them."""
    filled: dict[str, Any] = {
        "id": run_dir.name,
        "family": "?",
        "algorithm": "?",
        "campaign": run_dir.parent.parent.name,
    }
    filled.update({k: v for k, v in data.items() if v is not None})
    if filled.get("state") not in RUN_STATES:
        filled["state"] = "died"
    return filled


def record_as_run_file(run_dir: Path, data: dict[str, Any]) -> tuple[RunFile | None, str | None]:
    """``run.json``'s object as a :class:`RunFile` (filled by :func:`filled_record`); a value of
    the wrong type is a warning."""
    return validate_data(filled_record(run_dir, data), RunFile, "run.json")


def read_record(run_dir: Path) -> RecordRead:
    """``run.json`` of ``run_dir``: missing -> no data and no warning; damaged -> a warning."""
    data, warning = read_json_object(run_dir / "run.json")
    if data is None:
        return RecordRead(None, None, warning)
    run, warning = record_as_run_file(run_dir, data)
    return RecordRead(data, run, warning)


def read_process(run_dir: Path) -> tuple[ProcessFile | None, str | None]:
    """``process.json`` (the wrapper's and the trainer's pid and create time)."""
    return read_file(run_dir / "process.json", ProcessFile)


def read_exit(run_dir: Path) -> tuple[ExitFile | None, str | None]:
    """``exit.json`` (how the trainer process ended, from the wrapper)."""
    return read_file(run_dir / "exit.json", ExitFile)


def read_progress(run_dir: Path) -> tuple[ProgressFile | None, str | None]:
    """``progress.json`` (the trainer's step, total and phase)."""
    return read_file(run_dir / "progress.json", ProgressFile)


# How a phase is named beside its count ("reference log-probs 120/640").
PHASE_WORDS = {
    "reference_logprobs": "reference log-probs",
    "loading_model": "loading the model",
    "evaluating": "evaluating",
    "generating": "generating",
    "tokenizing": "tokenizing",
}


@dataclass(frozen=True)
class LiveClock:
    """A live run's clock at read time: elapsed seconds since the trainer started, and the
    seconds left in its current counted phase (None when the phase has no count yet)."""

    elapsed_s: float | None
    phase_eta_s: float | None


def live_clock(progress: ProgressFile | None, now: float) -> LiveClock:
    """The elapsed time of a live run computed at ``now`` from progress.json (its
    ``started_at``, else ``updated_at − elapsed_s``), so it moves between the trainer's writes
    (a long phase writes rarely); and the ETA of a counted phase (time in the phase per item
    done × items left)."""
    if progress is None:
        return LiveClock(None, None)
    start = progress.started_at
    if start is None and progress.updated_at is not None and progress.elapsed_s is not None:
        start = progress.updated_at - progress.elapsed_s
    elapsed = round(max(now - start, 0.0), 1) if start is not None else progress.elapsed_s
    done, total, began = progress.phase_done, progress.phase_total, progress.phase_started_at
    eta = None
    if done and total and began is not None and done <= total:
        eta = round(max(now - began, 0.0) / done * (total - done), 1)
    return LiveClock(elapsed, eta)


def phase_count_text(phase: str | None, done: int | None, total: int | None) -> str | None:
    """``reference log-probs 120/640`` (None without a count)."""
    if done is None or not total:
        return None
    return f"{PHASE_WORDS.get(phase or '', phase or 'phase')} {done}/{total}"


def read_summary(run_dir: Path) -> tuple[SummaryFile | None, str | None]:
    """``summary.json`` (how the trainer says the run ended, with its final metrics)."""
    return read_file(run_dir / "summary.json", SummaryFile)


@dataclass
class RunFolder:
    """Every JSON file of a run folder, typed, and one warning per damaged file."""

    path: Path
    record: RecordRead
    process: ProcessFile | None = None
    exit: ExitFile | None = None
    progress: ProgressFile | None = None
    summary: SummaryFile | None = None
    warnings: list[str] = field(default_factory=list)


def read_folder(run_dir: Path) -> RunFolder:
    """Read run.json, process.json, exit.json, progress.json and summary.json at once."""
    record = read_record(run_dir)
    folder = RunFolder(path=run_dir, record=record)
    if record.warning:
        folder.warnings.append(record.warning)
    for attr, reader in (
        ("process", read_process),
        ("exit", read_exit),
        ("progress", read_progress),
        ("summary", read_summary),
    ):
        value, warning = reader(run_dir)
        setattr(folder, attr, value)
        if warning:
            folder.warnings.append(warning)
    return folder


# ---------------------------------------------------------------------------------------------
# JSON lines
# ---------------------------------------------------------------------------------------------


@dataclass
class JsonLines:
    """The whole JSON-object lines of a JSONL file and how many lines were skipped."""

    rows: list[dict[str, Any]]
    skipped: int = 0
    warning: str | None = None


def _object(line: bytes | str) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return row if isinstance(row, dict) else None


def _metric_row(line: bytes | str) -> dict[str, Any] | None:
    """A metrics line as the object it was written as, when it fits :class:`MetricRow`."""
    row = _object(line)
    if row is None:
        return None
    try:
        MetricRow.model_validate(row)
    except ValidationError:
        return None
    return row


def _read_lines(path: Path, parse, label: str) -> JsonLines:  # noqa: ANN001 - a line parser
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return JsonLines([])
    except OSError as err:
        return JsonLines([], warning=f"{label} is unreadable ({err}); left out")
    rows, bad = [], 0
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        row = parse(line.decode("utf-8", errors="replace"))
        if row is None:
            bad += 1
        else:
            rows.append(row)
    warning = None
    if bad:
        warning = f"{label}: {bad} unreadable line(s) skipped (truncated or corrupt write)"
    return JsonLines(rows, bad, warning)


def read_metric_rows(path: Path) -> JsonLines:
    """Every whole row of ``metrics.jsonl`` (a torn or foreign line is skipped and counted)."""
    return _read_lines(path, _metric_row, path.name)


def read_json_lines(path: Path) -> JsonLines:
    """Every whole JSON-object line of a JSONL file such as ``samples.jsonl``."""
    return _read_lines(path, _object, path.name)


def tail_lines(path: Path, max_bytes: int = TAIL_BYTES) -> list[bytes]:
    """The last ``max_bytes`` of a file split into lines (a line cut by the window's start is
    dropped); no lines when the file cannot be read."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    return lines[1:] if start > 0 else lines


def tail_metric_rows(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """Whole metric rows from the end of ``metrics.jsonl`` (a torn last line is skipped)."""
    rows = (_metric_row(line) for line in tail_lines(path, max_bytes))
    return [row for row in rows if row is not None]


def last_train_eval(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The last train row and the last eval row of the tail window, decoding lines from the end
    only until both are found: listing many finished runs then parses a few lines of each."""
    last: dict[str, dict[str, Any]] = {}
    for line in reversed(tail_lines(path)):
        row = _metric_row(line)
        phase = row.get("phase") if row is not None else None
        if phase in ("train", "eval") and phase not in last:
            last[phase] = row
            if len(last) == 2:
                break
    return last.get("train", {}), last.get("eval", {})


def _head_lines(path: Path, max_bytes: int) -> list[bytes]:
    """The first ``max_bytes`` of a file split into lines (a line cut by the window's end is
    dropped); no lines when the file cannot be read."""
    try:
        with path.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError:
        return []
    lines = data[:max_bytes].split(b"\n")
    return lines[:-1] if len(data) > max_bytes else lines


def run_eval_rows(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The eval rows of ``metrics.jsonl`` from its first and last ``max_bytes`` (the whole file
    when it is smaller than both windows), in order and without repeats: the step-0 evaluation
    and the latest ones, which the headline's start value and its "moved at all" test read."""
    try:
        size = path.stat().st_size
    except OSError:
        return []
    lines = _head_lines(path, max_bytes)
    if size > max_bytes:  # the windows may overlap: a row read twice is kept once
        lines = lines + tail_lines(path, max_bytes)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for line in lines:
        row = _metric_row(line)
        if row is None or row.get("phase") != "eval":
            continue
        key = json.dumps(row, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def tail_text(path: Path, max_bytes: int = 8192) -> str:
    """The last ``max_bytes`` of a text file such as train.log ("" when unreadable)."""
    return b"\n".join(tail_lines(path, max_bytes)).decode(errors="replace")
