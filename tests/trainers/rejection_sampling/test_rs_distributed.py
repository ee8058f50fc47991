"""Rejection sampling under torchrun on CPU (gloo, 2 processes, started for real): the run
completes; each rank generated and scored its part of the pool, with its own seed (recorded);
rank 0 alone wrote the run folder; what is deterministic equals one process: the starting
policy's greedy held-out evaluation, and the verifier's scores and the selection of the pool
(recomputed here from the selection file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import trainer_argv

from tests._helpers.paths import FIXTURES, ROOT, configs_of
from trainers.core.rundir import read_jsonl
from trainers.core.tiny import ensure_preset
from trainers.rejection_sampling import train as rs_train

DRIVER = ROOT / "tests" / "trainers" / "core" / "dist_driver.py"
CONFIG = configs_of("rejection_sampling") / "top_k_overall.yaml"
FIXTURE = FIXTURES / "gsm8k.jsonl"


def overrides(per_rank_batch: int) -> list[str]:
    return [
        "model.name=tiny",
        "model.dtype=fp32",
        "model.device=cpu",
        f"data.dataset={FIXTURE}",
        "data.max_train_samples=null",
        "data.max_test_samples=2",
        "generation.num_completions_per_prompt=2",
        "generation.max_new_tokens=8",
        "generation.rollout_batch_size=6",
        "top_k=4",
        "sft.learning_rate=1.0e-4",
        f"sft.batch_size={per_rank_batch}",
        "sft.gradient_accumulation_steps=1",
        "sft.num_epochs=1",
        "sft.max_seq_length=160",
        "eval.eval_max_new_tokens=8",
        "eval.num_samples=1",
        "eval.baseline=true",
        "use_cache=false",
        "checkpoint.save_final_model=false",
    ]


# two-process runs under torchrun in the module fixtures: a long file (scheduled early)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    where = tmp_path_factory.mktemp("rs-ranks")
    ensure_preset("tiny")  # built once here, not by two ranks at the same time
    two, one = where / "two", where / "one"
    spec = where / "spec.json"
    spec.write_text(
        json.dumps(
            [
                {
                    "module": "trainers.rejection_sampling.train",
                    "argv": trainer_argv(CONFIG, two, overrides(1)),
                }
            ],
            default=str,
        )
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "PYTHONPATH": str(ROOT),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        str(DRIVER),
        str(spec),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    torch.set_num_threads(1)
    assert rs_train.main(trainer_argv(CONFIG, one, overrides(2))) == 0
    return {"two": two, "one": one, "output": out.stdout + out.stderr, "code": out.returncode}


def test_two_ranks_complete_and_rank_zero_alone_writes(runs):
    assert runs["code"] == 0, runs["output"][-4000:]
    summary = json.loads((runs["two"] / "summary.json").read_text())
    assert summary["outcome"] == "succeeded"
    assert summary["distributed"]["world_size"] == 2
    assert summary["distributed"]["sampling_seeds"] == [42, 43]
    rollout = [r for r in read_jsonl(runs["two"] / "metrics.jsonl") if r["phase"] == "rollout"]
    assert len(rollout) == 1  # written once: rank 1 wrote nothing
    one = json.loads((runs["one"] / "summary.json").read_text())
    assert rollout[0]["pool/size"] == one["rollout_metrics"]["pool/size"]  # every prompt, x N
    train_rows = [r for r in read_jsonl(runs["two"] / "metrics.jsonl") if r["phase"] == "train"]
    assert [r["step"] for r in train_rows] == [
        r["step"] for r in read_jsonl(runs["one"] / "metrics.jsonl") if r["phase"] == "train"
    ]
    assert any(line.startswith("[rank 1] ") for line in runs["output"].splitlines())


def test_what_is_deterministic_equals_one_process(runs):
    two = json.loads((runs["two"] / "summary.json").read_text())
    one = json.loads((runs["one"] / "summary.json").read_text())
    # the starting policy's greedy held-out evaluation, split over the ranks and gathered
    for key, value in one["baseline_eval"].items():
        if not key.startswith("timing/"):
            assert two["baseline_eval"][key] == pytest.approx(value), key
    # the pool the ranks built and scored in parts: each selected completion carries its own
    # prompt's verifier score (parts gathered back in prompt order)
    from trainers.core.config import load_config
    from trainers.rejection_sampling.config import RejectionSamplingConfig
    from trainers.rejection_sampling.pipeline import load_prompts, verify

    cfg = load_config(CONFIG, RejectionSamplingConfig, overrides(1))
    prompts, _ = load_prompts(cfg)
    lines = (runs["two"] / "selection.jsonl").read_text().splitlines()
    picks = [json.loads(line) for line in lines]
    assert len(picks) == 4
    for pick in picks:
        prompt = prompts[pick["prompt_index"]]
        assert pick["messages"][-2]["content"] == prompt.question
        score, correct, _ = verify(prompt, pick["messages"][-1]["content"])
        assert (pick["score"], pick["correct"]) == (score, correct)
