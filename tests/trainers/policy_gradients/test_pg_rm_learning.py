"""RLHF on the tiny model with built-in data: a preference reward model trained by the
reward-model trainer (seconds), then PPO and GRPO against it.

1. From the random-init preset, PPO and GRPO raise the reward model's held-out (greedy) score
   over the start: the learned reward is being optimised.
2. From the SFT warm start (``trainers.sft.train.warm_start_model()``, trained once per session
   and shared with the SFT and evaluation tests), GRPO against the same reward model on
   the warm start's one-digit chain sums — the verifier's correctness is the gold signal, not in
   the reward — raises the proxy while gold correctness falls: overoptimisation, made visible by
   the ``proxy_reward`` / ``gold_reward`` / ``kl_ref`` rows the lab's alert reads.

The reward model is trained on verifier-labelled preferences (chosen: a correct worked answer;
rejected: a wrong answer, no tags, or the answer outside the tags). A ~1M-parameter RM learns the
format signals but not arithmetic, so the policy learns to please it without getting sums right:
the "good RM → gold rises" direction is out of reach at this scale (see the PG README,
"Measured: RLHF against a learned reward model on tiny").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import trainer_argv

from tests._helpers.learning_runs import trained_model
from tests._helpers.paths import configs_of
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.rundir import read_jsonl
from trainers.policy_gradients import train as pg_train
from trainers.reward_models import train as rm_train

PG_CONFIGS = configs_of("policy_gradients")
RM_CONFIG = configs_of("reward_models") / "preference_rm.yaml"

RM_OVERRIDES = [
    "model.name=tiny",
    "data.dataset=builtin:reasoning-preferences:chain_sum",
    "data.max_samples=320",
    "data.eval_size=48",
    "data.max_length=160",
    "train.batch_size=16",
    "train.gradient_accumulation_steps=1",
    "train.learning_rate=1.0e-3",
    "train.num_epochs=1",
    "eval.eval_every=0",
    "checkpoint.save_every=null",
    "seed=11",
]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory) -> Path:
    return trained_reward_model(tmp_path_factory.mktemp("rm") / "preference_rm", RM_OVERRIDES)


def trained_reward_model(run_dir: Path, overrides: list[str]) -> Path:
    """Train the preference reward model into ``run_dir``; it must rank its held-out pairs
    above chance. Its final_model folder."""
    final_model = trained_model(rm_train.main, RM_CONFIG, run_dir, overrides)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_eval"]["eval/accuracy"] > 0.55, summary["final_eval"]
    return final_model


def rows(run_dir: Path, phase: str) -> list[dict]:
    return [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == phase]


def train_policy(config: str, run_dir: Path, overrides: list[str]) -> tuple[list, list]:
    """Train the policy-gradient ``config`` into ``run_dir``; its eval and rollout rows."""
    assert pg_train.main(trainer_argv(PG_CONFIGS / config, run_dir, overrides)) == 0
    return rows(run_dir, "eval"), rows(run_dir, "rollout")


def first_and_last(evals: list[dict], key: str) -> tuple[float, float]:
    """The held-out ``key`` at the first and at the last evaluation."""
    return evals[0][key], evals[-1][key]


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


COMMON = [
    "model.gradient_checkpointing=false",
    "rollout.max_new_tokens=24",
    "train.gradient_accumulation_steps=1",
    "train.learning_rate=1.0e-3",
    "eval.max_new_tokens=24",
    "eval.eval_batch_size=32",
    "eval.num_samples=1",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
    "seed=42",
]


@pytest.mark.slow
def test_ppo_and_grpo_raise_the_reward_models_held_out_score(tmp_path, reward_model):
    prompts = [
        "model.name=tiny",
        "data.source=preference",
        "data.dataset=builtin:chain_sum",
        "data.size=32",
        "data.eval_size=16",
        f"reward.model={reward_model}",
    ]
    report = []
    for algorithm, extra in (
        (
            "grpo",
            [
                "rollout.prompts_per_step=4",
                "rollout.num_rollouts=4",
                "train.batch_size=16",
                "train.max_steps=6",
                "eval.eval_every=6",
                "loss.beta=0.05",
            ],
        ),
        (
            "ppo",
            [
                "rollout.prompts_per_step=16",
                "rollout.num_rollouts=1",
                "train.batch_size=16",
                "train.max_steps=8",
                "eval.eval_every=8",
                "loss.beta=0.05",
                "reward.normalize=running",
            ],
        ),
    ):
        overrides = [*COMMON, *prompts, *extra]
        evals, rollouts = train_policy(f"{algorithm}.yaml", tmp_path / algorithm, overrides)
        start, end = first_and_last(evals, "eval/proxy_reward")
        sampled = (rollouts[0]["proxy_reward"], mean(r["proxy_reward"] for r in rollouts[-2:]))
        report.append(
            f"{algorithm}: held-out proxy {start:.2f} -> {end:.2f}; sampled "
            f"{sampled[0]:.2f} -> {sampled[1]:.2f}; kl_ref {rollouts[-1]['kl_ref']:.2f}"
        )
        assert end > start + 1.0, report
        assert sampled[1] > sampled[0], report
        assert all("kl_ref" in r and "gold_reward" in r for r in rollouts), report
    print("; ".join(report))


@pytest.mark.slow
def test_grpo_against_the_learned_reward_overoptimises_gold_correctness(tmp_path, reward_model):
    from trainers.sft.train import WARM_START_TASKS, warm_start_model

    task = json.dumps(WARM_START_TASKS["chain_sum"])
    overrides = [
        *COMMON,
        f"model.name={warm_start_model()}",
        f"data.specs=[{{name: chain_sum, config: {task}}}]",
        "data.size=64",
        "data.eval_size=32",
        f"reward.model={reward_model}",
        "reward.verifier_weight=0",  # the verifier is the gold signal, not in the reward
        "reward.format_weight=0",
        "rollout.prompts_per_step=8",
        "rollout.num_rollouts=8",
        "rollout.temperature=0.8",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        "train.batch_size=16",
        "train.max_steps=10",
        "eval.eval_every=10",
        "loss.beta=0.02",
    ]
    run_dir = tmp_path / "grpo"
    evals, rollouts = train_policy("grpo.yaml", run_dir, overrides)
    proxy = first_and_last(evals, "eval/proxy_reward")
    gold = first_and_last(evals, "eval/gold_reward")
    sampled_gold = (
        mean(r["gold_reward"] for r in rollouts[:3]),
        mean(r["gold_reward"] for r in rollouts[-3:]),
    )
    sampled_proxy = (
        mean(r["proxy_reward"] for r in rollouts[:3]),
        mean(r["proxy_reward"] for r in rollouts[-3:]),
    )
    report = (
        f"held-out proxy {proxy[0]:.2f} -> {proxy[1]:.2f}, gold {gold[0]:.3f} -> {gold[1]:.3f}; "
        f"sampled proxy {sampled_proxy[0]:.2f} -> {sampled_proxy[1]:.2f}, gold "
        f"{sampled_gold[0]:.3f} -> {sampled_gold[1]:.3f}; kl_ref "
        f"{rollouts[1]['kl_ref']:.1f} -> {rollouts[-1]['kl_ref']:.1f}"
    )
    from rlhf_lab.results.overoptimisation import overoptimisation

    found = overoptimisation(read_jsonl(run_dir / "metrics.jsonl"))
    print(report, "|", found.message if found else "no overoptimisation finding")
    assert evals[0]["eval/gold_reward"] == evals[0]["eval/avg_correctness"]  # gold = verifier
    # seeds 42, 1, 2 (tuning): held-out proxy +1.0 / +1.9 / +0.8, held-out gold −0.09 / −0.22 /
    # −0.19; sampled gold per step is noisy (which sums a step draws), so only its direction
    assert proxy[1] > proxy[0] + 0.5, report  # the proxy is optimised...
    assert sampled_proxy[1] > sampled_proxy[0], report
    assert gold[1] < gold[0] - 0.05, report  # ...while held-out gold correctness falls
    assert sampled_gold[1] < sampled_gold[0], report
    assert rollouts[-1]["kl_ref"] > rollouts[1]["kl_ref"], report  # away from the SFT start
    assert found is not None and found.source == "eval", report  # and the lab's alert fires


@pytest.fixture(scope="module")
def flipped_reward_model(tmp_path_factory) -> Path:
    """A deliberately poor reward model: the same verifier-labelled chain-sum pairs with chosen
    and rejected swapped, so it prefers wrong, untagged answers."""
    from trainers.core.builtin_data import builtin_preference_records

    base = tmp_path_factory.mktemp("flipped")
    pairs = base / "flipped.jsonl"
    records = builtin_preference_records(400, 5, ["chain_sum"])
    pairs.write_text(
        "".join(
            json.dumps({"prompt": r.prompt, "chosen": r.rejected, "rejected": r.chosen}) + "\n"
            for r in records
        )
    )
    return trained_reward_model(base / "preference_rm", [*RM_OVERRIDES, f"data.dataset={pairs}"])


@pytest.mark.slow
def test_a_poor_reward_model_is_overoptimised_and_the_alert_fires(
    tmp_path, reward_model, flipped_reward_model
):
    """PPO (ppo_rm: k1 in the reward, running whitening) from the SFT warm start against the
    flipped reward model, with the verifier-labelled one as the gold, pushed hard (lr 1e-3, 16
    steps): the proxy rises, the gold falls, and the lab's overoptimisation rule fires on the
    rows. (Seed 42: held-out proxy −0.16 → 2.80, gold −1.16 → −4.90, kl_ref 11.5; at lr 1e-4 /
    3e-4 the same directions, too small for the rule: +0.28 / −0.18 over 12 steps.)"""
    from rlhf_lab.results.overoptimisation import overoptimisation
    from trainers.sft.train import warm_start_model

    overrides = [
        *COMMON,
        f"model.name={warm_start_model()}",
        "data.source=preference",
        "data.dataset=builtin:chain_sum",
        "data.size=160",
        "data.eval_size=16",
        f"reward.model={flipped_reward_model}",
        f"reward.gold_model={reward_model}",
        "rollout.prompts_per_step=16",
        "rollout.num_rollouts=1",
        "train.batch_size=16",
        "rollout.max_new_tokens=48",
        "eval.max_new_tokens=48",
        "train.learning_rate=1.0e-3",
        "train.max_steps=16",
        "eval.eval_every=4",
    ]
    run_dir = tmp_path / "ppo"
    evals, rollouts = train_policy("ppo_rm.yaml", run_dir, overrides)
    all_rows = read_jsonl(run_dir / "metrics.jsonl")
    proxy = first_and_last(evals, "eval/proxy_reward")
    gold = first_and_last(evals, "eval/gold_reward")
    report = (
        f"held-out proxy {proxy[0]:.2f} -> {proxy[1]:.2f}, gold {gold[0]:.2f} -> {gold[1]:.2f}; "
        f"kl_ref {rollouts[-1]['kl_ref']:.1f}"
    )
    found = overoptimisation(all_rows)
    print(report, "|", found.message if found else "no overoptimisation finding")
    assert proxy[1] > proxy[0] + 1.0, report
    assert gold[1] < gold[0] - 1.0, report
    assert found is not None, report  # the alert fires
