"""The lab's one run-folder reader (rlhf_lab/runs/folder.py): a good folder reads typed with no
warning; a missing file is no warning; a damaged or old file gives exactly one warning naming it
and the rest of the folder still reads; metrics lines that are torn or foreign are skipped and
counted. Also: the wrapper's exit.json / process.json fit the contract, and the lab uses one set
of run states."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_lab import ledger, runs
from rlhf_lab.results import diagnosis as logs
from rlhf_lab.runs import resources
from rlhf_lab.runs.folder import (
    last_train_eval,
    read_folder,
    read_json_lines,
    read_metric_rows,
    read_record,
    record_as_run_file,
    tail_metric_rows,
)
from trainers.core import runfolder as contract
from trainers.core.runfolder import ExitFile, ProcessFile, ProgressFile, RunFile, SummaryFile

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "dpo-20260101-000000-f00d"

GOOD = {
    "run.json": {
        "id": RUN_ID,
        "family": "direct_alignment",
        "algorithm": "dpo",
        "campaign": "2026-01-01-reader",
        "state": "succeeded",
        "starting_at": "2026-01-01T00:00:00+00:00",  # a key no schema names: kept
    },
    "process.json": {"wrapper_pid": 10, "trainer_pid": 11, "trainer_create_time": 1.5},
    "exit.json": {"exit_code": 0, "signal": None, "ended_at": "2026-01-01T00:01:00+00:00"},
    "progress.json": {"step": 4, "total_steps": 4, "phase": "done", "epoch": 1},
    "summary.json": {"outcome": "succeeded", "steps": 4, "final_metrics": {"loss": 0.5}},
}
ROWS = [
    {"step": 1, "time_s": 0.1, "phase": "train", "loss": 0.7},
    {"step": 1, "time_s": 0.2, "phase": "eval", "eval/accuracy": 0.5},
    {"step": 2, "time_s": 0.3, "phase": "train", "loss": 0.6},
]


def good_folder(tmp_path: Path) -> Path:
    run_dir = tmp_path / "experiments" / "2026-01-01-reader" / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    for name, data in GOOD.items():
        (run_dir / name).write_text(json.dumps(data))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return run_dir


def test_a_good_folder_reads_typed_with_no_warning(tmp_path):
    folder = read_folder(good_folder(tmp_path))
    assert folder.warnings == []
    assert isinstance(folder.record.run, RunFile) and folder.record.run.state == "succeeded"
    assert folder.record.data["starting_at"] == "2026-01-01T00:00:00+00:00"
    assert isinstance(folder.process, ProcessFile) and folder.process.trainer_pid == 11
    assert isinstance(folder.exit, ExitFile) and folder.exit.exit_code == 0
    assert isinstance(folder.progress, ProgressFile) and folder.progress.phase == "done"
    assert folder.progress.epoch == 1  # a family-specific field rides along
    assert isinstance(folder.summary, SummaryFile) and folder.summary.final_metrics == {"loss": 0.5}


ATTRS = {
    "run.json": "record",
    "process.json": "process",
    "exit.json": "exit",
    "progress.json": "progress",
    "summary.json": "summary",
}
DAMAGE = {
    "garbage": lambda name: b"\x00\xff{garbage\x9c\n",
    "cut": lambda name: json.dumps(GOOD[name])[:9].encode(),
    "empty": lambda name: b"",
    "list": lambda name: b"[1, 2, 3]\n",
    # an old or foreign version: the right keys holding values of another type
    "old": lambda name: json.dumps(
        {
            "run.json": {"state": "running", "pid": "abc"},
            "process.json": {"trainer_pid": "eleven"},
            "exit.json": {"exit_code": "zero"},
            "progress.json": {"step": "four", "phase": "warming-up"},
            "summary.json": {"outcome": "done"},
        }[name]
    ).encode(),
}


def _value(folder, name: str):  # noqa: ANN001, ANN202 - test helper
    value = getattr(folder, ATTRS[name])
    return value.run if name == "run.json" else value


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_damaged_or_old_file_gives_one_warning_and_the_rest_still_reads(tmp_path, name, damage):
    run_dir = good_folder(tmp_path)
    (run_dir / name).write_bytes(DAMAGE[damage](name))
    folder = read_folder(run_dir)
    assert len(folder.warnings) == 1 and name in folder.warnings[0], folder.warnings
    assert "Traceback" not in folder.warnings[0]
    assert _value(folder, name) is None
    for other in set(GOOD) - {name}:  # every other file still reads, typed
        assert _value(folder, other) is not None, other


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_missing_file_is_none_without_a_warning(tmp_path, name):
    run_dir = good_folder(tmp_path)
    (run_dir / name).unlink()
    folder = read_folder(run_dir)
    assert folder.warnings == [] and _value(folder, name) is None


def test_an_old_run_json_keeps_its_data_for_the_lab_and_fills_identity_from_the_folder(tmp_path):
    run_dir = good_folder(tmp_path)
    (run_dir / "run.json").write_text(json.dumps({"state": "paused-by-hand", "pid": 12}))
    found = read_record(run_dir)
    assert found.warning is None and found.data == {"state": "paused-by-hand", "pid": 12}
    assert found.run.id == RUN_ID and found.run.campaign == "2026-01-01-reader"
    assert found.run.family == "?" and found.run.state == "died"  # an unknown state is died
    run, warning = record_as_run_file(run_dir, {"pid": "abc"})
    assert run is None and "pid" in warning and "run.json" in warning


def test_metric_lines_torn_or_foreign_are_skipped_and_counted(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines.insert(1, '"just a string"')  # valid JSON, not a row
    lines.insert(2, json.dumps({"phase": "train", "loss": 1.0}))  # no step: not a metric row
    lines.insert(3, "\xff\x00 junk")
    path.write_text("\n".join(lines) + '\n{"step": 3, "pha')  # torn last line
    found = read_metric_rows(path)
    assert found.rows == ROWS and found.skipped == 4
    assert found.warning == (
        "metrics.jsonl: 4 unreadable line(s) skipped (truncated or corrupt write)"
    )
    assert tail_metric_rows(path) == ROWS
    assert last_train_eval(path) == (ROWS[2], ROWS[1])
    assert read_metric_rows(tmp_path / "absent.jsonl").rows == []
    assert read_metric_rows(tmp_path / "absent.jsonl").warning is None


def test_the_tail_window_drops_the_line_it_cuts(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    last = len(json.dumps(ROWS[-1])) + 1
    assert tail_metric_rows(path, max_bytes=last + 5) == [ROWS[-1]]


def test_samples_lines_need_no_step(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"prompt": "p", "completion": "c"}\nnot json\n')
    found = read_json_lines(path)
    assert found.rows == [{"prompt": "p", "completion": "c"}] and found.skipped == 1


# ---------------------------------------------------------------------------------------------
# The wrapper writes what the contract reads
# ---------------------------------------------------------------------------------------------


def _run_wrapper(run_dir: Path, *cmd: str) -> int:
    return subprocess.run(
        [sys.executable, "-m", "rlhf_lab._wrapper", str(run_dir), "--", *cmd],
        cwd=REPO,
        capture_output=True,
        timeout=60,
    ).returncode


def _fields_fit(path: Path, model: type) -> dict:
    """The file's keys are all fields of ``model`` (no extras) and it validates."""
    data = json.loads(path.read_text())
    assert set(data) <= set(model.model_fields), set(data) - set(model.model_fields)
    value, warning = contract.read_file(path, model)
    assert warning is None and value is not None
    return data


