"""Preference pairs packed padding-free (trainers/core/pair_packing.py): the layout on hand cases
(one pair a row, several pairs a row, first-fit decreasing placement), and the DPO log-probs, the
DPO loss and the reward-model scores of the packed layout equal to one pair per row and to the
two-row layout, values and gradients, for both attention implementations that take the block
mask, on `tiny` and on SmolLM2-135M-Instruct when it is pulled. A leak between pairs or positions
that do not restart change the numbers (so the equality tests can fail); attention without a
custom mask and incomplete pairs keep the two-row path."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from conftest import assert_same_gradients

from tests._helpers.paths import SMOLLM2_DIR
from trainers.core.logprobs import split_completion_logps, split_rows
from trainers.core.models import load_causal_lm
from trainers.core.pair_packing import (
    pack_examples,
    pack_pairs,
    packed_response_logps,
    place_pairs,
)
from trainers.core.reward_model import build_reward_model
from trainers.core.training import use_gradient_checkpointing
from trainers.direct_alignment.config import DirectAlignmentConfig
from trainers.direct_alignment.data import TokenizedExample
from trainers.direct_alignment.losses import LOSSES, LossInputs
from trainers.direct_alignment.pairs import batch_logps, loss_params, micro_batch_loss
from trainers.reward_models.data import collate_pairs_split

EXAMPLES = [
    TokenizedExample(prompt_ids=[5, 6, 7, 8], chosen_ids=[20, 21, 22], rejected_ids=[23]),
    TokenizedExample(prompt_ids=[9, 10], chosen_ids=[24], rejected_ids=[25, 26, 27, 28]),
    TokenizedExample(prompt_ids=[11, 12, 13], chosen_ids=[29, 30], rejected_ids=[31, 32]),
]


def random_pairs(sizes: list[tuple[int, int, int]], seed: int) -> list[TokenizedExample]:
    """Pairs of the given (prompt, chosen, rejected) lengths, random ids (never the pad id 0)."""
    rng = random.Random(seed)

    def ids(k: int) -> list[int]:
        return [rng.randrange(3, 2000) for _ in range(k)]

    return [TokenizedExample(ids(p), ids(c), ids(r)) for p, c, r in sizes]


# eight short pairs (4-6 tokens) around one of 24 (pair 4): rows [24], [6, 6, 5, 5], [4, 4, 4, 4]
SHORT = [(2, 1, 1), (2, 2, 1), (2, 2, 2), (2, 1, 1)]
SHORT_AND_LONG = random_pairs([*SHORT, (10, 8, 6), *SHORT], seed=1)
SETS = {
    "mixed": EXAMPLES,
    "single": random_pairs([(5, 3, 4)], seed=2),
    "eight_short_one_long": SHORT_AND_LONG,
    "very_different": random_pairs([(1, 1, 1), (30, 12, 20), (3, 1, 2), (2, 25, 1)], seed=3),
}


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------
# The layout
# ---------------------------------------------------------------------------------------------


def test_a_pair_is_one_segment_whose_rejected_tokens_never_see_the_chosen_ones():
    packed = pack_pairs([[1, 2]], [[3, 4]], [[5]], pad_id=0)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]  # rejected restarts after the prompt
    mask = packed.attention_mask[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # the rejected token: the prompt and itself
    ]
    assert packed.last.tolist() == [3, 4]  # chosen ends at column 3, rejected at 4
    assert packed.last_rows.tolist() == [0, 0]
    # chosen 3 and 4 are predicted by columns 1 and 2; rejected 5 by the prompt's last column
    assert packed.target_cols.tolist() == [1, 2, 1]
    assert packed.labels.tolist() == [3, 4, 5]
    assert packed.target_seq.tolist() == [0, 0, 1]
    assert packed.n_tokens == 2 + 2 + 2 + 1  # as two rows: prompt + chosen, prompt + rejected
    short = pack_pairs([[1], [2, 3, 4]], [[5], [6]], [[7], [8]], pad_id=0, pairs_per_row=1)
    assert short.input_ids.tolist() == [[2, 3, 4, 6, 8], [1, 5, 7, 0, 0]]  # longest first
    assert short.attention_mask[1, 0, 3].int().tolist() == [0, 0, 0, 1, 0]  # padding: itself
    assert short.last_rows.tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="at least one token"):
        pack_pairs([[1]], [[]], [[2]], pad_id=0)


def test_pairs_share_a_row_block_diagonally_with_positions_restarting_per_pair():
    # A has 6 tokens, B and C 3 each: the width is 6, A fills row 0, B and C share row 1
    packed = pack_pairs([[1, 2, 3, 4], [7], [10]], [[5], [8], [11]], [[6], [9], [12]], pad_id=0)
    assert packed.n_pairs == 3 and packed.n_rows == 2
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 4], [0, 1, 1, 0, 1, 1]]
    assert packed.attention_mask[1, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],  # B's rejected: B's prompt and itself
        [0, 0, 0, 1, 0, 0],  # C never sees B
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 0, 1],
    ]
    # sequences: chosen A, B, C, then rejected A, B, C
    assert packed.last_rows.tolist() == [0, 1, 1, 0, 1, 1]
    assert packed.last.tolist() == [4, 1, 4, 5, 2, 5]
    assert packed.target_rows.tolist() == [0, 0, 1, 1, 1, 1]
    assert packed.target_cols.tolist() == [3, 3, 0, 0, 3, 3]
    assert packed.labels.tolist() == [5, 6, 8, 9, 11, 12]
    assert packed.target_seq.tolist() == [0, 3, 1, 4, 2, 5]
    assert packed.n_tokens == (4 + 1) * 2 + (1 + 1) * 4
    wide = pack_pairs([[1, 2, 3, 4], [7]], [[5], [8]], [[6], [9]], pad_id=0, width=10)
    assert wide.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]]


def test_first_fit_decreasing_places_pairs_deterministically():
    assert place_pairs([5, 4, 3, 2, 1], width=5) == [[0], [1, 4], [2, 3]]
    assert place_pairs([3, 6, 3], width=6) == [[1], [0, 2]]
    assert place_pairs([3, 6, 3], width=6, pairs_per_row=1) == [[1], [0], [2]]
    assert place_pairs([2, 2, 2, 2], width=8, pairs_per_row=3) == [[0, 1, 2], [3]]
    with pytest.raises(ValueError, match="shorter than the longest pair"):
        pack_pairs([[1, 2]], [[3]], [[4]], pad_id=0, width=3)
    with pytest.raises(ValueError, match="pairs_per_row must be at least 1"):
        pack_pairs([[1, 2]], [[3]], [[4]], pad_id=0, pairs_per_row=0)


def test_eight_short_pairs_and_a_long_one_take_fewer_rows_of_the_same_width():
    model = load_causal_lm("tiny", device="cpu")
    many = pack_examples(SHORT_AND_LONG, 0, model)
    one = pack_examples(SHORT_AND_LONG, 0, model, pairs_per_row=1)
    assert one.n_rows == 9 and many.n_rows == 3
    assert many.input_ids.shape[1] == one.input_ids.shape[1] == 24
    assert int((many.input_ids == 0).sum()) == 3 * 24 - 24 - 38  # 10 pads instead of 154
    assert int((one.input_ids == 0).sum()) == 9 * 24 - 24 - 38
    assert many.n_tokens == one.n_tokens


# ---------------------------------------------------------------------------------------------
# The numbers: packed pairs against one pair per row and two rows a pair
# ---------------------------------------------------------------------------------------------


def two_row_logps(model, examples):
    prompts = [e.prompt_ids for e in examples] * 2
    responses = [e.chosen_ids for e in examples] + [e.rejected_ids for e in examples]
    ids, attn, completion, width = split_rows(prompts, responses, pad_id=0)
    return split_completion_logps(model, ids, attn, width, completion)


def some_params(model):
    return [*list(model.get_decoder().parameters())[:4], model.get_output_embeddings().weight]


def check_log_probs_of_every_layout(model, examples, atol=1e-4):
    """Packed (several pairs a row) and one pair per row give the two-row log-probs, lengths and
    gradients of a weighted sum."""
    weights = torch.arange(1.0, 2 * len(examples) + 1)
    params = some_params(model)
    want, want_n = two_row_logps(model, examples)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    for pairs_per_row in (None, 1):
        packed = pack_examples(examples, 0, model, pairs_per_row=pairs_per_row)
        got, got_n = packed_response_logps(model, packed)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=atol)
        assert got_n.tolist() == want_n.tolist()
        assert_same_gradients(torch.autograd.grad((got * weights).sum(), params), want_grads)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("name", list(SETS))
def test_packed_log_probs_equal_one_pair_per_row_and_the_two_row_path(attn, name):
    torch.manual_seed(3)
    model = load_causal_lm("tiny", device="cpu", attn_implementation=attn, trainable=True)
    check_log_probs_of_every_layout(model, SETS[name])


def test_packed_log_probs_hold_under_gradient_checkpointing():
    torch.manual_seed(3)
    model = load_causal_lm("tiny", device="cpu", trainable=True)
    use_gradient_checkpointing(model, True)
    model.train()
    assert model.get_decoder().gradient_checkpointing
    check_log_probs_of_every_layout(model, SETS["very_different"])


def moved_log_probs(model, packed, **wrong) -> torch.Tensor:
    """How far each sequence's log-prob moves when ``packed`` gets the ``wrong`` fields."""
    with torch.no_grad():
        base, _ = packed_response_logps(model, packed)
        got, _ = packed_response_logps(model, dataclasses.replace(packed, **wrong))
    return (got - base).abs()


