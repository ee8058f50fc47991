"""The learning chain on the tiny model: SFT gives a warm start with the tag format and some
correct answers, then GRPO from that checkpoint raises correctness.

Task: reasoning-gym ``chain_sum`` with two one-digit terms ("4 + 3 =", "6 - 9 ="). The SFT
warm start is the SFT trainer's tiny recipe (``warm_start_overrides()``) restricted to that task
with twice the demonstrations, so that it answers some prompts right and, sampled, shows reward
contrast inside most groups. GRPO then trains on a pool of 32 prompts, each seen about ten times:
what it improves is correctness on those prompts (sampled and greedy); greedy correctness on
held-out prompts does not rise (a 1M-parameter model sharpens what it was shown rather than
learning arithmetic in 40 steps) and is reported, not asserted.

Measured on the 2-core CPU box (seed 42; README.md has the table): the warm start is the SFT
recipe cut to 300 steps on two-term sums. Sampled correctness
0.17 over the first three steps -> 0.61 over the last five; greedy correctness on the 32 training
prompts 0.38 -> 0.78; held-out greedy 0.30 -> 0.27. About 105 s of CPU time, 4.5
minutes of wall time on the loaded machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._helpers.learning_runs import chain_sum_task, from_checkpoint_on_chain_sums
from tests._helpers.paths import configs_of
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.config import DatasetSpecSection
from trainers.core.models import load_causal_lm, load_tokenizer
from trainers.core.onpolicy import greedy_completions
from trainers.core.prompts import composite_prompts as load_prompts
from trainers.core.rundir import read_jsonl
from trainers.core.verifier import compute_rewards
from trainers.policy_gradients import train as pg_train
from trainers.sft import train as sft_train

TASK = chain_sum_task(2)
SEED = 42
POOL = 32
MAX_NEW = 24

SFT_OVERRIDES = [
    *sft_train.warm_start_overrides(),
    "data.builtin_tasks=[chain_sum]",
    "data.builtin_task_configs={chain_sum: {min_terms: 2, max_terms: 2, min_digits: 1, "
    "max_digits: 1}}",
    "data.max_samples=4800",
    "data.eval_size=64",
    # a partial warm start: tags learnt, some sums right (the full recipe gets nearly all of
    # these two-term sums right, which would leave GRPO nothing to improve)
    "train.num_epochs=1",
    "train.max_steps=300",
    "eval.eval_every=0",
    "eval.sample_every=0",
    "eval.num_samples=2",
]


def grpo_overrides(warm_start: Path) -> list[str]:
    return [
        *from_checkpoint_on_chain_sums(warm_start, max_terms=2),
        f"data.size={POOL}",
        "data.eval_size=64",
        "rollout.prompts_per_step=8",
        "rollout.num_rollouts=8",
        f"rollout.max_new_tokens={MAX_NEW}",
        "rollout.temperature=0.8",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        "train.batch_size=16",
        "train.gradient_accumulation_steps=1",  # 4 optimizer steps per rollout step
        "train.learning_rate=1.0e-4",
        "train.max_steps=40",
        "eval.eval_every=20",
        f"eval.max_new_tokens={MAX_NEW}",
        "eval.eval_batch_size=64",
        "checkpoint.save_final_model=true",
        f"seed={SEED}",
    ]


def argv(config: Path, run_dir: Path, overrides: list[str]) -> list[str]:
    out = ["--config", str(config), "--run-dir", str(run_dir)]
    for item in overrides:
        out += ["--set", item]
    return out


def greedy_correctness(model_dir: Path, prompts) -> float:
    tokenizer = load_tokenizer(str(model_dir))
    model = load_causal_lm(str(model_dir), device="cpu", dtype="fp32", trainable=False)
    texts, lengths, _ = greedy_completions(model, tokenizer, prompts, MAX_NEW, 64)
    rewards = compute_rewards(texts, [p.meta for p in prompts], lengths)
    return float(rewards["correctness"].mean())


@pytest.mark.slow
def test_sft_warm_start_then_grpo_raises_correctness(tmp_path):
    sft_dir = tmp_path / "sft"
    sft_config = configs_of("sft") / "sft.yaml"
    assert sft_train.main(argv(sft_config, sft_dir, SFT_OVERRIDES)) == 0
    warm = sft_dir / "final_model"

    grpo_dir = tmp_path / "grpo"
    grpo_config = configs_of("policy_gradients") / "grpo.yaml"
    assert pg_train.main(argv(grpo_config, grpo_dir, grpo_overrides(warm))) == 0

    rows = [r for r in read_jsonl(grpo_dir / "metrics.jsonl") if r["phase"] == "rollout"]
    assert len(rows) == 40
    early = sum(r["avg_correctness"] for r in rows[:3]) / 3  # ≈ the warm start, sampled
    late = sum(r["avg_correctness"] for r in rows[-5:]) / 5
    late_format = sum(r["avg_format"] for r in rows[-5:]) / 5
    contrast = 1 - sum(r["frac_reward_zero_std"] for r in rows) / len(rows)

    train_prompts, held_out = load_prompts(
        [DatasetSpecSection(name="chain_sum", config=TASK)], POOL, 64, SEED
    )
    greedy_before = greedy_correctness(warm, train_prompts)
    greedy_after = greedy_correctness(grpo_dir / "final_model", train_prompts)
    evals = [r for r in read_jsonl(grpo_dir / "metrics.jsonl") if r["phase"] == "eval"]
    report = (
        f"sampled correctness {early:.3f} -> {late:.3f}; greedy on the training prompts "
        f"{greedy_before:.3f} -> {greedy_after:.3f}; held-out greedy "
        f"{evals[0]['eval/avg_correctness']:.3f} -> {evals[-1]['eval/avg_correctness']:.3f}; "
        f"groups with contrast {contrast:.2f}; late format {late_format:.3f}"
    )
    print(report)
    assert early > 0.05, report  # the warm start does get some answers right
    assert contrast > 0.3, report  # so there is something to learn from
    assert late >= early + 0.12, report
    assert greedy_after >= greedy_before + 0.1, report
    assert late_format >= 0.95, report  # the format is kept while correctness rises
