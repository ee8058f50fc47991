"""Padding-free packing: several sequences per row, each attending only to itself.

A micro-batch laid out one sequence per row is padded to its longest row; with lengths that
vary a lot, much of the decoder's work is on padding. Packed, the sequences are placed one after
another in rows of width ``W`` (by default the longest sequence of the micro-batch, so no row is
wider than the padded layout's), and the rows are fewer:

* **units.** What is placed is a *unit*: a ``prefix`` followed by zero or more ``branches``. A
  plain sequence (an SFT conversation) is a unit with no branch. A prompt with the completions
  that share it (a GRPO group, or the rows of one prompt in a micro-batch) is a unit whose
  prefix is the prompt and whose branches are the completions, laid out
  ``[prompt | completion 1 | completion 2 | ...]``: the prompt runs once, as in
  ``trainers.core.logprobs.shared_prompt_hidden``. A unit's *sequences* are its prefix alone (no
  branch) or the prefix followed by each branch: the rows of the padded layout.
* **placement.** First-fit decreasing over the unit lengths (longest first, ties in input order;
  each unit goes to the first row with room, else a new row): deterministic, and a unit never
  spans two rows. The rest of each row is padding.
* **per token.** ``segment_ids``: the unit (0, 1, … over the micro-batch; −1 on padding);
  ``branch_ids``: 0 on a prefix, ``k`` on the unit's ``k``-th branch (1, 2, …);
  ``position_ids``: 0 … at each unit's start, and each branch continues from the end of the
  prefix (``len(prefix)``), as its row would in the padded layout, so rotary embeddings see the
  same positions.
* **attention.** Query ``q`` sees key ``k`` when both are in the same unit, ``k`` is not after
  ``q``, and ``k`` is in the prefix or in ``q``'s branch; padding sees only itself, so no query
  row is empty (the case the CUDA ``sdpa`` kernels disagree on). The same rule takes the form
  the model's attention implementation reads (:func:`attention_mask_for`): a 4-D boolean mask
  ``(rows, 1, W, W)`` for ``sdpa``, its additive form for ``eager``, a FlexAttention
  ``BlockMask`` built from the same rule for ``flex_attention``, and for ``flash_attention_2``
  no mask at all: every sequence in one row without padding, position ids restarting at each
  sequence, which transformers' flash path turns into ``cu_seqlens`` for
  ``flash_attn_varlen_func`` (only units without branches: a varlen kernel cannot share a
  prompt between branches). Any other implementation is refused (:class:`PackingUnsupported`);
  callers keep their padded path then. (On the CPU, torch runs FlexAttention forward only: its
  backward needs CUDA. transformers returns a 4-D mask or ``BlockMask`` given as
  ``attention_mask`` unchanged.)
* **unpack.** ``seq_index`` (sequences, longest sequence) holds, for every token of every
  sequence in input order, its flat position ``row · W + column`` in the packed rows (−1 past
  the sequence's end); :func:`unpack` turns any per-position output (hidden states, log-probs)
  back into per-sequence rows, zero past each end.

Every hidden state of a real token is then the one of the padded layout (up to float rounding),
and so are the values and gradients of anything computed from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

PACKED_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2")
"""Attention implementations that take a packed layout (the module doc says in which form)."""

VARLEN_ATTENTION = "flash_attention_2"


class PackingUnsupported(ValueError):
    """The model's attention implementation cannot take a packed layout."""


@dataclass(frozen=True)
class Unit:
    """A prefix and the branches that share it (none: the prefix is one plain sequence)."""

    prefix: list[int]
    branches: tuple[list[int], ...] = ()

    @property
    def length(self) -> int:
        return len(self.prefix) + sum(len(b) for b in self.branches)

    @property
    def n_sequences(self) -> int:
        return max(1, len(self.branches))


