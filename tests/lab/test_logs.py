"""tail_log, read_metrics and diagnose on run directories written by hand."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from rlhf_lab.paths import LabError
from rlhf_lab.results.diagnosis import (
    diagnose,
    fold_carriage_returns,
    last_traceback,
    read_metrics,
    tail_log,
)
from rlhf_lab.results.divergence import repetition_reason

CAMPAIGN = "2026-01-01-synthetic"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_ROOT", str(tmp_path))
    return tmp_path


def make_run(
    root: Path,
    run_id: str = "dpo-20260101-000000-aaaa",
    *,
    family: str = "direct_alignment",
    state: str = "succeeded",
    record: dict | None = None,
    **files,
) -> Path:
    """A run folder: run.json plus files given as name=content (list -> JSONL, dict -> JSON,
    str/bytes -> verbatim). Use `train_log=` for train.log and so on (`_` for `.`)."""
    run_dir = root / "experiments" / CAMPAIGN / "runs" / run_id
    run_dir.mkdir(parents=True)
    rec = {
        "id": run_id,
        "family": family,
        "algorithm": run_id.split("-")[0],
        "campaign": CAMPAIGN,
        "device": "cpu",
        "state": state,
        "created_at": "2026-01-01T00:00:00+00:00",
        **(record or {}),
    }
    (run_dir / "run.json").write_text(json.dumps(rec))
    for key, content in files.items():
        name = key.replace("_", ".", 1) if "_" in key else key
        path = run_dir / name
        if isinstance(content, list):
            path.write_text("".join(json.dumps(r) + "\n" for r in content))
        elif isinstance(content, dict):
            path.write_text(json.dumps(content))
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return run_dir


def kinds(run_id: str = "dpo-20260101-000000-aaaa", **kw) -> list[str]:
    return [a.kind for a in diagnose(run_id, **kw)]


# ---------------------------------------------------------------------------------------------
# tail
# ---------------------------------------------------------------------------------------------


def test_fold_carriage_returns_keeps_the_last_state_of_each_line():
    assert fold_carriage_returns("a\r b\r done\nnext\r\n") == " done\nnext\n"
    assert fold_carriage_returns("plain\n") == "plain\n"


def test_tail_returns_the_last_lines_folded(root):
    lines = [f"line {i}" for i in range(100)]
    bar = " 10%|#         |\r 50%|#####     |\r100%|##########| done"
    run_dir = make_run(root, train_log="\n".join(lines + [bar, "after"]) + "\n")
    chunk = tail_log("dpo-20260101-000000-aaaa", lines=3)
    assert chunk.text == "line 99\n100%|##########| done\nafter\n"
    assert chunk.cursor == (run_dir / "train.log").stat().st_size == chunk.size
    assert chunk.eof and not chunk.truncated


def test_tail_caps_bytes_and_never_splits_a_character(root):
    long_line = "é" * 5000  # 10 000 bytes
    make_run(root, train_log="short\n" + long_line + "\n" + "x" * 30 + "\n")
    chunk = tail_log("dpo-20260101-000000-aaaa", lines=3, max_bytes=100)
    assert len(chunk.text.encode()) <= 100 and chunk.truncated
    assert chunk.text.endswith("x" * 30 + "\n") and "short" not in chunk.text
    chunk = tail_log("dpo-20260101-000000-aaaa", lines=1, max_bytes=21)
    assert chunk.text == "x" * 20 + "\n"  # one line larger than the cap: its end
    make_run(root, "dpo-20260101-000000-bbbb", train_log=long_line + "\n")
    chunk = tail_log("dpo-20260101-000000-bbbb", lines=1, max_bytes=100)
    assert chunk.text == "é" * 49 + "\n" and chunk.truncated  # no half character


def test_tail_with_a_cursor_reads_incrementally_whole_lines(root):
    run_dir = make_run(root, train_log="".join(f"step {i}\r step {i} done\n" for i in range(40)))
    log = run_dir / "train.log"
    run_id = "dpo-20260101-000000-aaaa"
    cursor, texts, reads = 0, [], 0
    while True:
        chunk = tail_log(run_id, cursor=cursor, max_bytes=64)
        reads += 1
        assert chunk.text.endswith("\n") and len(chunk.text.encode()) <= 64
        texts.append(chunk.text)
        assert chunk.truncated == (not chunk.eof)
        cursor = chunk.cursor
        if chunk.eof:
            break
    assert reads > 5
    assert "".join(texts) == "".join(f" step {i} done\n" for i in range(40))
    assert cursor == log.stat().st_size

    # nothing new: empty text, same cursor
    chunk = tail_log(run_id, cursor=cursor)
    assert chunk.text == "" and chunk.cursor == cursor and chunk.eof
    # new output, with a line still being written: whole lines only
    with log.open("a") as fh:
        fh.write("new 1\nnew 2\npartial")
    chunk = tail_log(run_id, cursor=cursor)
    assert chunk.text == "new 1\nnew 2\n" and chunk.cursor == log.stat().st_size - len("partial")
    assert not chunk.eof
    cursor = chunk.cursor
    assert tail_log(run_id, cursor=cursor, final=True).text == "partial"
    past = time.time() - 60
    os.utime(log, (past, past))  # the writer went quiet: the partial line comes out
    chunk = tail_log(run_id, cursor=cursor)
    assert chunk.text == "partial" and chunk.eof
    # a cursor past the end (file replaced) is clamped; a negative one is refused
    assert tail_log(run_id, cursor=10**9).cursor == log.stat().st_size
    with pytest.raises(LabError, match="cursor"):
        tail_log(run_id, cursor=-1)


def test_tail_of_a_missing_log_and_of_a_bad_id(root):
    make_run(root)
    chunk = tail_log("dpo-20260101-000000-aaaa")
    assert chunk.text == "" and chunk.eof and chunk.cursor == 0
    with pytest.raises(LabError, match="bad run id"):
        tail_log("../../etc")


# ---------------------------------------------------------------------------------------------
# metrics
# ---------------------------------------------------------------------------------------------


def metric_rows() -> list[dict]:
    rows = []
    for step in range(1, 102):
        rows.append({"step": step, "time_s": step * 0.5, "phase": "train", "loss": 1 / step})
        if step % 10 == 0 or step == 101:
            rows.append({"step": step, "time_s": step * 0.5, "phase": "eval", "eval/loss": 2.0})
    rows[5]["loss"] = "nan"
    return rows


def test_read_metrics_downsamples_evenly_keeping_the_last_point(root):
    run_dir = make_run(root, metrics_jsonl=metric_rows())
    with (run_dir / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 102, "time_s": 51.0, "pha')  # the writer was cut mid-line
    run_id = "dpo-20260101-000000-aaaa"

    full = read_metrics(run_id)
    assert full.total_rows == len(full.rows) == 101 + 11 and not full.downsampled
    assert set(full.keys) == {"loss", "eval/loss"}

    train = read_metrics(run_id, phase="train", max_points=10)
    steps = [r["step"] for r in train.rows]
    assert len(steps) == 10 and steps[0] == 1 and steps[-1] == 101 and train.downsampled
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    assert max(gaps) - min(gaps) <= 1  # evenly spread
    assert train.total_rows == 101

    both = read_metrics(run_id, max_points=4)  # per phase
    assert [r["step"] for r in both.rows if r["phase"] == "eval"][-1] == 101
    assert len([r for r in both.rows if r["phase"] == "eval"]) == 4
    assert len([r for r in both.rows if r["phase"] == "train"]) == 4

    only = read_metrics(run_id, keys=["loss"])
    assert all(set(r) == {"step", "time_s", "phase", "loss"} for r in only.rows)
    assert only.total_rows == 101 and only.rows[5]["loss"] == "nan"  # non-finite kept as text
    assert read_metrics(run_id, max_points=1, phase="eval").rows[0]["step"] == 101
    with pytest.raises(LabError):
        read_metrics(run_id, max_points=0)


# ---------------------------------------------------------------------------------------------
# diagnose
# ---------------------------------------------------------------------------------------------

TRACE_A = """Traceback (most recent call last):
  File "a.py", line 1, in <module>
    first()