def test_a_leak_between_pairs_or_a_rejected_response_not_restarting_changes_the_log_probs():
    """The equality tests can fail. Letting the second pair of a row see the first moves the
    second pair's log-probs far beyond the tolerance; so do rejected positions that run on after
    the chosen ones instead of restarting after the prompt; every other sequence stays put. (Each
    pair's positions starting again from 0 is pinned by the layout tests above: with rotary
    embeddings a whole pair shifted by a constant gives the same numbers up to rounding.)"""
    torch.manual_seed(3)
    model = load_causal_lm("tiny", device="cpu", trainable=False)
    packed = pack_examples(SHORT_AND_LONG, 0, model)
    n = packed.n_pairs
    first, second = 2, 7  # pairs 2 and 7 (2 + 2 + 2 tokens) open row 1: columns 0-5 and 6-11
    assert packed.last_rows[first] == packed.last_rows[second] == 1
    assert packed.last[first] < 6 <= packed.last[second] < 12
    leaky = packed.attention_mask.clone()
    leaky[1, 0, 6:12, :6] = True
    moved = moved_log_probs(model, packed, attention_mask=leaky)
    assert moved[[second, n + second]].min() > 1e-2
    assert moved[[i for i in range(2 * n) if i not in (second, n + second)]].max() < 1e-6

    packed = pack_examples(SETS["very_different"], 0, model)
    n = packed.n_pairs
    assert packed.last_rows.tolist().count(0) == 2  # pair 1 (30 + 12 + 20 tokens) is row 0
    assert packed.position_ids[0, 42:62].tolist() == list(range(30, 50))
    running = packed.position_ids.clone()
    running[0, 42:62] += 12
    moved = moved_log_probs(model, packed, position_ids=running)
    assert moved[n + 1] > 1e-2
    assert moved[[i for i in range(2 * n) if i != n + 1]].max() < 1e-6


