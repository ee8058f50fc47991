"""ReMax learns where its baseline is informative: from the SFT warm start, on a dense stand-in
reward.

ReMax's baseline is the reward of the prompt's greedy completion. On the random-init ``tiny``
model that completion is a run of newlines (reward 0 under any text reward), so the baseline is
0 and ReMax is plain REINFORCE, which barely moves in a CPU-sized run
(test_pg_new_algorithms_learning.py's docstring has the numbers). The paper's setting is an SFT'd
model whose greedy completion is a typical one; the session's cached SFT warm start
(``warm_start_model()``) is that model on ``tiny``. Its greedy answers are right on only some
chain-sum prompts and its samples are mostly worse than its greedy answer, which drove the
verifier-rewarded runs down (the family README has those figures). So, as in the other
new-algorithm learning tests, the reward is the dense stand-in a policy shows contrast on: the
share of vowel characters in the completion, scored for the rollouts, the greedy baseline and
the greedy held-out evaluation alike. Sampled at the recipes' temperature 0.6 / top-k 20 /
top-p 0.95, the warm start's samples score about what its greedy completion scores, so the
advantages have both signs.

It checks that ReMax's greedy baseline and its REINFORCE loss push the policy up its reward on
held-out prompts; not that it learns a task.

Measured (seed 42, 16 rollout steps of 4 prompts × 4 samples plus the 4 greedy baselines,
24 new tokens, lr 3e-3; contended 2-core machine, ~20 s a step with 8 processes sharing it, the
warm start cached): sampled share over the first 3 -> last 3 steps 0.116 -> 0.199; the greedy
baseline 0.11 -> 0.20; greedy held-out share (64 prompts) 0.112 -> 0.211. At lr 1e-3 over 12
steps: 0.120 -> 0.149, held-out 0.112 -> 0.153; at temperature 1.0 / no top-k, lr 1e-3:
0.114 -> 0.127, held-out 0.112 -> 0.135.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._helpers.learning_runs import (
    from_checkpoint_on_chain_sums,
    metrics_of_a_vowel_share_run,
    stand_in_learning_settings,
)
from tests._helpers.paths import configs_of
from trainers.policy_gradients import train as pg_train
from trainers.sft import train as sft_train

CONFIGS = configs_of("policy_gradients")
STEPS = 16
LATE_GAIN = 0.05  # measured +0.083
HELD_OUT_GAIN = 0.05  # measured +0.099


def overrides(warm_start: Path) -> list[str]:
    return [
        *from_checkpoint_on_chain_sums(warm_start, max_terms=3),
        "data.size=64",
        "data.eval_size=64",
        "rollout.prompts_per_step=4",
        "rollout.num_rollouts=4",
        "rollout.max_new_tokens=24",
        "train.batch_size=16",
        "train.learning_rate=3.0e-3",
        "eval.eval_batch_size=64",
        "eval.max_new_tokens=24",
        *stand_in_learning_settings(STEPS),
    ]


@pytest.mark.slow
def test_remax_from_the_warm_start_raises_its_reward(tmp_path):
    warm_start = sft_train.warm_start_model()
    # the stand-in scores the samples, the greedy baselines and the held-out evaluation
    metrics = metrics_of_a_vowel_share_run(
        pg_train.main, CONFIGS / "remax.yaml", tmp_path / "run", overrides(warm_start)
    )
    rows = [r for r in metrics if r["phase"] == "rollout"]
    evals = [r["eval/avg_correctness"] for r in metrics if r["phase"] == "eval"]
    assert len(rows) == STEPS and len(evals) == 2
    sampled = [r["avg_total"] for r in rows]
    greedy = [r["avg_greedy"] for r in rows]
    early, late = sum(sampled[:3]) / 3, sum(sampled[-3:]) / 3
    report = (
        f"remax: sampled {early:.3f} -> {late:.3f}, greedy baseline {greedy[0]:.3f} -> "
        f"{greedy[-1]:.3f}, greedy held-out {evals[0]:.3f} -> {evals[-1]:.3f}"
    )
    print(report)
    assert late >= early + LATE_GAIN, report
    assert evals[-1] >= evals[0] + HELD_OUT_GAIN, report
