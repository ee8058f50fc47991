"""Online DPO: ranking two samples into chosen / rejected (hand cases), the ranker on the
verifier, two steps end to end on tiny, resume, and the bad input refused before anything is
written (no way to rank, a ranker that is not a reward model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_complete_run_dir, trainer_argv
from stop_resume import assert_resume_equals_straight_run

from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.refusals import refused_before_writing_test
from trainers.core.rundir import read_jsonl
from trainers.direct_alignment import train as da_train
from trainers.direct_alignment.config import DirectAlignmentConfig
from trainers.direct_alignment.online import (
    OnlinePrompt,
    rank_samples,
    ranking_metrics,
)

CONFIG = configs_of("direct_alignment") / "online_dpo.yaml"

QUICK = [
    "model.name=tiny",
    "model.gradient_checkpointing=false",
    "data.max_samples=40",
    "data.eval_size=8",
    "data.max_length=96",
    "online.max_new_tokens=24",
    "train.batch_size=4",
    "train.gradient_accumulation_steps=2",
    "train.learning_rate=1.0e-3",
    "eval.eval_every=2",
    "eval.sample_every=1",
    "eval.num_samples=2",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]


def run(run_dir: Path, overrides: list[str], resume: bool = False) -> int:
    return da_train.main(trainer_argv(CONFIG, run_dir, overrides, resume))


# ---- ranking: hand cases ----------------------------------------------------------------------


def test_higher_score_is_chosen_and_ties_are_skipped():
    # prompt 0: 0.2 vs 0.9 -> row 1 chosen; prompt 1: 1.0 vs 0.0 -> row 2 chosen;
    # prompt 2: 0.5 vs 0.5 -> tie, skipped; prompt 3: -1 vs -3 -> row 6 chosen
    scores = torch.tensor([0.2, 0.9, 1.0, 0.0, 0.5, 0.5, -1.0, -3.0])
    ranked, tie = rank_samples(scores, 2)
    assert tie.tolist() == [False, False, True, False]
    assert ranked == [(0, 1, 0), (1, 2, 3), (3, 6, 7)]
    m = ranking_metrics({"score": scores}, ranked, tie, [[1]] * 8)
    assert m["tie_frac"] == pytest.approx(0.25) and m["pairs"] == 3
    assert m["score_chosen"] == pytest.approx((0.9 + 1.0 - 1.0) / 3)
    assert m["score_rejected"] == pytest.approx((0.2 + 0.0 - 3.0) / 3)
    assert m["score_margin"] == pytest.approx((0.7 + 1.0 + 2.0) / 3)


def test_best_of_k_against_worst_of_k():
    # k = 4. prompt 0: best 0.9 (row 2), worst 0.1 (row 1); prompt 1: two rows share the best
    # (the first, row 4, is chosen) and two the worst (the last, row 7, is rejected);
    # prompt 2: all equal -> tie; prompt 3: one right answer among three wrong ones -> a pair
    scores = torch.tensor(
        [0.5, 0.1, 0.9, 0.3, 1.0, 0.0, 1.0, 0.0, 0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 1.5, 0.0]
    )
    ranked, tie = rank_samples(scores, 4)
    assert ranked == [(0, 2, 1), (1, 4, 7), (3, 14, 15)]
    assert tie.tolist() == [False, False, True, False]
    # two samples each would have tied prompt 3's first pair (0.0, 0.0): k = 4 breaks it
    assert rank_samples(scores[12:14], 2)[1].tolist() == [True]


def test_rank_samples_refuses_scores_not_k_per_prompt():
    with pytest.raises(ValueError, match="not 2 per prompt"):
        rank_samples(torch.tensor([1.0, 2.0, 3.0]), 2)
    with pytest.raises(ValueError, match="not 4 per prompt"):
        rank_samples(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), 4)


def test_verifier_ranker_scores_correctness_plus_weighted_format():
    """The verifier's score is correctness + format_weight·format: a right answer in tags
    beats the same answer without the think tags, which beats no answer at all."""
    from trainers.core.builtin_data import builtin_preference_records
    from trainers.core.models import load_tokenizer
    from trainers.direct_alignment.online import Ranker

    record = builtin_preference_records(4, seed=0, tasks=["chain_sum"])[0]
    answer = record.meta["entry"]["answer"]
    cfg = DirectAlignmentConfig(
        loss="online_dpo", model={"name": "tiny"}, data={"dataset": "builtin:reasoning-preferences"}
    )
    tok = load_tokenizer("tiny")
    ranker = Ranker(cfg, tok, "cpu", None, "eager")
    texts = [
        f"<think>add</think><answer>{answer}</answer>",
        f"<answer>{answer}</answer>",
        "<think>no answer given</think>",
    ]
    prompt = OnlinePrompt(record.prompt, [], record.meta)
    parts = ranker.score([prompt] * 3, [tok.encode(t) for t in texts])
    assert parts["correctness"].tolist() == [1.0, 1.0, 0.0]
    assert parts["format"].tolist() == [1.0, 0.5, 0.5]
    assert parts["score"].tolist() == pytest.approx([1.5, 1.25, 0.25])


# ---- end to end -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 4])
def test_two_steps_sample_rank_and_update(tmp_path, k):
    run_dir = tmp_path / "run"
    assert run(run_dir, [*QUICK, "train.max_steps=2", f"online.num_samples={k}"]) == 0
    summary = assert_complete_run_dir(run_dir)
    assert summary["algorithm"] == "online_dpo" and summary["steps"] == 2
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if r["phase"] == "train"]
    assert len(train_rows) == 2
    for r in train_rows:
        assert 0.0 <= r["tie_frac"] <= 1.0 and r["pairs"] == round(8 * (1 - r["tie_frac"]))
        assert r["completion_length"] <= 24
        if r["pairs"]:  # a loss only where some pair was not tied
            assert r["score_chosen"] > r["score_rejected"]
            assert r["loss"] == r["loss"]  # not NaN
        else:
            assert "loss" not in r
    evals = [r for r in rows if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2]
    # the family's preference metrics on the held-out pairs, and the ranker's greedy score
    assert {"eval/accuracy", "eval/margins", "eval/score", "eval/correctness"} <= set(evals[-1])
    # at step 0 the policy is the reference: implicit rewards are 0
    assert evals[0]["eval/margins"] == pytest.approx(0.0, abs=1e-4)


def _seq_cls_reward_model(folder: Path) -> Path:
    """A random tiny Qwen2ForSequenceClassification (one label) with the tiny tokenizer: any
    such checkpoint may rank."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from trainers.core.models import load_tokenizer
    from trainers.core.tiny import ensure_preset

    config = AutoConfig.from_pretrained(ensure_preset("tiny"))
    config.num_labels = 1
    config.pad_token_id = load_tokenizer("tiny").pad_token_id
    torch.manual_seed(3)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    load_tokenizer("tiny").save_pretrained(folder)
    return folder