def test_dpo_loss_and_gradients_of_packed_pairs_equal_the_two_row_layout():
    torch.manual_seed(4)
    model = load_causal_lm("tiny", device="cpu", trainable=True)
    examples, n = SHORT_AND_LONG, len(SHORT_AND_LONG)
    cfg = DirectAlignmentConfig(loss="dpo", beta=0.5, model={"name": "tiny"})
    gen = torch.Generator().manual_seed(0)
    ref = {k: torch.randn(n, generator=gen) * 3 - 30 for k in ("chosen", "rejected")}
    params = some_params(model)
    assert pack_examples(examples, 0, model).n_rows == 3  # the step below packs
    loss, metrics, n_tokens = micro_batch_loss(
        cfg, model, examples, list(range(n)), ref, 0, torch.device("cpu")
    )
    grads = torch.autograd.grad(loss, params)
    logps, counts = two_row_logps(model, examples)
    inputs = LossInputs(
        chosen_logps=logps[:n],
        rejected_logps=logps[n:],
        chosen_tokens=counts[:n],
        rejected_tokens=counts[n:],
        ref_chosen_logps=ref["chosen"],
        ref_rejected_logps=ref["rejected"],
    )
    want, want_metrics = LOSSES["dpo"](inputs, loss_params(cfg))
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert_same_gradients(grads, torch.autograd.grad(want, params))
    assert metrics.keys() == want_metrics.keys()
    for key, value in want_metrics.items():
        assert float(metrics[key]) == pytest.approx(float(value), rel=1e-4, abs=1e-5), key
    assert n_tokens == sum(
        2 * len(e.prompt_ids) + len(e.chosen_ids) + len(e.rejected_ids) for e in examples
    )


