"""A policy learns to call a tool, and a multi-turn run resumes exactly, on the tiny model.

The warm start is the SFT trainer's tiny recipe on ``builtin:tool-sft`` (one-digit sums; half the
demonstrations call the calculator, half answer without it), cut short so that sampled with the
tool offered it calls the calculator in only some of its trajectories. GRPO then trains against
``scripted_tool``: +1 for a call the calculator answers and +1 when the final answer repeats the
result (the stand-in reward of issue #28), plus the verifier's correctness. What must rise is the
share of trajectories that call the tool (``tools/called``), measured on the rollouts of the first
two and the last four steps. Measured (seed 42, 2-core CPU): 0.59, 0.62 over steps 1-2 -> 0.90
over steps 21-24; about 80 s with the warm start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stop_resume import assert_same_history

from tests._helpers.learning_runs import from_checkpoint_on_chain_sums, trained_model
from tests._helpers.paths import configs_of
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from tests.conftest import trainer_argv
from trainers.core.rundir import SIGTERM_ENV, read_jsonl
from trainers.policy_gradients import train as pg_train
from trainers.sft import train as sft_train

PG_CONFIG = configs_of("policy_gradients") / "grpo_tools.yaml"
SFT_CONFIG = configs_of("sft") / "sft.yaml"
TASK = "{chain_sum: {min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}}"

SFT_OVERRIDES = [
    *sft_train.warm_start_overrides(),
    "data.dataset=builtin:tool-sft:chain_sum",
    "data.train_on=all_assistant",
    f"data.builtin_task_configs={TASK}",
    "data.max_samples=2400",
    "data.max_length=256",  # the tool instructions make a demonstration ~240 tiny tokens
    "data.eval_size=32",
    "train.num_epochs=1",
    "train.max_steps=120",
    "eval.eval_every=0",
    "eval.sample_every=0",
]


def grpo_overrides(warm_start: Path, steps: int) -> list[str]:
    return [
        *from_checkpoint_on_chain_sums(warm_start, max_terms=2),
        "data.size=64",
        "data.eval_size=8",
        "env.name=scripted_tool",
        "env.max_turns=2",
        "env.max_observation_tokens=16",
        "rollout.prompts_per_step=4",
        "rollout.num_rollouts=8",
        "rollout.max_new_tokens=32",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        "train.batch_size=16",
        "train.gradient_accumulation_steps=1",
        "train.learning_rate=3.0e-4",
        f"train.max_steps={steps}",
        "eval.eval_every=0",
        "eval.num_samples=2",
        "checkpoint.save_every=null",
        "checkpoint.save_final_model=false",
        "seed=42",
    ]


@pytest.fixture(scope="module")
def tool_warm_start(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tool-sft") / "run"
    return trained_model(sft_train.main, SFT_CONFIG, run_dir, SFT_OVERRIDES)


def called(run_dir: Path) -> list[float]:
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "rollout"]
    return [r["tools/called"] for r in rows]


def test_grpo_learns_to_call_the_tool(tmp_path, tool_warm_start):
    run_dir = tmp_path / "grpo"
    assert pg_train.main(trainer_argv(PG_CONFIG, run_dir, grpo_overrides(tool_warm_start, 24))) == 0
    rates = called(run_dir)
    first, last = sum(rates[:2]) / 2, sum(rates[-4:]) / 4
    assert 0.2 < first < 0.8, rates  # the warm start calls sometimes: something to learn
    assert last > first + 0.15, rates
    samples = [s for s in read_jsonl(run_dir / "samples.jsonl") if s["kind"] == "rollout"]
    roles = {turn["role"] for s in samples for turn in s["turns"]}
    assert roles == {"model", "tool"}


def test_a_stop_inside_a_multi_turn_rollout_resumes_exactly(tmp_path, tool_warm_start, monkeypatch):
    """Straight 4 steps == a real SIGTERM in the middle of step 3's trajectories (the step is
    dropped: nothing of it logged; the checkpoint of step 2 is kept), then resumed."""
    import trainers.core.decoding as decoding

    overrides = [*grpo_overrides(tool_warm_start, 4), "checkpoint.save_every=1"]
    straight = tmp_path / "straight"
    real = decoding.raise_if_stopping
    step_of_check: list[int] = []  # the step in progress at each token check of the straight run

    def counting(where: str) -> None:
        if where == "token":
            progress = json.loads((straight / "progress.json").read_text())
            step_of_check.append(int(progress["step"]))
        real(where)

    monkeypatch.setattr(decoding, "raise_if_stopping", counting)
    assert pg_train.main(trainer_argv(PG_CONFIG, straight, overrides)) == 0
    monkeypatch.setattr(decoding, "raise_if_stopping", real)
    in_step_three = [i for i, step in enumerate(step_of_check, 1) if step == 2]
    assert len(in_step_three) > 4, step_of_check  # step 3 (after step 2's checkpoint) sampled
    nth = in_step_three[len(in_step_three) // 2]

    half = tmp_path / "half"
    monkeypatch.setenv(SIGTERM_ENV, f"token:{nth}")
    assert pg_train.main(trainer_argv(PG_CONFIG, half, overrides)) == 143
    summary = json.loads((half / "summary.json").read_text())
    assert summary["outcome"] == "stopped" and "token" in summary.get("detail", "token")
    assert read_jsonl(half / "metrics.jsonl")[-1]["step"] == 2
    monkeypatch.delenv(SIGTERM_ENV)
    assert pg_train.main(trainer_argv(PG_CONFIG, half, overrides, resume=True)) == 0

    keys = ("loss", "grad_norm", "avg_total", "tools/called", "tools/observation_tokens")
    assert_same_history(straight, half, keys, sample_field="turns", rel=1e-5, abs_tol=1e-7)


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("rloo", []),
        ("drgrpo", []),
        ("reinforce_pp", ["loss.beta=0.01"]),
        ("ppo", ["rollout.num_rollouts=1", "rollout.prompts_per_step=16"]),
    ],
)
def test_every_estimator_family_trains_on_trajectories_with_calls(
    tmp_path, tool_warm_start, algorithm, extra
):
    """Two steps from the tool warm start, whose trajectories do call the tool: group baselines
    (RLOO, Dr. GRPO), returns-to-go with a KL penalty (REINFORCE++) and GAE on a value model over
    the model tokens (PPO) all update on them."""
    run_dir = tmp_path / algorithm
    overrides = [*grpo_overrides(tool_warm_start, 2), f"algorithm={algorithm}", *extra]
    assert pg_train.main(trainer_argv(PG_CONFIG, run_dir, overrides)) == 0
    rows = read_jsonl(run_dir / "metrics.jsonl")
    rollout = [r for r in rows if r["phase"] == "rollout"]
    train = [r for r in rows if r["phase"] == "train"]
    assert (
        max(r["tools/called"] for r in rollout) > 0
        and max(r["tools/observation_tokens"] for r in rollout) > 0
    )
    assert all(r["grad_norm"] > 0 and r["loss"] == r["loss"] for r in train)
    if algorithm == "ppo":
        assert all("value_loss" in r for r in train) and "explained_variance" in rollout[-1]
    if algorithm == "reinforce_pp":
        assert "kl_ref" in rollout[-1]
