"""Policy gradients under torchrun on CPU (gloo, 2 processes, started for real): on FIXED
rollouts one update on 2 ranks equals one process with the same global batch (GRPO with a KL
term and two passes, PPO with its value model, DAPO's token-mean aggregation, REINFORCE++'s
batch-wide whitening); DAPO's refill is decided by every rank together; sampling on a sharded
model with ranks decoding different lengths does not hang. One torchrun start serves every
check (``dist_driver.py`` calling ``pg_dist_driver.py``); the one-process side runs the same
functions in this process.
"""

from __future__ import annotations

import json

import pytest
import torch
from pg_dist_driver import FIXED, KEPT_PATTERN, dapo_refill, fixed_update
from test_distributed import torchrun

from trainers.core.tiny import ensure_preset

ALGORITHMS = list(FIXED)
PPO_STEPS = ["train.max_steps=3", "loss.beta=0.0"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    """One torchrun start for every check: the fixed-rollout updates, DAPO, generation, and
    the whole runs of the slow tests below (a start costs more than most checks here)."""
    where = tmp_path_factory.mktemp("pg-two-ranks")
    ensure_preset("tiny")  # built once here, not by two ranks at the same time
    specs = [
        {"call": "pg_dist_driver:fixed_update", "args": [a, str(where / f"{a}.pt")]}
        for a in ALGORITHMS
    ]
    specs.append({"call": "pg_dist_driver:dapo_refill", "args": [str(where / "dapo.json")]})
    specs.append({"call": "pg_dist_driver:dapo_refill", "args": [str(where / "dapo1.json"), 1]})
    specs.append({"call": "pg_dist_driver:unequal_generation", "args": [str(where / "gen.json")]})
    runs = {k: where / k for k in ("grpo", "ppo", "ppo_stopped")}
    call = "pg_dist_driver:pg_run"
    specs += [
        {"call": call, "args": ["grpo", str(runs["grpo"])]},
        {"call": call, "args": ["ppo", str(runs["ppo"]), 2, PPO_STEPS]},
        # a stop at the 2nd step's first micro-batch: both ranks finish the step, checkpoint it
        # (policy and value shards), end `stopped`; then the same run resumed
        {
            "call": call,
            "args": ["ppo", str(runs["ppo_stopped"]), 2, PPO_STEPS],
            "env": {"RLHF_LAB_SIGTERM_AT": "micro_batch:3"},
        },
        {"call": call, "args": ["ppo", str(runs["ppo_stopped"]), 2, PPO_STEPS, True]},
    ]
    codes, output = torchrun(specs, where, timeout=900)
    return {"where": where, "codes": codes, "output": output, "runs": runs}


@pytest.fixture(scope="module")
def one_process() -> dict:
    torch.set_num_threads(1)
    return {a: fixed_update(a) for a in ALGORITHMS}


def test_the_two_rank_checks_complete(two_ranks):
    checks = [0] * (len(ALGORITHMS) + 3)
    assert two_ranks["codes"] == [*checks, 0, 0, 143, 0], two_ranks["output"][-4000:]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_one_update_on_fixed_rollouts_equals_one_process(two_ranks, one_process, algorithm):
    one = one_process[algorithm]
    two = torch.load(two_ranks["where"] / f"{algorithm}.pt", weights_only=False)
    assert two["optimizer_steps"] == one["optimizer_steps"]
    # the step's statistics are global: loss, gradient norm, token means, rollout-side info
    assert sorted(two["metrics"]) == sorted(one["metrics"])
    for key, value in one["metrics"].items():
        assert two["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    for key, value in one["info"].items():
        assert two["info"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # the advantages (group baselines on whole groups; REINFORCE++ whitened over both ranks)
    torch.testing.assert_close(two["advantages"], one["advantages"], rtol=1e-5, atol=1e-6)
    # the updated weights: Adam's first step is lr·sign(g) where g is ~0, so a few elements may
    # differ by up to 2·lr per step (tests/trainers/core/test_distributed.py explains)
    a, b = one["weights"], two["weights"]
    assert sorted(a) == sorted(b)
    diffs = torch.cat([(a[k].float() - b[k].float()).abs().flatten() for k in a])
    lr, steps = 1.0e-3, one["optimizer_steps"]
    assert float(diffs.max()) <= 2 * lr * steps
    assert int((diffs > 1e-5).sum()) <= diffs.numel() // 1000


def test_reinforce_pp_whitens_over_the_global_batch(two_ranks, one_process):
    """Each rank's share alone has another mean and std: its own whitening would differ."""
    from pg_dist_driver import config, fixed_experience

    from trainers.policy_gradients.advantages import reinforce_pp_advantages

    two = torch.load(two_ranks["where"] / "reinforce_pp.pt", weights_only=False)["advantages"]
    exp = fixed_experience()
    mask = exp.completion_mask
    zero = torch.zeros_like(mask)
    half = slice(0, exp.num_sequences // 2)
    assert config("reinforce_pp", 1).loss.beta > 0
    local = reinforce_pp_advantages(exp.rewards["total"][half], zero[half], mask[half])
    assert not torch.allclose(two[half], local, atol=1e-3)  # what a per-rank whitening gives
    on = mask > 0
    assert float(two[on].mean()) == pytest.approx(0.0, abs=1e-5)  # whitened over both
    assert float(two[on].std(correction=0)) == pytest.approx(1.0, rel=1e-4)
    torch.testing.assert_close(two, one_process["reinforce_pp"]["advantages"])


def test_dapo_refill_is_decided_by_every_rank_together(two_ranks):
    """Round 1 (prompts 0-3) keeps group 0 on rank 0 and group 3 on rank 1; round 2 (4-7)
    keeps 5 on rank 0 and 6 on rank 1: 4 groups after two rounds, counted over both ranks, so
    both stop there; the kept groups are dealt two to each rank in one process's order."""
    ranks = json.loads((two_ranks["where"] / "dapo.json").read_text())
    one = dapo_refill()
    assert [r["rounds"] for r in ranks] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert {r["groups_kept"] for r in ranks} == {one["groups_kept"]} == {4}
    assert {r["drawn"] for r in ranks} == {one["drawn"]} == {8}
    assert ranks[0]["kept"] + ranks[1]["kept"] == one["kept"]
    assert ranks[0]["kept"] == ["p0", "p0", "p3", "p3"]  # rank 1's group 3 moved to rank 0
    assert ranks[1]["kept"] == ["p5", "p5", "p6", "p6"]
    assert sorted(KEPT_PATTERN)[:4] == [0, 3, 5, 6]


def test_dapo_gives_up_on_every_rank_together(two_ranks):
    ranks = json.loads((two_ranks["where"] / "dapo1.json").read_text())
    assert all("kept only 2 of the 4 groups" in r["raised"] for r in ranks)


def test_sampling_on_a_sharded_model_with_unequal_lengths_does_not_hang(two_ranks):
    report = json.loads((two_ranks["where"] / "gen.json").read_text())
    assert [r["lengths"] for r in report] == [[2], [11, 11, 11]]
    assert report[0]["forwards"] == 2 and report[1]["forwards"] == 11  # prefill + steps
    assert [r["rollouts"] for r in report] == [4, 4]
    assert report[0]["loss_sum"] == report[1]["loss_sum"]


# ---------------------------------------------------------------------------------------------
# Whole runs (train() itself): GRPO learns on 2 ranks as on 1; PPO stopped and resumed on 2
# ranks (the value model's shards in the DCP checkpoint) equals an uninterrupted run
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpo_one_process(tmp_path_factory):
    from pg_dist_driver import pg_run

    run_dir = tmp_path_factory.mktemp("pg-one") / "grpo"
    torch.set_num_threads(1)
    assert pg_run("grpo", str(run_dir), 1) == 0
    return run_dir


def rollout_rows(run_dir, phase: str = "rollout") -> list[dict]:
    from trainers.core.rundir import read_jsonl

    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == phase]


@pytest.mark.slow
def test_grpo_on_two_ranks_learns_like_one_process(two_ranks, grpo_one_process):
    """The reward (the share of capital letters, which the random tiny model can learn in a
    few steps) rises on 2 ranks as on 1: same direction, similar size (the rollouts differ:
    each rank samples with its own seed)."""
    rises = {}
    for label, run_dir in (("grpo", two_ranks["runs"]["grpo"]), ("grpo_one", grpo_one_process)):
        reward = [r["avg_correctness"] for r in rollout_rows(run_dir)]
        early, late = sum(reward[:3]) / 3, sum(reward[-3:]) / 3
        rises[label] = late - early
    assert rises["grpo_one"] > 0.2, rises
    assert rises["grpo"] > 0.2, rises
    summary = json.loads((two_ranks["runs"]["grpo"] / "summary.json").read_text())
    assert summary["distributed"]["sampling_seeds"] == [42, 43]
    assert summary["distributed"]["world_size"] == 2


@pytest.mark.slow
def test_two_ranks_time_the_weight_gather_as_a_stage_of_its_own(two_ranks):
    """Generation under FSDP gathers whole weights first: its seconds are the step's
    ``weight_gather`` stage, apart from ``generate`` (trainers/core/flops.py StageClock)."""
    for row in rollout_rows(two_ranks["runs"]["ppo"], "train"):
        assert row["timing/weight_gather_s"] > 0
        parts = [v for k, v in row.items() if k.startswith("timing/") and k.endswith("_s")]
        stages = sum(parts) - row["timing/step_s"] - row["timing/train_s"]  # the stages alone
        assert stages <= row["timing/step_s"]


@pytest.mark.slow
def test_ppo_stopped_and_resumed_on_two_ranks_equals_an_uninterrupted_run(two_ranks):
    straight, stopped = two_ranks["runs"]["ppo"], two_ranks["runs"]["ppo_stopped"]
    ckpt = sorted((stopped / "checkpoints").glob("step-*"))[-1]
    assert {"rng-rank0.pt", "rng-rank1.pt", "shards", "state.pt"} <= {
        p.name for p in ckpt.iterdir()
    }
    for phase in ("rollout", "train"):
        a, b = rollout_rows(straight, phase), rollout_rows(stopped, phase)
        assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
        for ra, rb in zip(a, b, strict=True):
            for key, value in ra.items():
                if key.startswith(("timing/", "throughput/", "memory/", "mfu/")) or key == "time_s":
                    continue
                if isinstance(value, float):
                    assert rb[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (phase, key)
                else:
                    assert rb[key] == value, (phase, key)
