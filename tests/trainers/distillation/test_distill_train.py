"""On-policy distillation end to end on tiny: two steps, stop and resume, the teacher's
held-out ceiling logged beside the student's, bad input refused before anything is written
(a teacher with another tokenizer or vocabulary, an unresolved run reference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_complete_run_dir, trainer_argv
from stop_resume import assert_resume_equals_straight_run

from tests._helpers.paths import configs_of
from tests._helpers.refusals import refused_before_writing_test
from trainers.core.rundir import read_jsonl
from trainers.distillation import train as distill_train

CONFIG = configs_of("distillation") / "distill.yaml"

QUICK = [
    "model.name=tiny",
    "teacher.name=tiny",
    "model.gradient_checkpointing=false",
    "data.size=16",
    "data.eval_size=4",
    "rollout.max_new_tokens=16",
    "train.batch_size=2",
    "train.gradient_accumulation_steps=2",
    "train.learning_rate=1.0e-3",
    "eval.eval_every=2",
    "eval.num_samples=1",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]


def run(run_dir: Path, overrides: list[str], resume: bool = False) -> int:
    return distill_train.main(trainer_argv(CONFIG, run_dir, overrides, resume))


def test_two_steps_write_a_complete_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    assert run(run_dir, [*QUICK, "train.max_steps=2", "loss.divergence=jsd"]) == 0
    summary = assert_complete_run_dir(run_dir)
    assert summary["algorithm"] == "distill" and summary["steps"] == 2
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert len(train_rows) == 2
    for r in train_rows:
        assert r["loss"] >= -1e-6 and r["reverse_kl"] >= -1e-6 and r["teacher_logp"] <= 0
        assert 1 <= r["completion_length"] <= 16
    # teacher == student at the start: no divergence on the first step's samples
    assert train_rows[0]["reverse_kl"] == pytest.approx(0.0, abs=1e-4)
    evals = [r for r in rows if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    assert {"eval/avg_correctness", "eval/teacher_avg_correctness"} <= set(evals[-1])


def test_stop_then_resume_equals_straight_run(tmp_path, sigterm_at):
    """Student samples are seeded by (seed, step): 3 steps straight == 1, stop, resume, 2."""
    common = [*QUICK, "train.max_steps=3", "eval.eval_every=0"]
    keys = ("loss", "teacher_logp", "completion_length", "grad_norm")
    assert_resume_equals_straight_run(
        lambda d, resume: run(d, common, resume), tmp_path, sigterm_at, 1, keys
    )


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        (["teacher.name=tiny-llama"], "has a different tokenizer from the student"),
        (["teacher.name=run:abc123"], "resolved by the lab"),
        (["teacher.name=/no/such/model"], "teacher.name='/no/such/model'"),
        (["loss.beta=1.5"], "loss.beta"),
    ],
    lambda run_dir, overrides: run(run_dir, [*QUICK, *overrides]),
)


def test_same_tokenizer_but_another_vocabulary_size_is_refused(tmp_path, monkeypatch):
    """A teacher whose LM head has more rows than the student's (same tokenizer files)."""
    import shutil

    from trainers.core.tiny import ensure_preset

    teacher = tmp_path / "teacher"
    shutil.copytree(ensure_preset("tiny"), teacher)
    config = json.loads((teacher / "config.json").read_text())
    config["vocab_size"] = config["vocab_size"] + 64
    (teacher / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception, match="predicts over 2112 tokens"):
        distill_train.check_teacher("tiny", str(teacher))