@dataclass
class PackedRows:
    """Units packed into rows (see the module doc). ``seq_index`` (N, L): flat positions
    ``row · W + column`` of each sequence's tokens, −1 past its end; ``seq_lengths`` (N,)."""

    input_ids: Tensor
    position_ids: Tensor
    segment_ids: Tensor
    branch_ids: Tensor
    seq_index: Tensor
    seq_lengths: Tensor

    def to(self, device: torch.device | str) -> PackedRows:
        return PackedRows(*(getattr(self, f).to(device) for f in _TENSOR_FIELDS))

    @property
    def n_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    @property
    def has_branches(self) -> bool:
        return bool((self.branch_ids > 0).any())

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens in the rows."""
        return int((self.segment_ids >= 0).sum())


_TENSOR_FIELDS = (
    "input_ids",
    "position_ids",
    "segment_ids",
    "branch_ids",
    "seq_index",
    "seq_lengths",
)


def first_fit_decreasing(
    lengths: Sequence[int], width: int, per_row: int | None = None
) -> list[list[int]]:
    """Place items of ``lengths`` (each <= ``width``) into rows of ``width``: longest first
    (ties in input order), each into the first row with room (and fewer than ``per_row`` items,
    when given), else a new row. Returns each row's item indices in placement order."""
    if any(n > width for n in lengths):
        raise ValueError(f"an item of {max(lengths)} tokens does not fit a row of {width}")
    cap = len(lengths) if per_row is None else per_row
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fits = (r for r, free in enumerate(room) if free >= lengths[i] and len(rows[r]) < cap)
        slot = next(fits, None)
        if slot is None:
            rows.append([])
            room.append(width)
            slot = len(rows) - 1
        rows[slot].append(i)
        room[slot] -= lengths[i]
    return rows