ValueError: the first failure
"""
TRACE_B = """Traceback (most recent call last):
  File "train.py", line 9, in train
    loss.backward()
  File "torch/_tensor.py", line 5, in backward
    run()
RuntimeError: the real failure
"""


def test_a_clean_run_has_no_alerts(root):
    rows = [
        {"step": s, "time_s": s, "phase": "eval", "eval/accuracy": 0.5 + s / 20}
        for s in range(0, 8)
    ]
    make_run(
        root,
        train_log="step 1/3\nstep 2/3\n",
        metrics_jsonl=rows,
        exit_json={"exit_code": 0, "signal": None},
        summary_json={"outcome": "succeeded"},
        samples_jsonl=[{"step": 3, "prompt": "p", "completion": "<answer>12</answer> fine"}],
    )
    assert diagnose("dpo-20260101-000000-aaaa") == []


def test_cuda_oom_text_and_the_failure_traceback(root):
    log = (
        "step 1/9\n"
        + TRACE_A
        + "step 2/9\n"
        + TRACE_B.replace(
            "RuntimeError: the real failure",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        )
    )
    make_run(root, state="failed", train_log=log, exit_json={"exit_code": 1, "signal": None})
    alerts = {a.kind: a for a in diagnose("dpo-20260101-000000-aaaa")}
    assert alerts["oom"].severity == "error" and "CUDA out of memory" in alerts["oom"].message
    assert "batch_size" in alerts["oom"].hint
    failed = alerts["failed"]
    assert "code 1" in failed.message and "OutOfMemoryError" in failed.message
    assert failed.detail.startswith("Traceback") and "first failure" not in failed.detail


def test_failure_prefers_the_summary_traceback_and_exit_2_points_at_the_config(root):
    make_run(
        root,
        state="failed",
        train_log=TRACE_A,
        exit_json={"exit_code": 1, "signal": None},
        summary_json={
            "outcome": "failed",
            "error": "RuntimeError: the real failure",
            "traceback": TRACE_B,
        },
    )
    (alert,) = diagnose("dpo-20260101-000000-aaaa")
    assert alert.kind == "failed" and "the real failure" in alert.message
    assert alert.detail.rstrip().endswith("RuntimeError: the real failure")
    assert "first failure" not in alert.detail

    make_run(
        root,
        "dpo-20260101-000000-bbbb",
        state="failed",
        train_log="error: invalid config (x.yaml):\n  - unknown key 'train.lr'\n",
        exit_json={"exit_code": 2, "signal": None},
    )
    (alert,) = diagnose("dpo-20260101-000000-bbbb")
    assert alert.kind == "failed" and "unknown key 'train.lr'" in alert.message
    assert "config" in alert.hint and alert.detail is None


def test_last_traceback_extracts_the_final_block():
    text = "noise\n" + TRACE_A + "more noise\n" + TRACE_B + "trailing line\n"
    block = last_traceback(text)
    assert block.startswith("Traceback") and block.endswith("RuntimeError: the real failure")
    assert "first failure" not in block and last_traceback("no trace here") is None


def test_killed_line_and_sigkill_exit_mean_oom(root):
    make_run(root, state="died", train_log="step 4/9\nKilled\n")
    assert kinds() == ["oom"]
    make_run(
        root,
        "dpo-20260101-000000-bbbb",
        state="died",
        train_log="step 4/9\n",
        exit_json={"exit_code": None, "signal": 9, "signal_name": "SIGKILL"},
    )
    (alert,) = diagnose("dpo-20260101-000000-bbbb")
    assert alert.kind == "oom" and "SIGKILL" in alert.message and alert.hint
    # gone without any exit status at all
    make_run(root, "dpo-20260101-000000-cccc", state="died", train_log="step 4/9\n")
    assert kinds("dpo-20260101-000000-cccc") == ["died"]


def test_nan_and_inf_values(root):
    rows = [{"step": s, "time_s": s, "phase": "train", "loss": 0.5} for s in range(1, 6)]
    rows[2]["loss"] = "nan"
    rows[3]["grad_norm"] = "inf"
    make_run(root, metrics_jsonl=rows)
    (alert,) = diagnose("dpo-20260101-000000-aaaa")
    assert alert.kind == "nan_loss" and alert.step == 3 and "loss" in alert.message
    assert "learning_rate" in alert.hint


def live_record() -> dict:
    """run.json fields that make this very test process the run's (live) process."""
    return {"pid": os.getpid(), "create_time": psutil.Process().create_time()}


