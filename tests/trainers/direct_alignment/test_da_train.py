"""Direct-alignment trainer end to end on the tiny model: learning, every loss, resume, caches,
W&B offline, and bad input that must fail before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_complete_run_dir, trainer_argv
from stop_resume import assert_resume_equals_straight_run

from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.quick_runs import PREFERENCES_TO_LEARN
from tests._helpers.refusals import refused_before_writing_test
from trainers.core.harness import FAULT_ENV
from trainers.core.rundir import read_jsonl
from trainers.direct_alignment import train as da_train
from trainers.direct_alignment.spec import FAMILY as DA_FAMILY

CONFIGS = configs_of("direct_alignment")

QUICK = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.dataset=builtin:reasoning-preferences",
    "data.max_samples=48",
    "data.eval_size=16",
    "data.max_length=128",
    "train.batch_size=4",
    "train.gradient_accumulation_steps=2",
    "train.learning_rate=1.0e-4",
    "eval.eval_every=2",
    "eval.sample_every=2",
    "eval.num_samples=1",
    "eval.sample_max_new_tokens=8",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]


def run(loss: str, run_dir: Path, overrides: list[str], resume: bool = False) -> int:
    return da_train.main(trainer_argv(CONFIGS / f"{loss}.yaml", run_dir, overrides, resume))


@pytest.mark.slow
def test_dpo_raises_held_out_accuracy_above_chance(tmp_path):
    """The sanity check the demo runs: held-out accuracy well above chance, margins positive."""
    overrides = [
        "model.name=tiny",
        "model.gradient_checkpointing=false",
        *PREFERENCES_TO_LEARN,
        "train.gradient_accumulation_steps=1",
        "train.learning_rate=3.0e-4",
        "eval.eval_every=8",
        "eval.sample_every=0",
        "eval.num_samples=0",
        "checkpoint.save_final_model=false",
    ]
    assert run("dpo", tmp_path / "run", overrides) == 0
    summary = assert_complete_run_dir(tmp_path / "run")
    evals = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "eval"]
    assert evals[0]["step"] == 0 and evals[0]["eval/margins"] == pytest.approx(0.0, abs=1e-4)
    final = summary["final_eval"]
    assert final["eval/accuracy"] >= 0.70, final
    assert final["eval/margins"] > 0.2, final
    assert final["eval/chosen_rewards"] > final["eval/rejected_rewards"]


# online_dpo samples its pairs: its own end-to-end tests are in test_online_dpo.py
@pytest.mark.parametrize(
    "loss", [n for n in DA_FAMILY.algorithm_names if n not in ("dpo", "online_dpo")]
)
def test_every_loss_runs_and_writes_a_complete_run_dir(tmp_path, loss):
    overrides = [*QUICK, "train.max_steps=2", "checkpoint.save_final_model=true"]
    assert run(loss, tmp_path / "run", overrides) == 0
    summary = assert_complete_run_dir(tmp_path / "run")
    assert summary["steps"] == 2 and summary["algorithm"] == loss
    train_rows = [
        r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["phase"] == "train"
    ]
    assert len(train_rows) == 2
    for key in ("loss", "accuracy", "margins", "chosen_rewards", "rejected_rewards", "grad_norm"):
        assert key in train_rows[-1], (loss, key)
    assert 0 < train_rows[-1]["mfu/step"] < 1, loss  # trainers/core/flops.py
    extras = {"orpo": ["sft_loss", "or_loss", "log_odds_ratio"], "kto": ["kl"]}.get(loss, [])
    for key in extras:
        assert key in train_rows[-1], (loss, key)
    assert (tmp_path / "run" / "final_model" / "config.json").is_file()
    assert read_jsonl(tmp_path / "run" / "samples.jsonl")[0]["completion"] is not None


def test_stop_then_resume_equals_straight_run(tmp_path, sigterm_at):
    """4 steps straight == 2 steps, stop (the SIGTERM path: checkpoint + 'stopped'), resume, 2."""
    common = [*QUICK, "train.max_steps=4", "eval.sample_every=1"]
    keys = ("loss", "accuracy", "margins", "grad_norm", "learning_rate", "eval/loss")
    assert_resume_equals_straight_run(
        lambda d, resume: run("dpo", d, common, resume), tmp_path, sigterm_at, 2, keys, "completion"
    )


def test_reference_cache_is_reused_and_reference_free_losses_load_no_reference(
    tmp_path, monkeypatch
):
    from trainers.core import models as core_models

    loads = []
    real_load = core_models.load_causal_lm

    def counting_load(name, **kwargs):
        loads.append(kwargs.get("trainable"))
        return real_load(name, **kwargs)

    monkeypatch.setattr(da_train, "load_causal_lm", counting_load)  # the policy
    monkeypatch.setattr(core_models, "load_causal_lm", counting_load)  # the reference
    quick = [*QUICK, "train.max_steps=1", "data.max_samples=40"]
    assert run("dpo", tmp_path / "a", quick) == 0
    first = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert run("dpo", tmp_path / "b", quick) == 0
    second = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert second["ref_cache"] == "hit" and first["ref_cache_path"] == second["ref_cache_path"]
    assert loads.count(False) <= 1  # at most one reference load (the first run, if cold)
    loads.clear()
    assert run("simpo", tmp_path / "c", quick) == 0
    assert loads == [True]  # the policy only
    assert "ref_cache" not in json.loads((tmp_path / "c" / "summary.json").read_text())


def test_kto_on_unpaired_fixture(tmp_path):
    overrides = [
        *QUICK,
        f"data.dataset={FIXTURES / 'kto_unpaired.jsonl'}",
        "data.max_samples=null",
        "data.eval_size=2",
        "train.max_steps=2",
        "train.batch_size=2",
    ]
    assert run("kto", tmp_path / "run", overrides) == 0
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert any("kl" in r for r in rows if r["phase"] == "train")


def test_wandb_offline_run_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "rlhf-lab-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert run("dpo", tmp_path / "run", [*QUICK, "train.max_steps=1"]) == 0
    offline_runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert offline_runs, "no offline wandb run folder"
    assert list(offline_runs[0].glob("*.wandb")), "offline run holds no .wandb data file"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["wandb_url"] is None  # offline: no URL


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        (["train.learning_rat=1"], "Did you mean: learning_rate"),
        (["train.batch_size=lots"], "train.batch_size"),
        (["loss=dpx"], "'loss'"),
        (["data.dataset=/no/such/file.jsonl"], "file not found"),
    ],
    lambda run_dir, overrides: run("dpo", run_dir, [*QUICK, *overrides]),
)


def test_existing_run_dir_is_not_overwritten(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert run("dpo", run_dir, [*QUICK, "train.max_steps=1"]) == 0
    before = (run_dir / "metrics.jsonl").read_text()
    assert run("dpo", run_dir, [*QUICK, "train.max_steps=1"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_failure_inside_training_writes_failed_summary(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "1")  # the trainer's fault injection: raise at step 1's end
    assert run("dpo", tmp_path / "run", [*QUICK, "train.max_steps=1"]) == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["outcome"] == "failed" and "injected fault at step 1" in summary["error"]
