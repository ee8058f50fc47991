"""Preference pairs packed padding-free: several ``prompt + chosen + rejected`` per row, under a
block-diagonal attention mask.

A pair's chosen and rejected responses share their prompt. Laid out as two rows, the prompt runs
through the decoder twice (or once, with its KV cache gathered for both rows:
``trainers.core.logprobs.shared_prompt_hidden``), and each row is padded to the longest row of the
micro-batch. Packed, a pair is one segment ``[prompt | chosen | rejected]``:

* the attention mask lets the chosen tokens see the prompt and the chosen tokens before them
  (ordinary causal attention), and the rejected tokens see the prompt and the rejected tokens
  before them, never the chosen ones;
* the rejected tokens' position ids restart where the chosen ones started (``len(prompt)``), so
  rotary embeddings see the positions of the two-row layout.

Segments are then placed one after another in rows of a fixed width (default: the longest pair of
the micro-batch, so no row is longer than a one-pair row and there are never more rows), first-fit
decreasing by pair length (ties in input order, so the layout is deterministic). The mask is
block-diagonal over the segments of a row (no token of a pair sees another pair's) and each
segment's positions start again from 0, so a row of three pairs computes what three rows of one
pair would; only the row's tail is padding, and padding attends to itself alone.
``pairs_per_row=1`` gives one pair per row (the layout before several pairs shared a row).

Every hidden state is the one of the two-row forward (up to float rounding), the prompt runs once,
there is no cache to gather and padding is per row of pairs rather than per response; it also
holds under gradient checkpointing. It needs an attention implementation that takes a custom 4-D
mask (``sdpa`` and ``eager``); with any other (flash-attention 2) the callers keep the two-row
path. The mask is dense, (rows, 1, width, width): attention still computes the masked-out scores
of a row, so the saving is the padding, not the cross-pair products.

Sequence order everywhere: every pair's chosen response, then every pair's rejected response
(the order of ``collate_split`` and ``collate_pairs_split``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from trainers.core.logprobs import DEFAULT_CHUNK, hidden_to_logps
from trainers.core.seq_packing import first_fit_decreasing

PACKABLE_ATTENTION = ("sdpa", "eager")


def can_pack_pairs(decoder: torch.nn.Module) -> bool:
    """Whether ``decoder``'s attention accepts the block mask of packed pairs."""
    config = getattr(decoder, "config", None)
    return getattr(config, "_attn_implementation", None) in PACKABLE_ATTENTION