def test_stalled_running_run(root):
    run_dir = make_run(
        root,
        state="running",
        record=live_record(),
        train_log="step 5/100\n",
        progress_json={"step": 5, "total_steps": 100, "elapsed_s": 50, "updated_at": 1.0},
    )
    past = time.time() - 3600
    for name in ("train.log", "progress.json", "run.json"):
        os.utime(run_dir / name, (past, past))
    alerts = diagnose("dpo-20260101-000000-aaaa", stall_after_s=600)
    assert [a.kind for a in alerts] == ["stalled"]
    assert "60 min" in alerts[0].message and "py-spy" in alerts[0].hint
    # the same run with a fresh log line is not stalled
    (run_dir / "train.log").write_text("step 6/100\n")
    assert kinds(stall_after_s=600) == []


def test_no_reward_contrast_needs_three_rows_in_a_row(root):
    def rows(values):
        return [
            {"step": i + 1, "time_s": i, "phase": "train", "frac_reward_zero_std": v}
            for i, v in enumerate(values)
        ]

    make_run(root, family="policy_gradients", metrics_jsonl=rows([0.5, 0.95, 0.92, 1.0, 0.3]))
    (alert,) = diagnose("dpo-20260101-000000-aaaa")
    assert alert.kind == "no_reward_contrast" and alert.step == 2 and "SFT" in alert.hint
    make_run(
        root,
        "grpo-20260101-000000-bbbb",
        family="policy_gradients",
        metrics_jsonl=rows([0.95, 0.95, 0.5, 0.95, 0.95]),
    )
    assert kinds("grpo-20260101-000000-bbbb") == []


