"""The evaluation job end to end on the ``tiny`` presets: run folder, eval.json, bad input,
SIGTERM. The SFT warm start is the session's cached one (trainers.sft.train.warm_start_model,
which the SFT learning test builds too)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import trainer_argv

from trainers.core.rundir import read_jsonl
from trainers.core.runfolder import EvalFile, read_file
from trainers.evaluation import run as eval_run

CONFIGS = Path(eval_run.__file__).resolve().parent / "configs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXIT_CONFIG_ERROR, EXIT_STOPPED = 2, 143


def evaluate(run_dir: Path, suite: str, overrides: list[str]) -> int:
    return eval_run.main(trainer_argv(CONFIGS / f"{suite}.yaml", run_dir, overrides))


def read_eval(run_dir: Path) -> EvalFile:
    ev, warning = read_file(run_dir / "eval.json", EvalFile)
    assert ev is not None, warning
    return ev


def assert_intervals(metrics: dict, n: int) -> None:
    for name, m in metrics.items():
        assert m.n == n, (name, m)
        assert m.low is not None and m.high is not None, (name, m)
        assert m.low <= m.value <= m.high, (name, m)


SMALL = ["sampling.batch_size=16", "bootstrap.resamples=200", "device=cpu"]


@pytest.fixture(scope="module")
def warm_start() -> Path:
    from trainers.sft.train import warm_start_model

    return warm_start_model()  # the run folder is its parent


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> Path:
    """A reward-model checkpoint (an untrained preference head on tiny): a valid judge."""
    import torch

    from trainers.core.models import load_tokenizer
    from trainers.core.reward_model import build_reward_model, save_reward_model

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("judge") / "final_model"
    model = build_reward_model("tiny", "preference", device="cpu", trainable=False)
    save_reward_model(model, load_tokenizer("tiny"), folder)
    return folder


# ---------------------------------------------------------------------------------------------
# reasoning on the warm start, with the tiny preset it started from as the baseline
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # builds the SFT warm start when no earlier test of the session has
def test_reasoning_on_the_warm_start_holds_intervals_and_beats_its_start(
    tmp_path, capsys, warm_start
):
    from trainers.evaluation.prompts import training_questions
    from trainers.evaluation.targets import resolve_ref

    run_dir = tmp_path / "eval"
    code = evaluate(
        run_dir,
        "reasoning",
        [
            f"target={warm_start.parent}",
            "baseline=auto",
            "prompts.size=24",
            "sampling.n=4",
            "sampling.max_new_tokens=64",
            "reasoning.pass_k=[1,4]",
            *SMALL,
        ],
    )
    assert code == 0
    ev = read_eval(run_dir)
    assert ev.suite == "reasoning" and ev.headline == "accuracy"
    assert ev.target_run == str(warm_start.parent) and ev.target_model == str(warm_start)
    assert ev.baseline == "auto (tiny)" and ev.baseline_model == "tiny"
    assert ev.settings["seed"] == 0 and ev.settings["sampling"]["n"] == 4
    assert {"accuracy", "format_rate", "pass@4", "never_ending"} <= set(ev.metrics)
    assert_intervals(ev.metrics, 24)
    assert_intervals(ev.baseline_metrics, 24)
    assert_intervals(ev.difference, 24)
    m = ev.metrics
    assert m["format_rate"].value > 0.8  # the warm start answers in the tag format
    assert m["pass@4"].value >= m["accuracy"].value
    assert ev.baseline_metrics["accuracy"].value == 0.0  # random init
    assert ev.difference["accuracy"].low > 0  # the warm start is better, beyond the noise
    assert set(ev.cache_keys) == {"target", "baseline"}

    # held-out: none of the questions is one the warm start was trained on
    prompts = ev.details["prompts"]
    assert prompts["training_questions_checked"] and prompts["n_prompts"] == 24
    seen = training_questions(resolve_ref(str(warm_start.parent), "target"))
    asked = {row["prompt"] for row in read_jsonl(run_dir / "samples.jsonl")}
    assert asked and not asked & seen

    items = read_jsonl(run_dir / "items.jsonl")
    assert len(items) == 24 and all(0 <= r["target"]["correct"] <= 4 for r in items)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "succeeded"
    assert summary["final_eval"]["eval/accuracy"] == m["accuracy"].value
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["phase"] == "done" and progress["step"] == progress["total_steps"]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["phase"] for r in rows] == ["eval"] and "eval/diff/accuracy" in rows[0]
    out = capsys.readouterr().out  # train.log of a launched job
    assert f"eval reasoning target: accuracy {m['accuracy'].value:.4g} [" in out
    assert "generating: baseline" in out


def test_winrate_of_a_model_against_itself_is_one_half(tmp_path, judge_dir):
    run_dir = tmp_path / "eval"
    code = evaluate(
        run_dir,
        "winrate",
        [
            "target=tiny",
            "baseline=tiny",
            f"judge={judge_dir}",
            "prompts.size=12",
            "sampling.max_new_tokens=24",
            *SMALL,
        ],
    )
    assert code == 0
    ev = read_eval(run_dir)
    win_rate = ev.metrics["win_rate"]
    assert win_rate.value == pytest.approx(0.5) and win_rate.low <= 0.5 <= win_rate.high
    assert ev.metrics["tie"].value == 1.0  # same model, same seed: the same samples
    assert ev.metrics["win_rate_length_controlled"].value == pytest.approx(0.5)
    assert ev.difference["judge_score"].value == pytest.approx(0.0, abs=1e-5)
    assert ev.details["length_unit"] == "characters" and ev.judge == str(judge_dir)
    assert ev.details["prompts"]["source"] == "reasoning_gym"


def test_generation_health_and_kl_to_the_baseline(tmp_path):
    """tiny against itself: KL exactly 0 and every health difference 0; against tiny-llama
    (same tokenizer recipe, other weights): a positive KL."""
    common = ["prompts.size=8", "sampling.n=2", "sampling.max_new_tokens=16", *SMALL]
    assert evaluate(tmp_path / "self", "generation", ["target=tiny", "baseline=tiny", *common]) == 0
    ev = read_eval(tmp_path / "self")
    assert ev.metrics["kl_to_baseline"].value == pytest.approx(0.0, abs=1e-4)
    assert all(d.value == pytest.approx(0.0, abs=1e-9) for d in ev.difference.values())
    assert {"mean_length", "never_ending", "repetition_4", "distinct_1", "distinct_2"} <= set(
        ev.metrics
    )
    assert ev.details["kl"]["unbiased"]  # temperature 1, no filters
    distinct = ev.metrics["distinct_2"]
    assert 0 < distinct.value <= 1 and distinct.low is None  # a corpus ratio: no interval

    other = ["target=tiny", "baseline=tiny-llama", *common]
    assert evaluate(tmp_path / "other", "generation", other) == 0
    ev = read_eval(tmp_path / "other")
    kl = ev.metrics["kl_to_baseline"]
    assert kl.value > 0 and kl.low > 0, kl
    assert_intervals({k: ev.metrics[k] for k in ("kl_to_baseline", "mean_length")}, 8)


def test_math_suite_on_a_gsm8k_schema_file_and_the_builtin_set(tmp_path):
    fixture = FIXTURES / "gsm8k_sample.jsonl"
    common = ["target=tiny", "sampling.max_new_tokens=8", *SMALL]
    assert evaluate(tmp_path / "file", "math", [f"math.dataset={fixture}", *common]) == 0
    ev = read_eval(tmp_path / "file")
    assert ev.details["prompts"]["n_prompts"] == 4 and ev.metrics["accuracy"].n == 4
    assert ev.details["prompts"]["checker"] == "math-verify"
    assert evaluate(tmp_path / "builtin", "math", ["prompts.size=6", *common]) == 0
    assert read_eval(tmp_path / "builtin").metrics["accuracy"].n == 6


def test_pair_accuracy_is_the_run_s_own_held_out_accuracy(tmp_path):
    """The suite recomputes a direct-alignment run's held-out pair accuracy pair by pair with
    the run's own loss: it equals the trainer's last eval/accuracy."""
    from trainers.direct_alignment import train as da_train

    da_dir = tmp_path / "simpo"
    da_overrides = [
        "loss=simpo",
        "model.name=tiny",
        "model.device=cpu",
        "model.gradient_checkpointing=false",
        "checkpoint.save_final_model=true",
        "data.dataset=builtin:reasoning-preferences",
        "data.max_samples=40",
        "data.eval_size=12",
        "data.max_length=128",
        "train.batch_size=4",
        "train.max_steps=2",
        "train.learning_rate=1.0e-3",
        "eval.eval_every=2",
        "eval.sample_every=0",
        "eval.num_samples=0",
    ]
    da_config = Path(da_train.__file__).parent / "configs" / "dpo.yaml"
    assert da_train.main(trainer_argv(da_config, da_dir, da_overrides)) == 0
    trained = json.loads((da_dir / "summary.json").read_text())["final_eval"]["eval/accuracy"]

    assert evaluate(tmp_path / "eval", "pair_accuracy", [f"target={da_dir}", *SMALL]) == 0
    ev = read_eval(tmp_path / "eval")
    assert ev.metrics["pair_accuracy"].value == pytest.approx(trained, abs=1e-6)
    assert ev.metrics["pair_accuracy"].n == 12
    assert ev.details["loss"] == "simpo"
    assert "pair_accuracy" in ev.baseline_metrics  # reference-free: the start is scored too


# ---------------------------------------------------------------------------------------------
# Bad input: one message, exit 2, nothing written
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_tokenizer_model(tmp_path_factory) -> Path:
    """tiny's weights with a tokenizer that has one more token."""
    from trainers.core.models import load_tokenizer
    from trainers.core.tiny import ensure_preset

    folder = tmp_path_factory.mktemp("other-tok") / "model"
    shutil.copytree(ensure_preset("tiny"), folder)
    tok = load_tokenizer("tiny")
    tok.add_tokens(["<not-in-tiny>"])
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def unfinished_run(tmp_path_factory) -> Path:
    """A run folder whose trainer never wrote final_model/."""
    folder = tmp_path_factory.mktemp("unfinished") / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text("model:\n  name: tiny\n")
    return folder