def test_a_real_wrapper_runs_files_fit_exit_file_and_process_file(tmp_path):
    code = _run_wrapper(tmp_path, sys.executable, "-c", "import sys; sys.exit(3)")
    assert code == 3
    exit_data = _fields_fit(tmp_path / "exit.json", ExitFile)
    assert exit_data["exit_code"] == 3 and exit_data["signal"] is None
    process = _fields_fit(tmp_path / "process.json", ProcessFile)
    assert process["trainer_pid"] == exit_data["trainer_pid"] and process["wrapper_pid"] > 0

    # a trainer that cannot be started: exit.json still fits, with the error
    other = tmp_path / "cannot-start"
    other.mkdir()
    assert _run_wrapper(other, str(tmp_path / "no-such-program")) == 127
    exit_data = _fields_fit(other / "exit.json", ExitFile)
    assert exit_data["exit_code"] == 127 and exit_data["error"]


# ---------------------------------------------------------------------------------------------
# One set of run states
# ---------------------------------------------------------------------------------------------


def test_the_lab_uses_the_contracts_run_states():
    assert runs.STATES == contract.RUN_STATES
    assert runs.TERMINAL_STATES == ledger.TERMINAL_STATES == contract.TERMINAL_STATES
    # runs' "active" (a process exists or is coming up) is the contract's LIVE_STATES; the
    # ledger's includes queued, as the contract's ACTIVE_STATES does
    assert runs.ACTIVE_STATES == resources.ACTIVE_STATES == contract.LIVE_STATES
    assert ledger.ACTIVE_STATES == runs.UNFINISHED_STATES == contract.ACTIVE_STATES
    assert logs.TERMINAL_STATES is contract.TERMINAL_STATES