def test_repetition_collapse_in_the_latest_samples(root):
    collapsed = "the answer is " + "the the " * 20
    looping = "<think> 1 + 1 </think> " * 8
    fine = "<think>3 plus 4 is 7</think><answer>7</answer>"
    assert repetition_reason(collapsed) and repetition_reason(looping)
    assert repetition_reason("a" * 60) and repetition_reason(fine) is None
    make_run(
        root,
        samples_jsonl=[
            {"step": 10, "prompt": "p", "completion": fine},
            {"step": 20, "prompt": "p", "completion": collapsed},
            {"step": 20, "prompt": "q", "completion": looping},
        ],
    )
    (alert,) = diagnose("dpo-20260101-000000-aaaa")
    assert alert.kind == "repetition" and alert.step == 20 and "2/2" in alert.message
    # collapse earlier on, healthy now: no alert
    make_run(
        root,
        "dpo-20260101-000000-bbbb",
        samples_jsonl=[
            {"step": 10, "prompt": "p", "completion": collapsed},
            {"step": 20, "prompt": "p", "completion": fine},
        ],
    )
    assert kinds("dpo-20260101-000000-bbbb") == []


@pytest.mark.parametrize(
    ("family", "key", "phase", "flat", "moving"),
    [
        ("direct_alignment", "eval/accuracy", "eval", [0.6] * 6, [0.5, 0.55, 0.6, 0.6, 0.7, 0.8]),
        ("policy_gradients", "avg_correctness", "train", [0.2] * 8, [0.1 * i for i in range(8)]),
        ("reward_models", "eval/accuracy", "eval", [0.7] * 6, [0.6, 0.7, 0.7, 0.7, 0.7, 0.75]),
        ("sft", "loss", "train", [2.0] * 7, [2.0, 1.8, 1.6, 1.5, 1.4, 1.3, 1.2]),
    ],
)
def test_flat_learning_per_family(root, family, key, phase, flat, moving):
    def rows(values):
        return [{"step": i, "time_s": i, "phase": phase, key: v} for i, v in enumerate(values)]

    make_run(root, "x-20260101-000000-aaaa", family=family, metrics_jsonl=rows(flat))
    (alert,) = diagnose("x-20260101-000000-aaaa")
    assert alert.kind == "flat_learning" and key in alert.message and alert.hint
    make_run(root, "x-20260101-000000-bbbb", family=family, metrics_jsonl=rows(moving))
    assert kinds("x-20260101-000000-bbbb") == []
    # too few rows to judge, or a saturated accuracy, is not "flat"
    make_run(root, "x-20260101-000000-cccc", family=family, metrics_jsonl=rows(flat[:3]))
    assert kinds("x-20260101-000000-cccc") == []


def test_saturated_accuracy_is_not_flat(root):
    rows = [{"step": i, "time_s": i, "phase": "eval", "eval/accuracy": 1.0} for i in range(8)]
    make_run(root, metrics_jsonl=rows)
    assert kinds() == []


@pytest.mark.parametrize(
    "line",
    [
        "huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/x",
        "transformers ModelNotAvailableError: model 'org/x' is not cached",
        "datasets.exceptions.DatasetNotFoundError: Dataset 'org/d' doesn't exist",
        "OSError: We couldn't connect. Couldn't reach 'org/x' on the Hub (ConnectionError)",
    ],
)
def test_hub_download_failure(root, line):
    make_run(
        root,
        state="failed",
        train_log=f"loading\n{line}\n",
        exit_json={"exit_code": 1, "signal": None},
    )
    alerts = {a.kind: a for a in diagnose("dpo-20260101-000000-aaaa")}
    assert set(alerts) == {"download_failure", "failed"}
    assert line[:40] in alerts["download_failure"].message
    assert "tiny" in alerts["download_failure"].hint


def test_runs_reads_train_log_without_importing_logs():
    """logs imports runs (a diagnosis needs the run's state); runs follows train.log through
    rlhf_lab.runs.log, so no module of the runs package imports rlhf_lab.results.diagnosis, even lazily."""
    import ast

    import rlhf_lab.runs

    package = Path(rlhf_lab.runs.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert "rlhf_lab.results.diagnosis" not in names, (
                f"{path.name} imports rlhf_lab.results.diagnosis"
            )