def pack_examples(
    examples: Sequence,
    pad_id: int,
    model: torch.nn.Module,
    *,
    width: int | None = None,
    pairs_per_row: int | None = None,
) -> PackedPairs | None:
    """Pack examples with ``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` (``pack_pairs``)
    when ``model``'s attention takes the block mask and every prompt and response has a token;
    else None (the caller keeps the two-row layout)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or not can_pack_pairs(decoder) or not examples:
        return None
    parts = [(ex.prompt_ids, ex.chosen_ids, ex.rejected_ids) for ex in examples]
    if any(not p or not c or not r for p, c, r in parts):
        return None
    return pack_pairs(*zip(*parts, strict=True), pad_id, width=width, pairs_per_row=pairs_per_row)


@dataclass
class PackedPairs:
    """A micro-batch of N pairs packed into R rows (see the module doc).

    ``last_rows`` / ``last`` (2N,): the row and column of each sequence's last token (chosen
    sequences, then rejected); ``target_rows`` / ``target_cols`` / ``labels`` / ``target_seq``:
    for every response token, the row and column whose hidden state predicts it, the token, and
    its sequence (0 … 2N − 1). ``n_tokens``: the non-pad tokens of the 2N sequences laid out apart
    (prompt counted twice), the count the two-row layout reports."""

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor
    last_rows: Tensor
    last: Tensor
    target_rows: Tensor
    target_cols: Tensor
    labels: Tensor
    target_seq: Tensor
    n_tokens: int

    @property
    def n_pairs(self) -> int:
        return self.last.shape[0] // 2

    @property
    def n_rows(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device | str) -> PackedPairs:
        return PackedPairs(
            *(getattr(self, f).to(device) for f in _TENSOR_FIELDS), n_tokens=self.n_tokens
        )


_TENSOR_FIELDS = (
    "input_ids",
    "position_ids",
    "attention_mask",
    "last_rows",
    "last",
    "target_rows",
    "target_cols",
    "labels",
    "target_seq",
)


def place_pairs(
    lengths: Sequence[int], width: int, pairs_per_row: int | None = None
) -> list[list[int]]:
    """Rows of pair indices: first-fit decreasing by length into rows of ``width`` tokens (ties
    in input order), at most ``pairs_per_row`` pairs a row (None: as many as fit)."""
    return first_fit_decreasing(lengths, width, pairs_per_row)


def pair_mask(p: int, c: int, r: int) -> Tensor:
    """The (L, L) mask of one pair ``[prompt | chosen | rejected]``: causal over prompt + chosen;
    each rejected token sees the prompt and the rejected tokens up to itself."""
    causal = torch.ones(p + c + r, p + c + r, dtype=torch.bool).tril()
    mask = torch.zeros_like(causal)
    mask[: p + c, : p + c] = causal[: p + c, : p + c]
    mask[p + c :, :p] = True
    mask[p + c :, p + c :] = causal[:r, :r]
    return mask


def pack_pairs(
    prompts: Sequence[list[int]],
    chosen: Sequence[list[int]],
    rejected: Sequence[list[int]],
    pad_id: int,
    *,
    width: int | None = None,
    pairs_per_row: int | None = None,
) -> PackedPairs:
    """Pack N (prompt, chosen, rejected) id lists into rows of ``width`` tokens (default: the
    longest pair), at most ``pairs_per_row`` pairs a row (default: as many as fit; 1: one pair
    per row). Every prompt and response needs at least one token."""
    n = len(prompts)
    if not (n == len(chosen) == len(rejected)) or n == 0:
        raise ValueError("pack_pairs needs as many prompts, chosen and rejected lists (>= 1)")
    lengths = [(len(p), len(c), len(r)) for p, c, r in zip(prompts, chosen, rejected, strict=True)]
    if any(min(t) < 1 for t in lengths):
        raise ValueError("every prompt and response of a packed pair needs at least one token")
    totals = [sum(t) for t in lengths]
    width = max(totals) if width is None else width
    if width < max(totals):
        raise ValueError(f"width {width} is shorter than the longest pair ({max(totals)} tokens)")
    if pairs_per_row is not None and pairs_per_row < 1:
        raise ValueError(f"pairs_per_row must be at least 1 (got {pairs_per_row})")
    rows = place_pairs(totals, width, pairs_per_row)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(len(rows), 1, 1, 1)  # padding: only itself
    last_rows, last = [0] * (2 * n), [0] * (2 * n)
    rows_of: list[int] = []
    cols: list[int] = []
    labels: list[int] = []
    seqs: list[int] = []
    for row, members in enumerate(rows):
        start = 0
        for i in members:
            (p, c, r), end = lengths[i], start + totals[i]
            ids[row, start:end] = torch.tensor([*prompts[i], *chosen[i], *rejected[i]])
            pos[row, start:end] = torch.cat([torch.arange(p + c), torch.arange(p, p + r)])
            mask[row, 0, start:end, start:end] = pair_mask(p, c, r)
            last_rows[i] = last_rows[n + i] = row
            last[i], last[n + i] = start + p + c - 1, end - 1
            # response token k is predicted by the hidden state just before it in its sequence
            for seq, before, tokens in (
                (i, range(p - 1, p + c - 1), chosen[i]),
                (n + i, [p - 1, *range(p + c, p + c + r - 1)], rejected[i]),
            ):
                rows_of += [row] * len(tokens)
                cols += [start + b for b in before]
                labels += tokens
                seqs += [seq] * len(tokens)
            start = end
    return PackedPairs(
        input_ids=ids,
        position_ids=pos,
        attention_mask=mask,
        last_rows=torch.tensor(last_rows),
        last=torch.tensor(last),
        target_rows=torch.tensor(rows_of),
        target_cols=torch.tensor(cols),
        labels=torch.tensor(labels),
        target_seq=torch.tensor(seqs),
        n_tokens=sum(2 * p + c + r for p, c, r in lengths),
    )


def packed_hidden(decoder: torch.nn.Module, packed: PackedPairs) -> Tensor:
    """The decoder's last hidden states of the packed rows (R, W, H). ``eager`` attention adds
    the mask to its scores, so it gets the additive form (0 / the dtype's minimum)."""
    mask = packed.attention_mask
    if getattr(decoder.config, "_attn_implementation", None) == "eager":
        dtype = decoder.get_input_embeddings().weight.dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min
        )
    out = decoder(
        input_ids=packed.input_ids,
        attention_mask=mask,
        position_ids=packed.position_ids,
        use_cache=False,
    )
    return out.last_hidden_state


def packed_response_logps(
    model: torch.nn.Module, packed: PackedPairs, chunk_size: int = DEFAULT_CHUNK
) -> tuple[Tensor, Tensor]:
    """Summed response log-probs and response lengths of the 2N sequences (chosen, then
    rejected), float32: what ``split_completion_logps`` gives for the two-row layout. Only the
    positions that predict a response token go through the LM head."""
    lm_head = model.get_output_embeddings()
    if not isinstance(lm_head, torch.nn.Linear):
        raise ValueError("packed_response_logps needs a linear LM head (get_output_embeddings)")
    hidden = packed_hidden(model.get_decoder(), packed)
    picked = hidden[packed.target_rows, packed.target_cols].unsqueeze(0)
    logps = hidden_to_logps(picked, lm_head, packed.labels.unsqueeze(0), chunk_size)[0]
    n_seq = 2 * packed.n_pairs
    sums = logps.new_zeros(n_seq).index_add(0, packed.target_seq, logps)
    counts = torch.bincount(packed.target_seq, minlength=n_seq).float()
    return sums, counts


def packed_last_hidden(decoder: torch.nn.Module, packed: PackedPairs) -> Tensor:
    """The hidden state at each sequence's last token (2N, H): chosen, then rejected."""
    hidden = packed_hidden(decoder, packed)
    return hidden[packed.last_rows, packed.last]
