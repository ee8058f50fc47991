"""On-policy distillation end to end on tiny: two steps, stop and resume, the teacher's
held-out ceiling logged beside the student's, bad input refused before anything is written
(a teacher with another tokenizer or vocabulary, an unresolved run reference), and (slow) a
random-init student distilled from the SFT warm start gains held-out accuracy towards it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_complete_run_dir, trainer_argv

from trainers.core.rundir import read_jsonl
from trainers.distillation import train as distill_train

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "trainers" / "distillation" / "configs" / "distill.yaml"

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


def test_stop_then_resume_equals_straight_run(tmp_path, monkeypatch):
    """Student samples are seeded by (seed, step): 3 steps straight == 1, stop, resume, 2."""
    common = [*QUICK, "train.max_steps=3", "eval.eval_every=0"]
    assert run(tmp_path / "straight", common) == 0
    half = tmp_path / "half"

    def stop_after_one_step() -> bool:
        progress = half / "progress.json"
        return progress.exists() and json.loads(progress.read_text())["step"] >= 1

    monkeypatch.setattr(distill_train, "stop_requested", stop_after_one_step)
    assert run(half, common) == 143
    monkeypatch.undo()
    assert run(half, common, resume=True) == 0
    straight = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    resumed = read_jsonl(half / "metrics.jsonl")
    assert [(r["step"], r["phase"]) for r in straight] == [(r["step"], r["phase"]) for r in resumed]
    for a, b in zip(straight, resumed, strict=True):
        for key in ("loss", "teacher_logp", "completion_length", "grad_norm"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["teacher.name=tiny-llama"], "has a different tokenizer from the student"),
        (["teacher.name=run:abc123"], "resolved by the lab"),
        (["teacher.name=/no/such/model"], "teacher.name='/no/such/model'"),
        (["loss.beta=1.5"], "loss.beta"),
    ],
)
def test_bad_input_fails_before_writing(tmp_path, capsys, overrides, message):
    run_dir = tmp_path / "run"
    assert run(run_dir, [*QUICK, *overrides]) == 2
    assert message in capsys.readouterr().err
    assert not run_dir.exists()


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


# ---- learning ---------------------------------------------------------------------------------

WEAK_STUDENT_STEPS = 120  # SFT steps of the warm-start recipe: the format, few right answers


@pytest.fixture(scope="module")
def teacher_and_student(tmp_path_factory) -> tuple[Path, Path]:
    """The teacher is the session's SFT warm start (right on about 60 % of held-out one-digit
    sums); the student is the same recipe stopped early, so it writes the format but gets few
    answers right."""
    from trainers.sft import train as sft_train

    teacher = sft_train.warm_start_model()
    student = tmp_path_factory.mktemp("weak") / "run"
    overrides = [
        f"train.max_steps={WEAK_STUDENT_STEPS}",
        "data.max_samples=800",
        "data.eval_size=32",
        "eval.eval_every=0",
        "eval.sample_every=0",
        "checkpoint.save_final_model=true",
    ]
    argv = trainer_argv(sft_train.WARM_START_CONFIG, student, overrides)
    assert sft_train.main(argv) == 0
    return teacher, student / "final_model"


@pytest.mark.slow
def test_student_distilled_from_the_warm_start_approaches_its_accuracy(
    tmp_path, teacher_and_student
):
    teacher, student = teacher_and_student
    overrides = [
        f"model.name={student}",
        f"teacher.name={teacher}",
        "model.gradient_checkpointing=false",
        'data.specs=[{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 3, '
        '"min_digits": 1, "max_digits": 1}}]',
        "data.size=480",
        "data.eval_size=64",
        "rollout.max_new_tokens=40",
        "train.batch_size=16",
        "train.gradient_accumulation_steps=1",
        "train.learning_rate=1.0e-3",
        "eval.eval_every=30",
        "eval.num_samples=0",
        "logging.log_every=5",
        "checkpoint.save_every=null",
        "checkpoint.save_final_model=false",
    ]
    assert run(tmp_path / "run", overrides) == 0
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in rows if r["phase"] == "eval"]
    start, end = evals[0], evals[-1]
    teacher_acc = end["eval/teacher_avg_correctness"]
    print({"teacher": teacher_acc, "start": start["eval/avg_correctness"], "end": end})
    assert teacher_acc >= 0.4  # the warm start is a real teacher
    # the student closes at least half of its gap to the teacher on held-out questions
    gap_start = teacher_acc - start["eval/avg_correctness"]
    gap_end = teacher_acc - end["eval/avg_correctness"]
    assert gap_start > 0.2 and gap_end <= 0.5 * gap_start, (start, end)
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert train_rows[-1]["reverse_kl"] < train_rows[0]["reverse_kl"]