def pack_units(units: Sequence[Unit], pad_id: int, width: int | None = None) -> PackedRows:
    """Pack ``units`` into rows of ``width`` tokens (default: the longest unit); sequences of
    :attr:`PackedRows.seq_index` follow the units' order, each unit's branches in order."""
    if not units or any(not u.prefix for u in units):
        raise ValueError("pack_units needs at least one unit, each with a non-empty prefix")
    lengths = [u.length for u in units]
    width = max(lengths) if width is None else width
    placement = first_fit_decreasing(lengths, width)
    shape = (len(placement), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    seg = torch.full(shape, -1, dtype=torch.long)
    branch = torch.zeros(shape, dtype=torch.long)
    starts = [0] * len(units)
    for r, members in enumerate(placement):
        col = 0
        for u in members:
            starts[u] = r * width + col
            tokens = [*units[u].prefix, *(t for b in units[u].branches for t in b)]
            ids[r, col : col + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            seg[r, col : col + len(tokens)] = u
            p = len(units[u].prefix)
            pos[r, col : col + p] = torch.arange(p)
            col += p
            for k, b in enumerate(units[u].branches, start=1):
                pos[r, col : col + len(b)] = torch.arange(p, p + len(b))
                branch[r, col : col + len(b)] = k
                col += len(b)
    flat = [_sequence_positions(unit, start) for unit, start in zip(units, starts, strict=True)]
    sequences = [s for per_unit in flat for s in per_unit]
    longest = max(len(s) for s in sequences)
    index = torch.full((len(sequences), longest), -1, dtype=torch.long)
    for i, s in enumerate(sequences):
        index[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return PackedRows(
        input_ids=ids,
        position_ids=pos,
        segment_ids=seg,
        branch_ids=branch,
        seq_index=index,
        seq_lengths=torch.tensor([len(s) for s in sequences], dtype=torch.long),
    )


def _sequence_positions(unit: Unit, start: int) -> list[list[int]]:
    """Flat positions of each of ``unit``'s sequences, the unit starting at ``start``."""
    prefix = list(range(start, start + len(unit.prefix)))
    if not unit.branches:
        return [prefix]
    out, col = [], start + len(unit.prefix)
    for b in unit.branches:
        out.append(prefix + list(range(col, col + len(b))))
        col += len(b)
    return out


def pack_sequences(
    sequences: Sequence[list[int]], pad_id: int, width: int | None = None
) -> PackedRows:
    """Pack plain sequences (units without branches) into rows of ``width`` (default: the
    longest sequence)."""
    return pack_units([Unit(list(s)) for s in sequences], pad_id, width)


def pack_values(packed: PackedRows, values: Sequence[list[int]], fill: int = 0) -> Tensor:
    """Per-token integers of each sequence (a loss mask, labels) laid out as ``packed``'s rows
    (R, W) long, ``fill`` on padding. A shared prefix takes its last sequence's values."""
    out = torch.full((packed.n_rows * packed.width,), fill, dtype=torch.long)
    for i, v in enumerate(values):
        n = int(packed.seq_lengths[i])
        if len(v) != n:
            raise ValueError(f"sequence {i} has {n} tokens but {len(v)} values")
        out[packed.seq_index[i, :n]] = torch.tensor(v, dtype=torch.long)
    return out.view(packed.n_rows, packed.width)


def unpack(values: Tensor, packed: PackedRows) -> Tensor:
    """Per-position outputs of the packed rows (R, W, ...) as per-sequence rows (N, L, ...) in
    the input order, zero past each sequence's end (differentiable)."""
    return take(values, packed.seq_index)


def take(values: Tensor, index: Tensor) -> Tensor:
    """``values`` (R, W, ...) at flat positions ``index`` (any shape; −1: zero there),
    differentiable."""
    flat = values.reshape(values.shape[0] * values.shape[1], *values.shape[2:])
    index = index.to(values.device)
    picked = flat[index.clamp(min=0)]
    keep = (index >= 0).view(*index.shape, *([1] * (picked.dim() - index.dim())))
    return picked * keep.to(picked.dtype)


def sequence_positions(packed: PackedRows, starts: Tensor, count: int) -> Tensor:
    """Flat positions of tokens ``starts[i] … starts[i] + count − 1`` of each sequence ``i``
    (N, count), −1 where a sequence has no such token (before its start or past its end)."""
    cols = starts[:, None] + torch.arange(count)
    inside = (cols >= 0) & (cols < packed.seq_lengths[:, None])
    index = packed.seq_index.gather(1, cols.clamp(0, packed.seq_index.shape[1] - 1))
    return torch.where(inside, index, -1)


# ---------------------------------------------------------------------------------------------
# The attention rule, in the form each implementation reads
# ---------------------------------------------------------------------------------------------


def attention_of(module: torch.nn.Module) -> str | None:
    """The attention implementation ``module`` (a decoder or causal LM) runs."""
    return getattr(getattr(module, "config", None), "_attn_implementation", None)


def check_packable(module: torch.nn.Module, has_branches: bool = False) -> str:
    """The attention implementation of ``module`` when it takes a packed layout (with branches:
    not the varlen one), else :class:`PackingUnsupported` naming the ones that do."""
    impl = attention_of(module)
    allowed = [a for a in PACKED_ATTENTION if not (has_branches and a == VARLEN_ATTENTION)]
    if impl not in allowed:
        raise PackingUnsupported(
            f"attention implementation {impl!r} cannot take packed rows"
            f"{' that share a prompt' if has_branches else ''}; packing works with "
            f"{', '.join(allowed)} (set model.attn_implementation, or turn packing off)"
        )
    return impl


def visible(seg_q: Tensor, seg_k: Tensor, br_q: Tensor, br_k: Tensor, q: Tensor, k: Tensor):
    """The attention rule on (broadcast) indices: same unit, key not after the query, key in the
    prefix or in the query's branch; or the key is the query itself (padding sees itself)."""
    same = (seg_q == seg_k) & (seg_k >= 0) & (k <= q) & ((br_k == 0) | (br_k == br_q))
    return same | (q == k)


def block_causal_mask(packed: PackedRows) -> Tensor:
    """The rule as a boolean mask (R, 1, W, W), True where the query may attend."""
    seg, br = packed.segment_ids, packed.branch_ids
    cols = torch.arange(packed.width, device=seg.device)
    mask = visible(
        seg[:, :, None], seg[:, None, :], br[:, :, None], br[:, None, :], cols[:, None], cols
    )
    return mask[:, None]


def flex_block_mask(packed: PackedRows):
    """The rule as a FlexAttention ``BlockMask`` (``create_block_mask`` over a ``mask_mod``
    that reads the segment and branch ids); blocks with no visible pair are skipped."""
    from torch.nn.attention.flex_attention import create_block_mask

    seg, br = packed.segment_ids, packed.branch_ids

    def mask_mod(b, h, q, k):
        return visible(seg[b, q], seg[b, k], br[b, q], br[b, k], q, k)

    w = packed.width
    return create_block_mask(mask_mod, packed.n_rows, None, w, w, device=seg.device)


def attention_mask_for(module: torch.nn.Module, packed: PackedRows, dtype=None):
    """The mask ``module``'s attention reads for ``packed``: boolean 4-D (``sdpa``), additive
    4-D in ``dtype`` (``eager``: 0 / the dtype's minimum), a ``BlockMask``
    (``flex_attention``), or None (``flash_attention_2``, which needs :func:`as_one_row`)."""
    impl = check_packable(module, packed.has_branches)
    if impl == VARLEN_ATTENTION:
        if packed.n_rows != 1 or bool((packed.segment_ids < 0).any()):
            raise ValueError("flash_attention_2 reads packed sequences from one unpadded row")
        return None
    if impl == "flex_attention":
        return flex_block_mask(packed)
    mask = block_causal_mask(packed)
    if impl == "eager":
        dtype = dtype or torch.float32
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min
        )
    return mask


def pack_for(module: torch.nn.Module, units: Sequence[Unit], pad_id: int) -> PackedRows:
    """Pack ``units`` for ``module``'s attention: rows as wide as the longest unit, or one row
    of every token for the varlen (flash) path."""
    impl = check_packable(module, any(u.branches for u in units))
    width = sum(u.length for u in units) if impl == VARLEN_ATTENTION else None
    return pack_units(units, pad_id, width)


def packed_forward(decoder: torch.nn.Module, packed: PackedRows) -> Tensor:
    """The decoder's last hidden states of the packed rows (R, W, H)."""
    dtype = decoder.get_input_embeddings().weight.dtype
    out = decoder(
        input_ids=packed.input_ids,
        attention_mask=attention_mask_for(decoder, packed, dtype),
        position_ids=packed.position_ids,
        use_cache=False,
    )
    return out.last_hidden_state


def padding_share(lengths: Sequence[int], packed_rows: int, width: int) -> dict[str, int | float]:
    """Token slots of a micro-batch laid out one sequence per row (padded to the longest) and
    packed (``packed_rows`` rows of ``width``): counts and the padding share of each."""
    real, longest = sum(lengths), max(lengths)
    padded_slots, packed_slots = len(lengths) * longest, packed_rows * width
    return {
        "tokens": real,
        "padded_slots": padded_slots,
        "packed_slots": packed_slots,
        "padded_padding_share": 1 - real / padded_slots,
        "packed_padding_share": 1 - real / packed_slots,
    }


# ---------------------------------------------------------------------------------------------
# Rows that share a prompt: [left-padded prompt | right-padded completion], packed
# ---------------------------------------------------------------------------------------------


def split_row_parts(
    input_ids: Tensor, attention_mask: Tensor, width_p: int
) -> tuple[list[list[int]], list[list[int]]] | None:
    """The prompt and completion tokens of each ``[left-padded prompt | right-padded
    completion]`` row (``trainers.core.logprobs.split_rows``), or None when a row's attended
    tokens are not one left-padded prompt and one right-padded completion."""
    attn, ids = attention_mask.bool().cpu(), input_ids.cpu()
    n_p, n_c = attn[:, :width_p].sum(-1), attn[:, width_p:].sum(-1)
    want_p = torch.arange(width_p) >= width_p - n_p[:, None]
    want_c = torch.arange(attn.shape[1] - width_p) < n_c[:, None]
    if not bool((attn[:, :width_p] == want_p).all() and (attn[:, width_p:] == want_c).all()):
        return None
    rows = ids.tolist()
    prompts = [r[width_p - p : width_p] for r, p in zip(rows, n_p.tolist(), strict=True)]
    completions = [r[width_p : width_p + c] for r, c in zip(rows, n_c.tolist(), strict=True)]
    return prompts, completions


def prompt_units(
    prompts: Sequence[list[int]], completions: Sequence[list[int]], width: int
) -> tuple[list[Unit], list[int]]:
    """Units of at most ``width`` tokens: each prompt once, followed by as many of its rows'
    completions (in row order) as fit; returns the units and the row of each of their
    sequences (the units' order)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    units: list[Unit] = []
    order: list[int] = []
    for prompt, rows in groups.items():
        taken: list[int] = []
        for i in rows:
            used = len(prompt) + sum(len(completions[j]) for j in taken)
            if taken and used + len(completions[i]) > width:
                units.append(Unit(list(prompt), tuple(completions[j] for j in taken)))
                order += taken
                taken = []
            taken.append(i)
        units.append(Unit(list(prompt), tuple(completions[j] for j in taken)))
        order += taken
    return units, order


def shared_prompt_cost(n_rows: int, n_prompts: int, width_p: int, width: int, full_rows: bool):
    """(token slots, attention score entries) of the shared-prompt forward
    (``trainers.core.logprobs.shared_prompt_hidden``) over ``n_rows`` rows of ``width`` with
    ``n_prompts`` distinct prompts of width ``width_p``; ``full_rows``: it runs whole rows (no
    prompt repeats, or gradient checkpointing)."""
    if full_rows or n_prompts == n_rows:
        return n_rows * width, n_rows * width * width
    width_c = width - width_p
    slots = n_prompts * width_p + n_rows * width_c
    return slots, n_prompts * width_p * width_p + n_rows * width_c * width


def pack_split_rows(
    decoder: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, width_p: int
) -> tuple[PackedRows, Tensor] | None:
    """``[left-padded prompt | right-padded completion]`` rows packed as prompt units no wider
    than the rows (:func:`prompt_units`) and, for each row, the flat positions of the hidden
    states that predict its completion tokens (B, T = width − ``width_p``); None when the
    decoder's attention cannot share a prompt in a packed row, the rows are not in that
    layout, or packing costs no fewer token slots and attention entries than the
    shared-prompt forward (both counted, not timed)."""
    if attention_of(decoder) not in PACKED_ATTENTION or attention_of(decoder) == VARLEN_ATTENTION:
        return None
    parts = split_row_parts(input_ids, attention_mask, width_p)
    if parts is None:
        return None
    prompts, completions = parts
    width = input_ids.shape[1]
    units, order = prompt_units(prompts, completions, width)
    packed = pack_units(units, pad_id=0, width=width)
    full = bool(getattr(decoder, "gradient_checkpointing", False)) and decoder.training
    distinct = len({tuple(p) for p in prompts})
    slots, scores = shared_prompt_cost(len(prompts), distinct, width_p, width, full)
    if packed.n_rows * width >= slots or packed.n_rows * width * width > scores:
        return None
    # completion token t of a row is predicted by its sequence's token len(prompt) - 1 + t
    starts = torch.tensor([len(prompts[i]) - 1 for i in order])
    index = sequence_positions(packed, starts, width - width_p)
    by_row = torch.empty_like(index)
    by_row[torch.tensor(order)] = index
    return packed, by_row


def completion_states(decoder: torch.nn.Module, packed: PackedRows, index: Tensor) -> Tensor:
    """The decoder's hidden states of ``packed`` at the flat positions ``index`` (B, T, H):
    with :func:`pack_split_rows`' layout, the states that predict each row's completion tokens,
    zero past a row's completion."""
    device = decoder.get_input_embeddings().weight.device
    return take(packed_forward(decoder, packed.to(device)), index)