def check_reward_scores_of_every_layout(model, examples):
    weights = torch.arange(1.0, 2 * len(examples) + 1)
    params = [model.head.weight, *list(model.backbone.get_decoder().parameters())[:3]]
    split = collate_pairs_split(examples, pad_id=0)
    want = model.split_sequence_scores(
        split["input_ids"], split["attention_mask"], split["prompt_width"]
    )
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    for pairs_per_row in (None, 1):
        packed = pack_examples(examples, 0, model.backbone, pairs_per_row=pairs_per_row)
        got = model.packed_pair_scores(packed)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert packed.n_tokens == int(split["attention_mask"].sum())
        got_grads = torch.autograd.grad((got * weights).sum(), params)
        assert_same_gradients(got_grads, want_grads)


@pytest.mark.parametrize("name", list(SETS))
def test_packed_reward_scores_equal_one_pair_per_row_and_the_two_row_path(name):
    torch.manual_seed(5)
    model = build_reward_model("tiny", "preference", device="cpu")
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)
    check_reward_scores_of_every_layout(model, SETS[name])


@pytest.mark.slow
@pytest.mark.skipif(
    not (SMOLLM2_DIR / "config.json").is_file(),
    reason="smollm2-135m-instruct not pulled (rlhf-lab models pull smollm2-135m-instruct)",
)
def test_smollm2_packed_pairs_equal_one_pair_per_row_and_the_two_row_path():
    examples = SETS["eight_short_one_long"]
    model = load_causal_lm(str(SMOLLM2_DIR), device="cpu", dtype="fp32", trainable=True)
    check_log_probs_of_every_layout(model, examples, atol=1e-3)
    del model
    torch.manual_seed(6)
    rm = build_reward_model(str(SMOLLM2_DIR), "preference", device="cpu")
    check_reward_scores_of_every_layout(rm, examples)


# ---------------------------------------------------------------------------------------------
# Where packing does not apply
# ---------------------------------------------------------------------------------------------


def test_attention_without_a_custom_mask_and_incomplete_pairs_keep_the_two_row_path():
    model = load_causal_lm("tiny", device="cpu")
    assert pack_examples(EXAMPLES, 0, model) is not None
    model.get_decoder().config._attn_implementation = "flash_attention_2"
    assert pack_examples(EXAMPLES, 0, model) is None
    model.get_decoder().config._attn_implementation = "sdpa"
    unpaired = [TokenizedExample(prompt_ids=[1, 2], chosen_ids=[3], rejected_ids=None)]
    assert pack_examples(unpaired, 0, model) is None
    for empty in (
        TokenizedExample(prompt_ids=[], chosen_ids=[3, 4], rejected_ids=[5]),
        TokenizedExample(prompt_ids=[1, 2], chosen_ids=[3], rejected_ids=[]),
    ):
        assert pack_examples([*EXAMPLES, empty], 0, model) is None


def test_a_micro_batch_with_an_empty_response_is_scored_on_two_rows():
    torch.manual_seed(7)
    model = load_causal_lm("tiny", device="cpu", trainable=False)
    examples = [*EXAMPLES, TokenizedExample(prompt_ids=[14, 15], chosen_ids=[33], rejected_ids=[])]
    n = len(examples)
    with torch.no_grad():
        parts, n_tokens = batch_logps(model, examples, 0, torch.device("cpu"), with_kl=False)
        want, want_n = two_row_logps(model, examples)
    torch.testing.assert_close(parts["chosen"][0], want[:n], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(parts["rejected"][0], want[n:], rtol=1e-5, atol=1e-4)
    assert parts["rejected"][1].tolist() == want_n[n:].tolist() == [1, 4, 2, 0]
