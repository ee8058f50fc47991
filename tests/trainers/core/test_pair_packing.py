"""One row per preference pair (trainers/core/pair_packing.py): the layout on a hand case, and the
DPO log-probs and reward-model scores equal to the two-row path, values and gradients, for both
attention implementations that take the block mask; others keep the two-row path."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_gradients

from trainers.core.logprobs import split_completion_logps, split_rows
from trainers.core.models import load_causal_lm
from trainers.core.pair_packing import pack_examples, pack_pairs, packed_response_logps
from trainers.core.reward_model import build_reward_model
from trainers.direct_alignment.data import TokenizedExample
from trainers.reward_models.data import collate_pairs_split

EXAMPLES = [
    TokenizedExample(prompt_ids=[5, 6, 7, 8], chosen_ids=[20, 21, 22], rejected_ids=[23]),
    TokenizedExample(prompt_ids=[9, 10], chosen_ids=[24], rejected_ids=[25, 26, 27, 28]),
    TokenizedExample(prompt_ids=[11, 12, 13], chosen_ids=[29, 30], rejected_ids=[31, 32]),
]


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_pair_is_one_row_whose_rejected_tokens_never_see_the_chosen_ones():
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
    # chosen 3 and 4 are predicted by columns 1 and 2; rejected 5 by the prompt's last column
    assert packed.target_cols.tolist() == [1, 2, 1]
    assert packed.labels.tolist() == [3, 4, 5]
    assert packed.target_seq.tolist() == [0, 0, 1]
    assert packed.n_tokens == 2 + 2 + 2 + 1  # as two rows: prompt + chosen, prompt + rejected
    short = pack_pairs([[1], [2, 3, 4]], [[5], [6]], [[7], [8]], pad_id=0)
    assert short.input_ids.tolist() == [[1, 5, 7, 0, 0], [2, 3, 4, 6, 8]]
    assert short.attention_mask[0, 0, 3].int().tolist() == [0, 0, 0, 1, 0]  # padding: itself
    with pytest.raises(ValueError, match="at least one token"):
        pack_pairs([[1]], [[]], [[2]], pad_id=0)


def two_row_logps(model, examples):
    prompts = [e.prompt_ids for e in examples] * 2
    responses = [e.chosen_ids for e in examples] + [e.rejected_ids for e in examples]
    ids, attn, completion, width = split_rows(prompts, responses, pad_id=0)
    return split_completion_logps(model, ids, attn, width, completion)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_log_probs_equal_the_two_row_path(attn):
    torch.manual_seed(3)
    model = load_causal_lm("tiny", device="cpu", attn_implementation=attn, trainable=True)
    params = list(model.get_decoder().parameters())[:4] + [model.get_output_embeddings().weight]
    weights = torch.arange(1.0, 7.0)
    want, want_n = two_row_logps(model, EXAMPLES)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    packed = pack_examples(EXAMPLES, 0, model)
    assert packed is not None and packed.n_pairs == 3
    got, got_n = packed_response_logps(model, packed)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert got_n.tolist() == want_n.tolist() == [3, 1, 2, 1, 4, 2]
    assert_same_gradients(torch.autograd.grad((got * weights).sum(), params), want_grads)


def test_packed_reward_scores_equal_the_two_row_path():
    torch.manual_seed(5)
    model = build_reward_model("tiny", "preference", device="cpu")
    with torch.no_grad():
        model.head.weight.normal_(0, 0.5)
    params = [model.head.weight, *list(model.backbone.get_decoder().parameters())[:3]]
    split = collate_pairs_split(EXAMPLES, pad_id=0)
    want = model.split_sequence_scores(
        split["input_ids"], split["attention_mask"], split["prompt_width"]
    )
    want_grads = torch.autograd.grad((want * torch.arange(1.0, 7.0)).sum(), params)
    packed = pack_examples(EXAMPLES, 0, model.backbone)
    got = model.packed_pair_scores(packed)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert packed.n_tokens == int(split["attention_mask"].sum())
    got_grads = torch.autograd.grad((got * torch.arange(1.0, 7.0)).sum(), params)
    assert_same_gradients(got_grads, want_grads)


def test_attention_without_a_custom_mask_and_incomplete_pairs_keep_the_two_row_path():
    model = load_causal_lm("tiny", device="cpu")
    assert pack_examples(EXAMPLES, 0, model) is not None
    model.get_decoder().config._attn_implementation = "flash_attention_2"
    assert pack_examples(EXAMPLES, 0, model) is None
    model.get_decoder().config._attn_implementation = "sdpa"
    unpaired = [TokenizedExample(prompt_ids=[1, 2], chosen_ids=[3], rejected_ids=None)]
    assert pack_examples(unpaired, 0, model) is None
