"""Padding-free packing (trainers/core/seq_packing.py): the layout on hand cases, and per-token
log-probs and gradients equal to the padded layout on ``tiny`` and SmolLM2 (when pulled), for
every attention form the CPU runs (sdpa, eager, the FlexAttention BlockMask forward, the one-row
varlen layout); plus the prompt-sharing layout of the policy-gradient passes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_same_gradients

from tests._helpers.packing_models import model_names, trainable_model
from tests._helpers.threads import one_torch_thread  # noqa: F401  (autouse)
from trainers.core.logprobs import shared_prompt_hidden, split_rows
from trainers.core.seq_packing import (
    PackingUnsupported,
    Unit,
    attention_mask_for,
    block_causal_mask,
    check_packable,
    completion_states,
    first_fit_decreasing,
    pack_for,
    pack_sequences,
    pack_split_rows,
    pack_units,
    pack_values,
    packed_forward,
    padding_share,
    prompt_units,
    shared_prompt_cost,
    unpack,
)
from trainers.core.tokenization import right_pad

# very different lengths, one much longer than the rest, and a one-token sequence
SEQUENCES = [
    list(range(5, 13)),
    [40, 41],
    list(range(60, 90)),
    [7],
    list(range(100, 111)),
    [3, 4, 5],
]


class _Config:
    def __init__(self, attn: str) -> None:
        self._attn_implementation = attn


class _Decoder(torch.nn.Module):
    """Stands in for a decoder whose config names an attention implementation."""

    def __init__(self, attn: str) -> None:
        super().__init__()
        self.config = _Config(attn)


# ---------------------------------------------------------------------------------------------
# The layout
# ---------------------------------------------------------------------------------------------


def test_sequences_are_placed_first_fit_decreasing_with_restarting_positions():
    packed = pack_sequences([[1, 2, 3], [4], [5, 6]], pad_id=0)
    assert packed.width == 3  # the longest sequence: no row grows
    assert packed.input_ids.tolist() == [[1, 2, 3], [5, 6, 4]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert packed.segment_ids.tolist() == [[0, 0, 0], [2, 2, 1]]
    assert packed.seq_index.tolist() == [[0, 1, 2], [5, -1, -1], [3, 4, -1]]
    assert packed.n_tokens == 6
    mask = block_causal_mask(packed)[1, 0].int().tolist()
    assert mask == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]  # [4] sees only itself
    wide = pack_sequences([[1, 2, 3], [4], [5, 6]], pad_id=9, width=4)
    assert wide.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 9, 9]]
    assert block_causal_mask(wide)[1, 0, 3].int().tolist() == [0, 0, 0, 1]  # padding: itself


def test_first_fit_decreasing_is_deterministic_and_refuses_what_cannot_fit():
    assert first_fit_decreasing([2, 3, 2, 1, 3], 4) == [[1, 3], [4], [0, 2]]
    with pytest.raises(ValueError, match="does not fit"):
        first_fit_decreasing([5], 4)
    with pytest.raises(ValueError, match="non-empty prefix"):
        pack_units([Unit([])], pad_id=0)


def test_branches_share_their_prefix_and_never_see_each_other():
    packed = pack_units([Unit([1, 2], ([3, 4], [5])), Unit([6])], pad_id=0, width=6)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 0]]  # branch 2 restarts at 2
    assert packed.branch_ids.tolist() == [[0, 0, 1, 1, 2, 0]]
    assert packed.seq_index.tolist() == [[0, 1, 2, 3], [0, 1, 4, -1], [5, -1, -1, -1]]
    assert block_causal_mask(packed)[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],  # the second branch: the prefix and itself
        [0, 0, 0, 0, 0, 1],  # the next unit: only itself
    ]


def test_values_pack_and_outputs_unpack_in_the_input_order():
    packed = pack_sequences(SEQUENCES, pad_id=0)
    loss = pack_values(packed, [[i] * len(s) for i, s in enumerate(SEQUENCES)], fill=-1)
    assert sorted(loss[packed.segment_ids >= 0].tolist()) == sorted(
        i for i, s in enumerate(SEQUENCES) for _ in s
    )
    back = unpack(packed.input_ids.float().unsqueeze(-1), packed)[..., 0].long()
    want, _ = right_pad(SEQUENCES, 0)
    assert back.tolist() == want.tolist()
    with pytest.raises(ValueError, match="values"):
        pack_values(packed, [[1]] * len(SEQUENCES))


def test_attention_implementations_that_cannot_take_packed_rows_are_refused():
    assert check_packable(_Decoder("sdpa")) == "sdpa"
    with pytest.raises(PackingUnsupported, match="paged_attention.*sdpa, eager"):
        check_packable(_Decoder("paged_attention"))
    with pytest.raises(PackingUnsupported, match="share a prompt"):
        pack_for(_Decoder("flash_attention_2"), [Unit([1], ([2], [3]))], pad_id=0)
    # the varlen layout: every sequence in one row, no padding, no mask
    flat = pack_for(_Decoder("flash_attention_2"), [Unit(s) for s in SEQUENCES], pad_id=0)
    assert flat.n_rows == 1 and flat.n_tokens == flat.width == sum(map(len, SEQUENCES))
    assert attention_mask_for(_Decoder("flash_attention_2"), flat) is None


def test_padding_share_counts_token_slots_of_both_layouts():
    packed = pack_sequences(SEQUENCES, pad_id=0)
    assert packed.n_rows == 2  # [30], [11, 8, 3, 2, 1]
    share = padding_share([len(s) for s in SEQUENCES], packed.n_rows, packed.width)
    assert share == {
        "tokens": 55,
        "padded_slots": 6 * 30,
        "packed_slots": 2 * 30,
        "padded_padding_share": 1 - 55 / 180,
        "packed_padding_share": 1 - 55 / 60,
    }


# ---------------------------------------------------------------------------------------------
# Values and gradients against the padded layout
# ---------------------------------------------------------------------------------------------


def token_logps(model, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[:, t + 1]) from ``hidden[:, t]`` (N, L − 1), float32."""
    logits = model.get_output_embeddings()(hidden[:, :-1]).float()
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]