def test_bad_input_fails_before_writing(
    tmp_path, capsys, judge_dir, other_tokenizer_model, unfinished_run
):
    cases = [
        ("reasoning", ["suite=leaderboard", "target=tiny"], "suite"),
        ("reasoning", ["prompts.size=4"], "target: name the model"),
        ("reasoning", [f"target={unfinished_run}"], "no final model"),
        ("reasoning", ["target=/no/such/model"], "No such file or folder"),
        ("reasoning", ["target=tiny", "prompts.tasks=[no_such_task]"], "no_such_task"),
        ("reasoning", ["target=tiny", "baseline=auto", "prompts.tasks=[chain_sum]"], "auto"),
        ("winrate", ["target=tiny", "baseline=tiny", "judge=tiny"], "not a reward model"),
        ("winrate", ["target=tiny", "baseline=tiny"], "judge"),
        ("winrate", ["target=tiny", "baseline=tiny", f"judge={other_tokenizer_model}"], "reward"),
        ("winrate", [f"target={judge_dir}", "baseline=tiny", f"judge={judge_dir}"], "policy"),
        (
            "generation",
            ["target=tiny", f"baseline={other_tokenizer_model}"],
            "does not share the target's tokenizer",
        ),
        ("pair_accuracy", ["target=tiny"], "direct-alignment"),
        ("math", ["target=tiny", "math.dataset=/no/such.jsonl"], "file not found"),
        ("reasoning", ["target=tiny", "sampling.n=2", "reasoning.pass_k=[4]"], "pass_k"),
    ]
    for i, (suite, overrides, message) in enumerate(cases):
        run_dir = tmp_path / f"run{i}"
        assert evaluate(run_dir, suite, overrides) == EXIT_CONFIG_ERROR, overrides
        err = capsys.readouterr().err
        assert message in err, (overrides, err)
        assert err.count("error:") == 1
        assert not run_dir.exists(), overrides


def test_sigterm_stops_the_job_with_nothing_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_SIGTERM_AT", "token:3")
    run_dir = tmp_path / "eval"
    code = evaluate(
        run_dir,
        "reasoning",
        ["target=tiny", "prompts.tasks=[chain_sum]", "prompts.size=4", *SMALL],
    )
    assert code == EXIT_STOPPED
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "stopped" and "evaluation" in summary["detail"]
    assert not (run_dir / "eval.json").exists()
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["phase"] == "generating"
