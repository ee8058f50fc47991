"""Reward models (preference / ORM / PRM): losses and metrics against hand values, real-schema
fixtures, offline generators, save -> load -> score, run directories, resume, bad input, and
learning on the tiny model."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
from conftest import assert_complete_run_dir as assert_complete_trainer_run
from conftest import assert_phases, assert_same_gradients, trainer_argv
from stop_resume import assert_resume_equals_straight_run

from tests._helpers.paths import FIXTURES, configs_of
from tests._helpers.quick_runs import PREFERENCES_TO_LEARN
from tests._helpers.refusals import refused_before_writing_test
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.config import load_config
from trainers.core.reward_model import RewardModelError, build_reward_model, save_reward_model
from trainers.core.reward_scorer import RewardScorer
from trainers.core.rundir import read_jsonl
from trainers.core.tasks import score_fn, score_response
from trainers.reward_models import train as rm_train
from trainers.reward_models.config import RewardModelConfig
from trainers.reward_models.data import (
    GSM8K_SYSTEM_PROMPT,
    StepRecord,
    builtin_outcome_records,
    builtin_step_records,
    gsm8k_final_answer,
    load_outcome_records,
    load_step_records,
    parse_outcome_row,
    parse_prm800k_row,
    rating_to_class,
    tokenize_outcomes,
    tokenize_steps,
    window_solution,
)
from trainers.reward_models.losses import (
    auroc,
    bradley_terry_loss,
    first_error_accuracy,
    first_error_baseline,
    first_error_index,
    majority_baseline,
    orm_loss,
    prm_loss,
    ranking_accuracy,
    top1_accuracy,
)

CONFIGS = configs_of("reward_models")
CONFIG_OF = {"preference": "preference_rm", "orm": "orm", "prm": "prm"}


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------------------------------------
# Losses against hand-computed values
# ---------------------------------------------------------------------------------------------


def test_bradley_terry_hand_values_and_gradient():
    r_c = torch.tensor([2.0, 0.0, 1.0], requires_grad=True)
    r_r = torch.tensor([1.0, 1.0, 1.0])
    loss, m = bradley_terry_loss(r_c, r_r)
    want = (softplus(-1.0) + softplus(1.0) + math.log(2.0)) / 3  # −log σ(m) = softplus(−m)
    assert float(loss.detach()) == pytest.approx(want, abs=1e-6)
    assert m["loss"] == pytest.approx(want, abs=1e-6)
    assert m["accuracy"] == pytest.approx(1 / 3)  # the tie (margin 0) counts as wrong
    assert m["reward_margin"] == pytest.approx(0.0, abs=1e-7)
    assert m["r_chosen_mean"] == pytest.approx(1.0) and m["r_rejected_mean"] == pytest.approx(1.0)
    loss.backward()
    sig = [1 / (1 + math.exp(-x)) for x in (1.0, -1.0, 0.0)]
    assert r_c.grad.tolist() == pytest.approx([-(1 - s) / 3 for s in sig], abs=1e-6)
    with pytest.raises(ValueError):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))


def test_orm_loss_all_tokens_and_last_token():
    logits = torch.tensor([[0.0, 2.0, -1.0], [1.0, 1.0, 0.0]])
    labels = torch.tensor([1, 0])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])  # completion tokens; row 2 is padded at the end
    loss, m = orm_loss(logits, labels, mask, "all")
    seq1 = (softplus(-2.0) + softplus(1.0)) / 2  # label 1: −log σ(s) = softplus(−s)
    seq2 = (softplus(1.0) + softplus(1.0)) / 2  # label 0: −log(1 − σ(s)) = softplus(s)
    assert float(loss) == pytest.approx((seq1 + seq2) / 2, abs=1e-6)
    assert m["accuracy"] == 0.0  # last-token scores −1 (label 1) and 1 (label 0): both wrong
    loss, _ = orm_loss(logits, labels, mask, "last")
    assert float(loss) == pytest.approx((softplus(1.0) + softplus(1.0)) / 2, abs=1e-6)
    with pytest.raises(ValueError):
        orm_loss(logits, labels, torch.zeros_like(mask), "all")


def test_prm_loss_reads_only_labelled_steps():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [5.0, 0.0, 0.0]])
    labels = torch.tensor([0, 1, -100])

    def ce(row, y):
        return -(row[y] - math.log(sum(math.exp(v) for v in row)))

    loss, m = prm_loss(logits, labels)
    want = (ce([2.0, 0.0, 0.0], 0) + ce([0.0, 0.0, 3.0], 1)) / 2
    assert float(loss) == pytest.approx(want, abs=1e-6)
    assert m["step_accuracy"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        prm_loss(logits, torch.full((3,), -100))


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def _brute_auroc(scores, labels):
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auroc_with_ties_matches_hand_value_and_pair_count():
    # positives {0.4, 0.8} vs negatives {0.1, 0.4}: 1 + 0.5 (tie) + 1 + 1 = 3.5 of 4 pairs
    assert auroc([0.1, 0.4, 0.4, 0.8], [0, 0, 1, 1]) == pytest.approx(0.875)
    assert auroc([0.3, 0.3, 0.3], [1, 0, 1]) == pytest.approx(0.5)  # all tied
    assert auroc([0.9, 0.1], [0, 1]) == 0.0
    assert math.isnan(auroc([0.2, 0.3], [1, 1]))
    rng = random.Random(0)
    scores = [rng.randint(0, 4) for _ in range(60)]  # many ties
    labels = [rng.random() < 0.4 for _ in range(60)]
    assert auroc(scores, labels) == pytest.approx(_brute_auroc(scores, labels), abs=1e-12)


def test_ranking_accuracy_pools_pairs_within_prompts():
    scores = [0.9, 0.2, 0.5, 0.1, 0.3, 0.7, 0.8, 0.8, 5.0, -5.0]
    labels = [1, 0, 0, 0, 1, 0, 1, 0, 1, 1]
    groups = ["a", "a", "a", "a", "b", "b", "c", "c", "d", "d"]
    # a: 3 pairs right; b: 1 pair wrong; c: 1 tie (1/2); d: no pair (all correct). Pooled over
    # the 5 pairs (a per-prompt mean would give (1 + 0 + 0.5) / 3 instead).
    assert ranking_accuracy(scores, labels, groups) == pytest.approx((3 + 0 + 0.5) / 5)
    assert math.isnan(ranking_accuracy([1.0, 2.0], [1, 1], ["x", "x"]))
    # top-1: a picks 0.9 (correct) 1; b picks 0.7 (wrong) 0; c tie of one right one wrong 0.5;
    # d picks 5.0 (correct) 1
    assert top1_accuracy(scores, labels, groups) == pytest.approx((1 + 0 + 0.5 + 1) / 4)


def test_step_metrics_and_first_error_detection():
    assert majority_baseline([0, 1, 1, -100, 1]) == pytest.approx(3 / 4)
    assert first_error_index([2, 2, 0, 0]) == 2
    assert first_error_index([2, 1, 2]) is None
    assert first_error_index([-100, 0]) == 1
    predicted = [[2, 2, 0], [2, 2, 2], [0, 2], [2, 2], [2, 0, 0], [0, 2, 0]]
    labels = [[2, 2, 0], [2, 2, 2], [2, 2], [2, 0], [2, 2, 0], [-100, 2, 0]]
    # hit, hit ("no error" on both sides), false alarm, missed error, too early,
    # hit (the unlabelled first step is left out on both sides)
    assert first_error_accuracy(predicted, labels) == pytest.approx(3 / 6)
    # first errors: 2, None, None, 1, 2, 1 (after dropping −100) -> best constant guess 2/6
    assert first_error_baseline(labels) == pytest.approx(2 / 6)
    assert first_error_baseline([[1, 1], [1, 0], [1, 1]]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        first_error_accuracy([[0]], [[0, 1]])


# ---------------------------------------------------------------------------------------------
# Real-schema fixtures
# ---------------------------------------------------------------------------------------------


def test_gsm8k_orm_fixture_loads_every_row_form():
    stats: dict = {}
    records = load_outcome_records(
        str(FIXTURES / "gsm8k_orm.jsonl"), max_samples=None, rollouts_per_prompt=3, stats=stats
    )
    by_q = {r.prompt[-1]["content"].split()[1]: r for r in records}
    assert stats["n_records"] == 5 and stats["skipped"] == 1  # the unlabelled-able row
    assert stats["labels_from_answer"] == 1 and stats["generated_from_answer"] == 1
    for rec in records:
        assert rec.prompt[0] == {"role": "system", "content": GSM8K_SYSTEM_PROMPT}
    assert by_q["baker"].labels == [1, 0, 1]
    assert by_q["reads"].labels == [1, 0]  # labelled by the #### number of the reference
    tulips = by_q["garden"]  # plain GSM8K row: reference (1) + perturbed final number (0)
    assert tulips.labels == [1, 0]
    assert gsm8k_final_answer(tulips.completions[0]) == "33"
    assert gsm8k_final_answer(tulips.completions[1]) not in (None, "33")
    assert tulips.completions[1].rsplit("####", 1)[0] == tulips.completions[0].rsplit("####", 1)[0]
    assert len(by_q["buys"].completions) == 3  # rollouts_per_prompt keeps the first 3 of 4
    assert gsm8k_final_answer("so\n#### 1,000") == "1000"
    assert gsm8k_final_answer("#### $10.00") == "10"
    assert gsm8k_final_answer("no final line") is None


def test_orm_rows_in_the_books_rollout_form():
    row = {
        "prompt": "What is 2 + 3?",
        "completions": ["5\n#### 5", "6\n#### 6"],
        "rewards": [1.0, 0.0],
    }
    rec = parse_outcome_row(row)
    assert rec.labels == [1, 0] and rec.prompt[-1] == {"role": "user", "content": "What is 2 + 3?"}
    chat = [{"role": "user", "content": "Hi"}]
    rec = parse_outcome_row({"prompt": chat, "completions": ["a"], "labels": [True]})
    assert rec.prompt == chat and rec.labels == [1]
    with pytest.raises(ValueError, match="2 completions but 1 labels"):
        parse_outcome_row({"prompt": "q", "completions": ["a", "b"], "labels": [1]})


def test_prm800k_fixture_follows_the_labelled_trajectory():
    stats: dict = {}
    records = load_step_records(str(FIXTURES / "prm800k.jsonl"), stats=stats)
    assert stats["n_records"] == 4 and stats["skipped"] == 1  # the bad_problem row

    def find(word):
        return next(r for r in records if word in r.problem)

    phase2 = find("odd integers")
    assert phase2.ratings == [1, 0, 1, -1]  # stops at the first error (chosen_completion null)
    assert phase2.steps[-1].startswith("Adding the middle number")
    phase1 = find("Solve for")
    assert phase1.steps[0] == "Subtract 7 from both sides: $3x = 15$."  # chosen alternative 1
    assert phase1.steps[1] == "Dividing by 3 gives $x = 5$."  # the human step, rated +1
    assert phase1.ratings == [1, 1, 1]
    stopped = find("divisors")
    assert stopped.ratings == [0, -1]  # the worst-rated alternative ends the solution
    assert stopped.steps[1] == "The pairs are (1, 12) and (2, 6), so 4 divisors."
    flagged = find("2^{10}")
    assert flagged.ratings == [1, None, 1]
    assert parse_prm800k_row({"problem": "p", "steps": ["a", "b"], "ratings": [1, -1]}).ratings == [
        1,
        -1,
    ]
    assert [rating_to_class(r, 3) for r in (-1, 0, 1, None, 7)] == [0, 1, 2, -100, -100]
    assert [rating_to_class(r, 2) for r in (-1, 0, 1)] == [0, 1, 1]


@pytest.fixture(scope="module")
def tokenizer():
    from trainers.core.models import load_tokenizer

    return load_tokenizer("tiny")


def test_prm_labels_sit_on_the_last_separator_token(tokenizer):
    records = load_step_records(str(FIXTURES / "prm800k.jsonl"))
    sep = "\n<step>\n"
    sep_ids = tokenizer(sep, add_special_tokens=False)["input_ids"]
    examples, stats = tokenize_steps(records, tokenizer, 512, sep, num_labels=3)
    assert stats["n_out"] == 4 and stats["split_solutions"] == 0
    for ex in examples:
        rec = records[ex.solution]
        assert len(ex.positions) == len(ex.labels) == len(rec.steps)
        assert ex.labels == [rating_to_class(r, 3) for r in rec.ratings]
        for pos, step in zip(ex.positions, rec.steps, strict=True):
            assert ex.input_ids[pos - len(sep_ids) + 1 : pos + 1] == sep_ids
            text = tokenizer.decode(ex.input_ids[: pos + 1])
            assert text.endswith(step.strip() + sep)


def test_long_solutions_are_windowed_with_earlier_steps_as_context():
    prompt = [1, 2, 3]
    pieces = [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    windows, truncated = window_solution(prompt, pieces, max_length=12)  # budget 9 = 2 steps
    assert not truncated and len(windows) == 2
    ids, positions, first, end = windows[0]
    assert ids == prompt + pieces[0] + pieces[1] and positions == [6, 10] and (first, end) == (0, 2)
    ids, positions, first, end = windows[1]
    assert ids == prompt + pieces[1] + pieces[2] and positions == [10] and (first, end) == (2, 3)
    windows, truncated = window_solution(prompt, [[1] * 4, [2] * 20], max_length=12)
    assert truncated and len(windows) == 1


def test_orm_tokenisation_matches_the_chat_template_and_drops_long_sequences(tokenizer):
    records = load_outcome_records(
        str(FIXTURES / "gsm8k_orm.jsonl"), max_samples=None, rollouts_per_prompt=4
    )
    examples, stats = tokenize_outcomes(records, tokenizer, max_length=4096)
    assert (
        stats["n_out"] == sum(len(r.completions) for r in records) and stats["prefix_fallback"] == 0
    )
    ex = examples[0]
    rec = records[ex.group]
    conv = rec.prompt + [{"role": "assistant", "content": rec.completions[0]}]
    full = tokenizer.apply_chat_template(conv, tokenize=True)["input_ids"]
    assert ex.input_ids == list(full)
    shortest = min(len(e.input_ids) for e in examples)
    _, stats = tokenize_outcomes(records, tokenizer, max_length=shortest)
    assert stats["dropped_too_long"] > 0 and stats["n_out"] >= 1


# ---------------------------------------------------------------------------------------------
# Offline generators
# ---------------------------------------------------------------------------------------------


def test_builtin_outcomes_are_deterministic_and_labelled_by_reasoning_gym():
    a = builtin_outcome_records(24, seed=5, completions_per_prompt=4)
    b = builtin_outcome_records(24, seed=5, completions_per_prompt=4)
    assert [(r.completions, r.labels) for r in a] == [(r.completions, r.labels) for r in b]
    c = builtin_outcome_records(24, seed=6, completions_per_prompt=4)
    assert [r.completions for r in a] != [r.completions for r in c]
    assert {r.meta["task"] for r in a} == {"spell_backward", "chain_sum", "letter_counting"}
    for rec in a:
        assert len(rec.completions) == 4 and 0 < sum(rec.labels) < 4  # both classes per prompt
        meta = {"task": rec.meta["task"], "entry": rec.meta["entry"]}
        for text, label, kind in zip(rec.completions, rec.labels, rec.meta["kinds"], strict=True):
            correct = score_response(text, meta) == 1.0
            assert label == int(correct)
            assert (kind == "correct") == correct, (kind, text)


_STEP_RE = re.compile(r"^(-?\d+) ([-+*]) (\d+) = (-?\d+)$")


def _first_wrong_step(record: StepRecord) -> int | None:
    """Independent check: replay the question's expression and find the first step whose
    operand, operation or result disagrees with it."""
    tokens = record.meta["entry"]["metadata"]["expression"].split()
    state = int(tokens[0])
    ops = list(zip(tokens[1::2], (int(t) for t in tokens[2::2]), strict=True))
    j = 0
    for i, step in enumerate(record.steps):
        m = _STEP_RE.match(step)
        if m is None:
            continue  # the neutral lead-in and the final sentence
        left, op, num, result = int(m[1]), m[2], int(m[3]), int(m[4])
        want_op, want_num = ops[j]
        true_result = state + want_num if want_op == "+" else state - want_num
        if left != state or op != want_op or num != want_num or result != true_result:
            return i
        state, j = result, j + 1
    return None


def test_builtin_steps_are_deterministic_and_bad_from_the_injected_error_on():
    a = builtin_step_records(300, seed=11)
    assert [(r.steps, r.ratings) for r in a] == [
        (r.steps, r.ratings) for r in builtin_step_records(300, seed=11)
    ]
    kinds = {r.meta["error_kind"] for r in a}
    assert kinds == {None, "arithmetic", "operand", "operation"}
    assert any(r.ratings[0] == 0 for r in a)  # neutral lead-ins occur
    score = score_fn("chain_sum")
    for rec in a:
        err = rec.meta["error_step"]
        assert err == _first_wrong_step(rec), rec.steps
        assert rec.steps[-1] == f"The answer is {rec.meta['final_answer']}."
        solved = score(rec.meta["final_answer"], rec.meta["entry"]) == 1.0
        assert solved == (err is None)
        for i, rating in enumerate(rec.ratings):
            if err is not None and i >= err:
                assert rating == -1
            else:
                assert rating == (0 if i == 0 and rec.steps[0][0].isalpha() else 1)


# ---------------------------------------------------------------------------------------------
# Save -> load -> score
# ---------------------------------------------------------------------------------------------

CONVERSATIONS = [
    [
        {"role": "user", "content": "What is 3 + 4?"},
        {"role": "assistant", "content": "<think>3 + 4 = 7.</think>\n<answer>7</answer>"},
    ],
    [
        {"role": "user", "content": "Spell cat backward."},
        {"role": "assistant", "content": "The answer is tac."},
    ],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}],
]


@pytest.mark.parametrize("kind", ["preference", "orm", "prm"])
def test_save_load_score_round_trip_is_exact(tmp_path, tokenizer, kind):
    torch.manual_seed(3)
    num_labels = 3 if kind == "prm" else 1
    model = build_reward_model(
        "tiny",
        kind,
        num_labels=num_labels,
        separator="\n",
        max_length=256,
        device="cpu",
        trainable=False,
    )
    with torch.no_grad():  # a head far from its init, so a lost head would show
        model.head.weight.normal_(0, 0.5)
    before = RewardScorer(model, tokenizer, batch_size=2)
    save_reward_model(model, tokenizer, tmp_path / "rm")
    meta = json.loads((tmp_path / "rm" / "reward_model.json").read_text())
    assert meta["kind"] == kind and meta["num_labels"] == num_labels
    after = RewardScorer.from_pretrained(tmp_path / "rm", device="cpu", batch_size=2)
    assert after.kind == kind and not after.model.training
    if kind == "prm":
        items = [
            {"problem": "2 + 3 - 1", "steps": ["2 + 3 = 5", "5 - 1 = 4", "The answer is 4."]},
            {"problem": "9 - 9", "steps": ["9 - 9 = 0"]},
        ]
        assert before.score(items) == after.score(items)
        probs = after.score_steps([i["problem"] for i in items], [i["steps"] for i in items])
        assert [len(p) for p in probs] == [3, 1] and all(len(s) == 3 for s in probs[0])
        assert after.score(items)[0] == pytest.approx(min(1 - s[0] for s in probs[0]))
        long_items = [{"problem": "9 " * 400, "steps": ["1 + 1 = 2 " * 60, "2 + 2 = 4"] * 6}]
        long_probs = after.score_steps([long_items[0]["problem"]], [long_items[0]["steps"]])
        assert len(long_probs[0]) == 12 and all(len(p) == 3 for p in long_probs[0])
        return
    items = [*CONVERSATIONS, "a raw string, scored as is"]
    s_before, s_after = before.score(items), after.score(items)
    assert s_before == s_after
    one_by_one = RewardScorer(after.model, after.tokenizer, batch_size=1).score(items)
    assert one_by_one == pytest.approx(s_after, abs=1e-5)  # padding does not change scores
    if kind == "orm":
        raw = after.raw_scores(after.encode(items))
        assert all(0 < p < 1 for p in s_after)
        assert s_after == pytest.approx([1 / (1 + math.exp(-r)) for r in raw], abs=1e-9)
    assert len(set(s_after)) == len(items)


def test_pair_rows_share_the_prompt_and_score_like_right_padded_rows(
    record_forward_shapes,
):
    """The training path (collate_pairs_split + split_sequence_scores: a pair's prompt forwarded
    once) gives the scores and gradients of right-padded full rows (collate_pairs +
    sequence_scores)."""
    from trainers.direct_alignment.data import TokenizedExample
    from trainers.reward_models.data import collate_pairs, collate_pairs_split

    torch.manual_seed(5)
    model = build_reward_model("tiny", "preference", device="cpu")
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)
    examples = [
        TokenizedExample(prompt_ids=[5, 6, 7, 8], chosen_ids=[20, 21, 22], rejected_ids=[23]),
        TokenizedExample(prompt_ids=[9, 10], chosen_ids=[24], rejected_ids=[25, 26, 27, 28]),
        TokenizedExample(prompt_ids=[11, 12, 13], chosen_ids=[29, 30], rejected_ids=[31, 32]),
    ]
    decoder = model.backbone.get_decoder()
    widths = record_forward_shapes(decoder)
    split = collate_pairs_split(examples, pad_id=0)
    shared = model.split_sequence_scores(
        split["input_ids"], split["attention_mask"], split["prompt_width"]
    )
    assert widths == [(3, 4), (6, 4)]  # three prompts once, then six responses
    params = [model.head.weight, *list(decoder.parameters())[:3]]
    shared_grads = torch.autograd.grad(shared.sum(), params)

    right = collate_pairs(examples, pad_id=0)
    full = model.sequence_scores(right["input_ids"], right["attention_mask"])
    torch.testing.assert_close(shared, full, rtol=1e-5, atol=1e-5)
    assert_same_gradients(shared_grads, torch.autograd.grad(full.sum(), params))
    assert full[:3].tolist() != full[3:].tolist()


def test_heads_and_freeze_backbone():
    frozen = build_reward_model("tiny", "orm", device="cpu", freeze_backbone=True)
    assert [n for n, p in frozen.named_parameters() if p.requires_grad] == ["head.weight"]
    assert frozen.head.bias is None and frozen.head.weight.dtype == torch.float32
    prm = build_reward_model("tiny", "prm", num_labels=3, device="cpu")
    assert prm.head.out_features == 3 and prm.head.bias is not None  # the book's heads
    assert all(p.requires_grad for p in prm.parameters())
    with pytest.raises(ValueError):
        build_reward_model("tiny", "orm", num_labels=3, device="cpu")


def test_loading_a_plain_model_folder_says_what_is_missing(tmp_path, tokenizer):
    from trainers.core.reward_model import load_reward_model

    with pytest.raises(RewardModelError, match="not a saved reward model"):
        load_reward_model(tmp_path)


# ---------------------------------------------------------------------------------------------
# The trainer: run directories, resume, bad input
# ---------------------------------------------------------------------------------------------

QUICK = [
    "model.name=tiny",
    "train.batch_size=2",
    "train.gradient_accumulation_steps=2",
    "train.learning_rate=1.0e-3",
    "train.max_steps=2",
    "train.num_epochs=3",
    "eval.eval_every=1",
    "eval.eval_batch_size=4",
    "eval.num_samples=1",
    "logging.log_every=1",
    "checkpoint.save_every=null",
]
FIXTURE_DATA = {
    "preference": [f"data.dataset={FIXTURES / 'ultrafeedback_cleaned.jsonl'}"],
    "orm": [f"data.dataset={FIXTURES / 'gsm8k_orm.jsonl'}", "data.rollouts_per_prompt=4"],
    "prm": [f"data.dataset={FIXTURES / 'prm800k.jsonl'}"],
}
EVAL_KEYS = {
    "preference": ["accuracy", "reward_margin", "r_chosen_mean", "r_rejected_mean", "loss"],
    "orm": ["accuracy", "auroc", "ranking_accuracy", "top1_accuracy", "loss"],
    "prm": ["step_accuracy", "majority_baseline", "first_error_accuracy", "loss"],
}
TRAIN_KEYS = {
    "preference": ["loss", "accuracy", "reward_margin", "r_chosen_mean", "r_rejected_mean"],
    "orm": ["loss", "accuracy"],
    "prm": ["loss", "step_accuracy"],
}


def run(kind: str, run_dir: Path, overrides: list[str], resume: bool = False) -> int:
    return rm_train.main(
        trainer_argv(CONFIGS / f"{CONFIG_OF[kind]}.yaml", run_dir, overrides, resume)
    )


def assert_complete_run_dir(path: Path) -> dict:
    return assert_complete_trainer_run(path, check_rows=False)


def test_shipped_configs_hold_the_book_defaults():
    pref = load_config(CONFIGS / "preference_rm.yaml", RewardModelConfig)
    assert (pref.kind, pref.model.name, pref.data.max_samples) == (
        "preference",
        "Qwen/Qwen3-0.6B-Base",
        5000,
    )
    t = pref.train
    assert (t.batch_size, t.gradient_accumulation_steps, t.learning_rate, t.num_epochs) == (
        2,
        8,
        5e-5,
        2,
    )
    assert t.warmup_ratio == 0.1 and pref.eval.eval_every == 25 and pref.data.max_length == 512
    assert pref.data.dataset == "argilla/ultrafeedback-binarized-preferences-cleaned"
    orm = load_config(CONFIGS / "orm.yaml", RewardModelConfig)
    assert orm.data.dataset == "RLHF-Book/gsm8k-qwen3-0.6B-rollouts"
    assert orm.data.rollouts_per_prompt == 100 and orm.seed == 7
    prm = load_config(CONFIGS / "prm.yaml", RewardModelConfig)
    assert prm.data.dataset == "tasksource/PRM800K" and prm.data.num_labels == 3
    assert prm.data.step_separator == "\n<step>\n" and prm.train.schedule == "constant"
    # the shared defaults of the config model are the book's too
    default = RewardModelConfig(model={"name": "tiny"})
    assert default.train.learning_rate == 5e-5 and default.train.batch_size == 2
    assert RewardModelConfig(kind="prm").data.dataset == "tasksource/PRM800K"


@pytest.mark.parametrize("kind", ["preference", "orm", "prm"])
def test_each_kind_writes_a_complete_run_dir_from_its_real_schema_fixture(
    tmp_path, kind, progress_writes, capsys
):
    overrides = [*QUICK, *FIXTURE_DATA[kind], "data.max_samples=null", "data.eval_size=2"]
    assert run(kind, tmp_path / "run", overrides) == 0
    assert_phases(progress_writes, "tokenizing", "loading_model", "evaluating", "training")
    assert_phases(progress_writes, "training", "evaluating", "done")
    assert progress_writes[2] == ("loading_model", 0, 2)  # the total, once tokenised
    out = capsys.readouterr().out
    assert "eval step 0/2: " in out and "eval step 2/2: " in out, out
    summary = assert_complete_run_dir(tmp_path / "run")
    assert summary["kind"] == kind and summary["algorithm"] == CONFIG_OF[kind]
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    train_rows = [r for r in rows if r["phase"] == "train"]
    eval_rows = [r for r in rows if r["phase"] == "eval"]
    assert [r["step"] for r in train_rows] == [1, 2] and [r["step"] for r in eval_rows] == [0, 1, 2]
    for key in [*TRAIN_KEYS[kind], "grad_norm", "learning_rate", "epoch"]:
        assert key in train_rows[-1], key
        assert not key.startswith("eval/")
    assert 0 < train_rows[-1]["mfu/step"] < 1  # trainers/core/flops.py
    for key in EVAL_KEYS[kind]:
        assert f"eval/{key}" in eval_rows[-1], key
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert len(samples) == 3 and all(s["step"] in (0, 1, 2) for s in samples)
    scorer = RewardScorer.from_pretrained(tmp_path / "run" / "final_model", device="cpu")
    assert scorer.kind == kind
    if kind == "prm":
        scores = scorer.score([{"problem": "1 + 1", "steps": ["1 + 1 = 2", "The answer is 2."]}])
    else:
        scores = scorer.score(CONVERSATIONS)
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)


def test_stop_then_resume_equals_straight_run(tmp_path, sigterm_at):
    """4 ORM steps straight == 2 steps, stop (the SIGTERM path), resume, 2 more."""
    common = [
        *QUICK,
        "data.dataset=builtin:reasoning-outcomes",
        "data.max_samples=12",
        "data.eval_size=4",
        "data.rollouts_per_prompt=3",
        "data.max_length=192",
        "train.max_steps=4",
        "eval.eval_every=2",
        "checkpoint.save_final_model=false",
    ]
    keys = ("loss", "accuracy", "grad_norm", "learning_rate", "eval/loss", "eval/auroc")
    assert_resume_equals_straight_run(
        lambda d, resume: run("orm", d, common, resume), tmp_path, sigterm_at, 2, keys, "step"
    )


test_bad_input_fails_before_writing = refused_before_writing_test(
    [
        ("preference", ["train.learning_rat=1"], "Did you mean: learning_rate"),
        ("orm", ["data.max_samples=lots"], "data.max_samples"),
        ("prm", ["data.num_labels=4"], "data.num_labels"),
        ("orm", ["kind=rm"], "'kind'"),
        ("orm", ["data.dataset=builtin:reasoning-steps"], "not an offline set for kind 'orm'"),
        ("prm", ["data.dataset=/no/such/prm.jsonl"], "file not found"),
        ("preference", ["data.max_samples=10", "data.eval_size=10"], "must be smaller"),
        ("orm", ["model.name=./no/such/model"], "model.name"),
    ],
    lambda run_dir, kind, overrides: run(kind, run_dir, [*QUICK, *overrides]),
)


# ---------------------------------------------------------------------------------------------
# Learning on tiny with the offline generators (fixed seeds)
# ---------------------------------------------------------------------------------------------

LEARN = [
    "model.name=tiny",
    "train.gradient_accumulation_steps=1",
    "train.schedule=linear",
    "train.warmup_ratio=0.1",
    "eval.eval_every=0",
    "eval.num_samples=1",
    "eval.eval_batch_size=32",
    "checkpoint.save_every=null",
    "checkpoint.save_final_model=false",
]


def final_eval(run_dir: Path) -> dict:
    summary = assert_complete_run_dir(run_dir)
    return summary["final_eval"]


@pytest.mark.slow
def test_preference_rm_learns_to_rank_held_out_pairs(tmp_path):
    overrides = [
        *LEARN,
        *PREFERENCES_TO_LEARN,
        "train.learning_rate=1.0e-3",
        "train.num_epochs=1",
    ]
    assert run("preference", tmp_path / "run", overrides) == 0
    final = final_eval(tmp_path / "run")
    assert final["eval/accuracy"] >= 0.7, final
    assert final["eval/reward_margin"] > 0.5, final
    assert final["eval/r_chosen_mean"] > final["eval/r_rejected_mean"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tokens", "epochs", "lr"),
    [("last", 1, "1.0e-3"), ("all", 3, "2.0e-3")],  # per-token BCE (the book's) learns slower
)
def test_orm_ranks_correct_completions_above_incorrect_ones(tmp_path, tokens, epochs, lr):
    overrides = [
        *LEARN,
        f"orm_loss_tokens={tokens}",
        "data.dataset=builtin:reasoning-outcomes",
        "data.max_samples=240",
        "data.eval_size=48",
        "data.rollouts_per_prompt=4",
        "data.max_length=192",
        "train.batch_size=16",
        f"train.learning_rate={lr}",
        f"train.num_epochs={epochs}",
    ]
    assert run("orm", tmp_path / "run", overrides) == 0
    final = final_eval(tmp_path / "run")
    assert final["eval/ranking_accuracy"] >= 0.7, final
    assert final["eval/auroc"] >= 0.7, final
    assert final["eval/top1_accuracy"] >= 0.65, final  # best-of-4 picks a correct one


@pytest.mark.slow
def test_prm_beats_the_majority_class_baseline_on_held_out_steps(tmp_path):
    overrides = [
        *LEARN,
        "data.dataset=builtin:reasoning-steps",
        "data.max_samples=896",
        "data.eval_size=128",
        "data.num_labels=2",  # neutral counts as not bad: only error detection beats the baseline
        'data.step_separator="\\n"',
        "data.max_length=160",
        "train.batch_size=32",
        "train.learning_rate=2.0e-3",
        "train.num_epochs=3",
    ]
    assert run("prm", tmp_path / "run", overrides) == 0
    final = final_eval(tmp_path / "run")
    assert final["eval/step_accuracy"] >= final["eval/majority_baseline"] + 0.05, final
    assert final["eval/first_error_accuracy"] > final["eval/first_error_baseline"], final