def padded_logps(model, sequences):
    ids, attn = right_pad(sequences, 0)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    return token_logps(model, hidden, ids), attn[:, 1:].bool()


def packed_logps(model, sequences, **layout):
    decoder = model.get_decoder()
    packed = pack_for(decoder, [Unit(s) for s in sequences], pad_id=0)
    for name, value in layout.items():  # a broken layout, for the tests that must catch it
        setattr(packed, name, value(packed))
    hidden = unpack(packed_forward(decoder, packed), packed)
    ids, _ = right_pad(sequences, 0)
    return token_logps(model, hidden, ids)


def params_of(model) -> list[torch.Tensor]:
    return list(model.get_decoder().parameters())[:6] + [model.get_output_embeddings().weight]


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "sequences",
    [SEQUENCES, SEQUENCES[2:3], [list(range(5, 60)), [7, 8], [9, 10, 11]]],
    ids=["mixed", "single", "one-long"],
)
def test_packed_log_probs_and_gradients_equal_the_padded_layout(name, attn, sequences):
    model = trainable_model(name, attn)
    want, valid = padded_logps(model, sequences)
    weights = torch.linspace(0.5, 2.0, valid.numel()).view(valid.shape) * valid
    want_grads = torch.autograd.grad((want * weights).sum(), params_of(model))
    got = packed_logps(model, sequences)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-4)
    assert_same_gradients(
        torch.autograd.grad((got * weights).sum(), params_of(model)), want_grads, rel=1e-4
    )


def test_the_comparison_catches_a_mask_that_leaks_across_sequences():
    """Every row one causal block: later sequences see earlier ones. (Rotary attention depends
    only on position differences, so under a correct mask positions that do not restart change
    nothing for plain sequences; they matter for branches and the varlen layout, tested
    there.)"""
    model = trainable_model("tiny")
    leak = {"segment_ids": lambda p: torch.where(p.segment_ids >= 0, 0, -1)}
    with torch.no_grad():
        want, valid = padded_logps(model, SEQUENCES)
        got = packed_logps(model, SEQUENCES, **leak)
    assert (got[valid] - want[valid]).abs().max() > 1e-3