def test_a_reward_model_ranks_prompts_the_verifier_cannot_score(tmp_path):
    """Plain preference data (no reasoning-gym entries) ranked by a sequence classifier: its
    real-valued scores leave no ties, and no verifier metric is logged."""
    rm = _seq_cls_reward_model(tmp_path / "rm")
    overrides = [
        *QUICK,
        "data.dataset=" + str(FIXTURES / "plain_pairs.jsonl"),
        "data.max_samples=5",
        "data.eval_size=1",
        "train.gradient_accumulation_steps=1",
        "train.max_steps=1",
        f"reward.model={rm}",
    ]
    run_dir = tmp_path / "run"
    assert run(run_dir, overrides) == 0
    summary = assert_complete_run_dir(run_dir)
    assert summary["ranker"] == {"reward_model": str(rm), "verifier": False}
    row = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["phase"] == "train"][0]
    assert row["tie_frac"] == 0.0 and row["pairs"] == 4
    assert row["score_chosen"] > row["score_rejected"] and "correctness" not in row


def test_stop_then_resume_equals_straight_run(tmp_path, sigterm_at):
    """Sampling is seeded by (seed, step): 3 steps straight == 1 step, stop, resume, 2 more
    (same sampled pairs, same losses)."""

    common = [*QUICK, "train.max_steps=3", "eval.eval_every=0", "eval.sample_every=0"]
    keys = ("loss", "tie_frac", "score_chosen", "completion_length", "eval/score")
    assert_resume_equals_straight_run(
        lambda d, resume: run(d, common, resume), tmp_path, sigterm_at, 1, keys
    )


# ---- bad input --------------------------------------------------------------------------------


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        (["data.dataset=tests/fixtures/prefs.jsonl"], "no way to rank"),
        (["reward.model=tiny"], "randomly initialised causal LM, not a reward model"),
        (["online.loss=kto"], "online.loss"),
        (["online.max_new_tokens=96"], "online.max_new_tokens (96) must be smaller"),
    ],
    lambda run_dir, overrides: run(run_dir, [*QUICK, *overrides]),
)


def test_no_way_to_rank_is_a_config_error():
    with pytest.raises(ValueError, match="no way to rank"):
        DirectAlignmentConfig(
            loss="online_dpo", data={"dataset": "some/hub-prefs"}, model={"name": "tiny"}
        )
    with pytest.raises(ValueError, match="reward.verifier=true needs prompts"):
        DirectAlignmentConfig(
            loss="online_dpo",
            data={"dataset": "some/hub-prefs"},
            reward={"verifier": True, "model": "x"},
        )
