"""trainers/core/loop.py on its own: the step cursor and resume, every(), progress phases,
the typed summary, checkpoint-or-stop. A fake family drives the skeleton through the harness."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from trainers.core import harness
from trainers.core.config import (
    CheckpointSection,
    ConfigError,
    LoggingSection,
    OptimSection,
    StrictModel,
)
from trainers.core.harness import StopRequested, run_trainer, write_first_progress
from trainers.core.loop import (
    BestMetric,
    EpochStep,
    StepTimer,
    TrainingRun,
    count_steps,
    epoch_total_steps,
    every,
    round_robin,
    step_metrics,
)
from trainers.core.rundir import RunDir, read_jsonl
from trainers.core.runfolder import ProgressFile, SummaryFile, read_file
from trainers.core.training import build_optimizer, list_checkpoints

FOUR_A_STEP = OptimSection(batch_size=2, gradient_accumulation_steps=2, num_epochs=3)

# --------------------------------------------------------------------------------- every()


@pytest.mark.parametrize(
    ("step", "n", "total", "at_end", "expected"),
    [
        (2, 2, 5, True, True),  # on the schedule
        (3, 2, 5, True, False),  # off it
        (5, 2, 5, True, True),  # the last step always, by default
        (5, 2, 5, False, False),  # ... unless at_end is off
        (5, 0, 5, True, True),  # n=0: never on a schedule, still at the end
        (4, 0, 5, True, False),
        (5, 0, 5, False, False),  # n=0 and no end: never
        (4, None, 5, True, False),
        (0, 3, 5, True, True),  # step 0 is on every schedule (the starting evaluation)
        (3, 3, None, True, True),  # unknown total: the schedule alone
    ],
)
def test_every(step, n, total, at_end, expected):
    assert every(step, n, total, at_end=at_end) is expected


def test_count_steps_rounds_the_last_partial_batch_up_and_caps_at_max_steps():
    assert count_steps(10, 4, 3, None) == (3, 9)
    assert count_steps(8, 4, 3, None) == (2, 6)
    assert count_steps(10, 4, 3, 5) == (3, 5)
    assert count_steps(10, 4, 3, 50) == (3, 9)
    assert epoch_total_steps(10, FOUR_A_STEP) == 9
    assert epoch_total_steps(10, FOUR_A_STEP.model_copy(update={"max_steps": 4})) == 4


def test_epoch_step_position_and_progress():
    mid = EpochStep(epoch=1, batch=0, ids=[0], steps_per_epoch=3)
    last = EpochStep(epoch=1, batch=2, ids=[0], steps_per_epoch=3)
    assert mid.next_position == {"epoch": 1, "batch": 1}
    assert last.next_position == {"epoch": 2, "batch": 0}
    assert mid.epoch_progress == pytest.approx(1 + 1 / 3)
    assert last.epoch_progress == pytest.approx(2.0)


# ------------------------------------------------------------------------ the step cursor


def _walk(loop: TrainingRun, position: dict[str, int] | None) -> list[tuple[int, int, list]]:
    seen = []
    for pos in loop.epoch_steps(10, FOUR_A_STEP, seed=7, position=position):
        seen.append((pos.epoch, pos.batch, pos.ids))
        loop.advance(len(pos.ids))
    return seen


def test_epoch_steps_cover_every_example_each_epoch_and_stop_at_total(tmp_path):
    loop = TrainingRun(RunDir(tmp_path / "a"), CheckpointSection(), total_steps=9)
    seen = _walk(loop, None)
    assert [(e, b) for e, b, _ in seen] == [(e, b) for e in range(3) for b in range(3)]
    for epoch in range(3):
        ids = [i for e, _, chunk in seen if e == epoch for i in chunk]
        assert sorted(ids) == list(range(10))
    assert seen[0][2] != seen[3][2]  # each epoch has its own order
    assert loop.step == 9 and loop.tokens_seen == 30 and loop.done

    capped = TrainingRun(RunDir(tmp_path / "b"), CheckpointSection(), total_steps=4)
    assert _walk(capped, None) == seen[:4]  # max_steps mid-epoch


def test_epoch_steps_from_a_checkpoint_position_continue_where_the_run_left(tmp_path):
    straight = TrainingRun(RunDir(tmp_path / "a"), CheckpointSection(), total_steps=9)
    full = _walk(straight, None)
    resumed = TrainingRun(RunDir(tmp_path / "b"), CheckpointSection(), total_steps=9)
    resumed.step = 4  # what resume() restores
    # after step 4 (epoch 1, batch 0) a checkpoint resumes at epoch 1, batch 1
    position = EpochStep(epoch=1, batch=0, ids=[], steps_per_epoch=3).next_position
    assert _walk(resumed, position) == full[4:]


# ------------------------------------------------------------------ checkpoints and resume


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _optim(model: torch.nn.Module):
    return build_optimizer(model.parameters(), OptimSection(learning_rate=0.1), total_steps=10)


def test_resume_restores_cursor_weights_and_truncates_later_rows(tmp_path):
    run = RunDir(tmp_path)
    loop = TrainingRun(run, CheckpointSection(), total_steps=5)
    model = _tiny_model()
    optimizer, scheduler = _optim(model)
    for _ in range(5):
        loop.advance(7)
        loop.log("train", {"loss": float(loop.step)})
        run.log_samples(loop.step, [{"completion": str(loop.step)}])
        if loop.step == 3:
            loop.save_checkpoint(
                model, optimizer, scheduler, {"epoch": 0, "batch": 3}, {"tokens_seen": 21}
            )
            saved = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.weight.add_(1.0)

    fresh = _tiny_model()
    with torch.no_grad():
        fresh.weight.mul_(-5)
    optimizer2, scheduler2 = _optim(fresh)
    again = TrainingRun(RunDir(tmp_path), CheckpointSection(), total_steps=5)
    state = again.resume(fresh, optimizer2, scheduler2)
    assert again.step == 3 and again.tokens_seen == 21 and not again.done
    assert state["data_position"] == {"epoch": 0, "batch": 3}
    assert torch.equal(fresh.weight, saved["weight"])
    assert [r["step"] for r in read_jsonl(run.metrics_path)] == [1, 2, 3]
    assert [r["step"] for r in read_jsonl(run.samples_path)] == [1, 2, 3]


def test_resume_without_a_checkpoint_is_a_config_error(tmp_path):
    loop = TrainingRun(RunDir(tmp_path), CheckpointSection(), total_steps=5)
    model = _tiny_model()
    with pytest.raises(ConfigError, match="no checkpoint"):
        loop.resume(model, *_optim(model))


class _RecordingTracker:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []
        self.finished: list[int] = []

    @property
    def url(self) -> str | None:
        return "https://example.invalid/run"

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.logged.append((step, metrics))

    def finish(self, exit_code: int = 0) -> None:
        self.finished.append(exit_code)


def _saves(loop: TrainingRun, stop_at: int | None = None) -> list[int]:
    saved: list[int] = []
    while not loop.done:
        loop.advance()
        loop.checkpoint_or_stop(lambda: saved.append(loop.step), stopping=loop.step == stop_at)
    return saved


def test_checkpoint_every_n_steps_and_at_the_last_step(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.FAULT_ENV, raising=False)
    every_two = TrainingRun(RunDir(tmp_path / "a"), CheckpointSection(save_every=2), 5)
    assert _saves(every_two) == [2, 4, 5]
    only_end = TrainingRun(RunDir(tmp_path / "b"), CheckpointSection(), 3)
    assert _saves(only_end) == [3]


def test_stop_checkpoints_then_raises_and_closes_the_tracker(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.FAULT_ENV, raising=False)
    tracker = _RecordingTracker()
    loop = TrainingRun(RunDir(tmp_path), CheckpointSection(save_every=10), 5, tracker=tracker)
    loop.borrowed_tracker = False
    saved: list[int] = []
    with pytest.raises(StopRequested):
        while True:
            loop.advance()
            loop.checkpoint_or_stop(lambda: saved.append(loop.step), stopping=loop.step == 2)
    assert saved == [2] and tracker.finished == [harness.EXIT_STOPPED]


def test_log_mirrors_rows_to_the_tracker(tmp_path):
    tracker = _RecordingTracker()
    loop = TrainingRun(RunDir(tmp_path), CheckpointSection(), 2, tracker=tracker)
    loop.advance()
    loop.log("eval", {"eval/loss": 1.5})
    assert tracker.logged == [(1, {"eval/loss": 1.5})]
    (row,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert row["step"] == 1 and row["phase"] == "eval" and row["eval/loss"] == 1.5


def test_a_borrowed_tracker_is_not_finished_and_the_run_not_marked_done(tmp_path):
    tracker = _RecordingTracker()
    loop = TrainingRun(RunDir(tmp_path), CheckpointSection(), 2, tracker=tracker)
    loop.finish()
    assert tracker.finished == [] and not (tmp_path / "progress.json").exists()


# ----------------------------------------------------------- a fake family via the harness


class FakeConfig(StrictModel):
    steps: int = 3
    eval_every: int = 2
    logging: LoggingSection = LoggingSection()
    checkpoint: CheckpointSection = CheckpointSection(save_final_model=False)


def fake_train(cfg: FakeConfig, run: RunDir, resume: bool) -> SummaryFile:
    """The smallest loop on the skeleton: one parameter, a quadratic loss."""
    run.update_phase("tokenizing")
    loop = TrainingRun(run, cfg.checkpoint, cfg.steps)
    run.update_phase("loading_model", cfg.steps)
    model = _tiny_model()
    optimizer, scheduler = _optim(model)
    if resume:
        loop.resume(model, optimizer, scheduler)
    loop.start_tracker(cfg.logging, cfg.model_dump(mode="json"), "fake")
    best = BestMetric("eval/loss", higher=False)
    while not loop.done:
        loss = model(torch.ones(1, 3)).pow(2).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loop.advance(3)
        loop.last_train = {"loss": float(loss.detach())}
        loop.log("train", loop.last_train)
        if loop.every(cfg.eval_every):
            loop.progress("evaluating")
            loop.last_eval = {"eval/loss": float(loss.detach()) / 2}
            loop.log("eval", loop.last_eval)
            best.update(loop.last_eval)
        loop.progress("training", epoch=0)
        loop.checkpoint_or_stop(
            lambda: loop.save_checkpoint(model, optimizer, scheduler, {"epoch": 0, "batch": 0}),
            stopping=False,
        )
    loop.save_final_model(model, None)
    loop.finish()
    return loop.summary("fake", best, torch.device("cpu"), data={"n": 3})


def _run_fake(tmp_path: Path, monkeypatch, run_dir: Path, resume: bool = False) -> list[dict]:
    """Run the fake family; returns every progress.json it wrote, in order."""
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv(harness.FAULT_ENV, raising=False)
    config = tmp_path / "fake.yaml"
    config.write_text("steps: 3\n")
    writes: list[dict] = []

    class RecordingRunDir(RunDir):
        """The run folder, keeping every progress.json as written."""

        def write_progress(self, *args, **kwargs) -> None:
            super().write_progress(*args, **kwargs)
            writes.append(json.loads((self.path / "progress.json").read_text()))

    argv = ["--config", str(config), "--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    code = run_trainer(
        argv,
        description="fake",
        config_model=FakeConfig,
        preflight=lambda cfg: None,
        train=fake_train,
        planned_steps=lambda cfg: cfg.steps,
        run_folder=RecordingRunDir,
    )
    assert code == 0
    return writes


def test_progress_phases_in_order_with_total_steps_from_the_first_write(tmp_path, monkeypatch):
    writes = _run_fake(tmp_path, monkeypatch, tmp_path / "run")
    phases = [w["phase"] for w in writes]
    assert phases == [
        "loading_model",  # the harness, before anything loads
        "tokenizing",
        "loading_model",
        "training",
        "evaluating",
        "training",
        "evaluating",  # the last step always evaluates
        "training",
        "done",
    ]
    assert all(w["total_steps"] == 3 for w in writes)
    assert [w["step"] for w in writes] == [0, 0, 0, 1, 2, 2, 3, 3, 3]
    for w in writes:
        assert ProgressFile.model_validate(w).phase == w["phase"]
    assert writes[-1]["tokens_seen"] == 9


def test_summary_is_typed_and_validates(tmp_path, monkeypatch):
    _run_fake(tmp_path, monkeypatch, tmp_path / "run")
    summary, warning = read_file(tmp_path / "run" / "summary.json", SummaryFile)
    assert warning is None and summary is not None
    assert summary.outcome == "succeeded" and summary.algorithm == "fake"
    assert summary.steps == summary.total_steps == 3 and summary.tokens_seen == 9
    assert summary.final_metrics["loss"] >= 0 and "eval/loss" in summary.final_eval
    assert summary.best_metrics["eval/loss"] == min(
        r["eval/loss"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "eval/loss" in r
    )
    assert summary.model_extra["data"] == {"n": 3}  # family extras ride along
    assert summary.wall_time_s is not None and summary.wall_time_s >= 0
    assert [p.name for p in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["step-0000003"]


def test_a_resumed_run_keeps_its_step_until_its_loop_reports(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    run.write_progress(4, 10, phase="training", epoch=1, data={"index": 3})
    write_first_progress(run, resume=True, planned_steps=None)
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 4 and progress["total_steps"] == 10
    assert progress["phase"] == "loading_model" and progress["data"] == {"index": 3}
    write_first_progress(run, resume=False, planned_steps=7)
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert (progress["step"], progress["total_steps"], progress["phase"]) == (0, 7, "loading_model")


def test_the_writers_refuse_what_the_schemas_refuse(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(ValidationError):
        run.write_progress(1, 2, phase="warming_up")
    with pytest.raises(ValidationError):
        run.write_summary("exploded")
    with pytest.raises(ValidationError):
        run.log_metrics("one", "train", {"loss": 1.0})  # type: ignore[arg-type]
    assert not (tmp_path / "progress.json").exists() and not (tmp_path / "summary.json").exists()


def test_write_summary_file_keeps_nan_readable(tmp_path):
    run = RunDir(tmp_path)
    run.write_summary_file(
        SummaryFile(outcome="succeeded", steps=1, final_metrics={"loss": math.nan}, kind="orm")
    )
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["final_metrics"] == {"loss": "nan"} and data["kind"] == "orm"
    assert data["outcome"] == "succeeded" and "traceback" not in data  # only what was set


# --------------------------------------------------------------------------------- helpers


def test_best_metric_directions_and_nan():
    higher = BestMetric("eval/accuracy")
    for value in (0.5, math.nan, 0.7, 0.6):
        higher.update({"eval/accuracy": value})
    assert higher.as_dict() == {"eval/accuracy": 0.7}
    lower = BestMetric("eval/loss", higher=False)
    lower.update({"other": 1.0})
    assert lower.value is None
    for value in (2.0, 1.0, 1.5):
        lower.update({"eval/loss": value})
    assert lower.value == 1.0


def test_step_metrics_order_and_throughput():
    timer = StepTimer()
    timer.start -= 2.0  # a step that took two seconds
    row = step_metrics(
        {"loss": 1.0}, 2.0, 0.1, 100, timer, torch.device("cpu"), epoch=0.5, num_tokens=7
    )
    assert list(row) == [
        "loss",
        "grad_norm",
        "learning_rate",
        "epoch",
        "num_tokens",
        "throughput/tokens_per_s",
        "timing/step_s",
        "memory/peak_gb",
    ]
    assert row["timing/step_s"] == pytest.approx(2.0, abs=0.5)
    assert row["throughput/tokens_per_s"] == pytest.approx(100 / row["timing/step_s"])
    assert row["memory/peak_gb"] > 0
    assert "epoch" not in step_metrics({}, 0.0, 0.1, 1, StepTimer(), torch.device("cpu"))


def test_round_robin_walks_the_held_out_set_event_by_event(tmp_path):
    assert round_robin(5, 2, 0) == [0, 1]
    assert round_robin(5, 2, 1) == [2, 3]
    assert round_robin(5, 2, 2) == [4, 0]  # wraps around
    assert round_robin(5, 0, 3) == [] and round_robin(0, 0, 1) == []
    loop = TrainingRun(RunDir(tmp_path), CheckpointSection(), 10)
    loop.step = 7
    assert loop.event(3) == 2 and loop.event(0) == 7


def test_print_step_writes_the_train_log_line(tmp_path, capsys):
    loop = TrainingRun(RunDir(tmp_path / "p"), CheckpointSection(), total_steps=8)
    loop.step = 3
    row = {"loss": 0.69314, "accuracy": 0.625, "timing/step_s": 0.1234}
    loop.print_step(row, "accuracy")
    loop.print_step({"timing/step_s": 2.0})  # no loss logged: nan, never a KeyError
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step 3/8 loss 0.6931 acc 0.625 (0.12s)", "step 3/8 loss nan (2.00s)"]