def test_the_flex_attention_block_mask_equals_sdpa():
    """FlexAttention runs forward on the CPU (compiled); its backward is CUDA-only in torch, so
    the gradients of this path are left to the GPU bench."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    model = trainable_model("tiny", "flex_attention")
    reference = trainable_model("tiny", "sdpa")
    with torch.no_grad():
        want, valid = padded_logps(reference, SEQUENCES)
        got = packed_logps(model, SEQUENCES)
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", model_names())
def test_the_varlen_one_row_layout_equals_the_padded_layout(name):
    """The layout ``flash_attention_2`` reads (one row, positions restarting, no mask) run
    under ``sdpa``: transformers finds the sequences from the restarting positions, as its
    flash path does for ``cu_seqlens``. flash-attn itself needs CUDA (checked in the bench).
    Positions that do not restart make it one sequence: the comparison catches that."""
    model = trainable_model(name)
    want, valid = padded_logps(model, SEQUENCES)
    flat = pack_for(_Decoder("flash_attention_2"), [Unit(s) for s in SEQUENCES], pad_id=0)
    ids, _ = right_pad(SEQUENCES, 0)

    def logps(positions):
        out = model.get_decoder()(input_ids=flat.input_ids, position_ids=positions, use_cache=False)
        return token_logps(model, unpack(out.last_hidden_state, flat), ids)

    torch.testing.assert_close(logps(flat.position_ids)[valid], want[valid], rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        leaked = logps(torch.arange(flat.width)[None])
    assert (leaked[valid] - want[valid]).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# Rows that share a prompt (the policy-gradient passes)
# ---------------------------------------------------------------------------------------------

PROMPTS = [[5, 6, 7], [5, 6, 7], [9, 10], [5, 6, 7], [11, 12, 13, 14]]
COMPLETIONS = [[20, 21, 22, 23, 24, 25], [26], [27, 28], [29, 30, 31], [32]]


def test_prompt_units_hold_each_prompt_once_within_the_width():
    units, order = prompt_units(PROMPTS, COMPLETIONS, width=10)
    assert [(u.prefix, list(u.branches)) for u in units] == [
        ([5, 6, 7], [[20, 21, 22, 23, 24, 25], [26]]),  # 3 + 6 + 1 = 10
        ([5, 6, 7], [[29, 30, 31]]),  # would not fit beside the first two
        ([9, 10], [[27, 28]]),
        ([11, 12, 13, 14], [[32]]),
    ]
    assert order == [0, 1, 3, 2, 4]


@pytest.mark.parametrize("name", model_names())
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_completion_states_equal_the_shared_prompt_forward(name, attn):
    model = trainable_model(name, attn)
    decoder = model.get_decoder()
    ids, mask, _, width_p = split_rows(PROMPTS, COMPLETIONS, pad_id=0)
    want = shared_prompt_hidden(decoder, ids[:, :-1], mask[:, :-1], width_p)
    packed, index = pack_split_rows(decoder, ids, mask, width_p)  # not None: it pays here
    got = completion_states(decoder, packed, index)
    valid = torch.cat([mask[:, width_p - 1 : width_p], mask[:, width_p:-1]], dim=1).bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-5, atol=1e-4)
    assert bool((got[~valid] == 0).all())
    with torch.no_grad():  # the checks below must see a broken layout
        leaked = packed_completion_broken(decoder, packed, index, branch_ids=0)
        continued = packed_completion_broken(
            decoder,
            packed,
            index,
            position_ids=torch.arange(packed.width).expand_as(packed.input_ids),
        )
    for broken in (leaked, continued):
        assert (broken[valid] - want[valid]).abs().max() > 1e-3
    weights = torch.randn(want.shape, generator=torch.Generator().manual_seed(0)) * valid[..., None]
    want_grads = torch.autograd.grad((want * weights).sum(), params_of(model))
    assert_same_gradients(
        torch.autograd.grad((got * weights).sum(), params_of(model)), want_grads, rel=1e-4
    )


def packed_completion_broken(decoder, packed, index, **fields):
    """The completion states of a copy of ``packed`` with some of its per-token fields
    replaced: branch ids 0 (branches see each other) or positions that run on through the
    branches."""
    shape = packed.input_ids.shape
    broken = {name: torch.as_tensor(v).expand(shape).clone() for name, v in fields.items()}
    return completion_states(decoder, dataclasses.replace(packed, **broken), index)


def test_the_shared_prompt_forward_is_counted_as_it_runs():
    # 7 rows of 10 columns, 3 distinct prompts of width 6: the prompts once, then 7 x 4
    assert shared_prompt_cost(7, 3, 6, 10, full_rows=False) == (3 * 6 + 7 * 4, 3 * 36 + 7 * 40)
    assert shared_prompt_cost(7, 3, 6, 10, full_rows=True) == (70, 700)  # checkpointing
    assert shared_prompt_cost(7, 7, 6, 10, full_rows=False) == (70, 700)  # no prompt repeats


def test_rows_that_gain_nothing_from_packing_keep_the_shared_prompt_forward():
    decoder = trainable_model("tiny").get_decoder()
    same = split_rows([[1, 2], [3, 4]], [[5, 6], [7, 8]], pad_id=0)  # no padding to remove
    assert pack_split_rows(decoder, same[0], same[1], same[3]) is None
    holes = split_rows(PROMPTS, COMPLETIONS, pad_id=0)
    holes[1][0, holes[3] + 1] = 0  # a hole inside a completion: not this layout
    assert pack_split_rows(decoder, holes[0], holes[1], holes[3]) is None
    flash = _Decoder("flash_attention_2")
    assert pack_split_rows(flash, *split_rows(PROMPTS, COMPLETIONS, 0)[:2], 3) is None
