"""The sampling loop every family uses: prefill each prompt once, then decode with the KV cache.

Why our own loop rather than ``model.generate``:

1. **One prefill per prompt.** The ``G`` rollouts of a GRPO group (or the ``N`` samples of
   rejection sampling) share their prompt. The prompt goes through the model once and its KV cache
   is repeated ``G`` times, instead of ``G`` identical prefills.
2. **Less per-token overhead.** One forward of one token per row and a few tensor operations per
   step; for small models on CPU, ``generate``'s general machinery costs a noticeable share.
3. **Stopped rows leave the batch** (and the KV cache), so a group whose completions end early
   stops paying for them while its long ones finish.
4. **The sampling distribution is the one written here** — temperature, then top-k, then top-p,
   then min-p, in the order and with the tie and "keep at least one" rules transformers uses —
   and nothing else. A checkpoint's ``generation_config.json`` (repetition penalty, its own top-k)
   cannot silently make the behaviour policy differ from the π we score.

Rows are left-padded; position ids are ``cumsum(attention_mask) − 1`` (clamped at 0 on padding),
as ``generate`` and the policy-gradient scoring pass use, so greedy output equals ``generate``'s.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from trainers.core.distributed import gathered
from trainers.core.harness import raise_if_stopping
from trainers.core.logprobs import position_ids_of


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen. ``do_sample=False`` is greedy (the filters are ignored);
    ``top_k=0``, ``top_p=1`` and ``min_p=0`` switch the corresponding filter off."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p}")


GREEDY = Sampling(do_sample=False)

# Stopped rows leave the batch once they are this share of the rows still in it.
DROP_STOPPED_SHARE = 0.25


def filter_logits(logits: Tensor, sampling: Sampling) -> Tensor:
    """Next-token logits (rows, vocab) scaled by the temperature, with the tokens that top-k,
    top-p and min-p exclude set to −inf. Each filter always keeps the most likely token."""
    logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth_largest = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # ties with k-th kept
    if sampling.top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1)
        mass_below = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = mass_below <= 1.0 - sampling.top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if sampling.min_p > 0:
        probs = logits.softmax(dim=-1)
        floor = sampling.min_p * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < floor, float("-inf"))
    return logits


def choose_next(logits: Tensor, sampling: Sampling, generator=None) -> Tensor:
    """One token id per row: argmax when greedy, else a draw from softmax(filtered logits)."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, sampling).softmax(dim=-1)
    uniforms = torch.rand(probs.shape[0], generator=generator, device=probs.device)
    return pick_by_inverse_cdf(probs, uniforms)


def pick_by_inverse_cdf(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Row i's token: the first whose cumulative probability exceeds ``uniforms[i]`` times the
    row's total, i.e. a draw from ``probs[i]`` when ``uniforms[i]`` is uniform on [0, 1). One
    random number per row (``torch.multinomial`` costs ~20x more on the CPU for the same draw).
    A token of probability zero is never picked: the threshold stays below the row's total."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    threshold = torch.minimum(uniforms[:, None] * total, total.nextafter(torch.zeros_like(total)))
    picked = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    # A row of NaN probabilities makes searchsorted answer one past the vocabulary; kept in
    # range so that no embedding lookup fails on the device (the sampling loop reports the
    # non-finite logits themselves, once, at its end: no synchronisation per token).
    return picked.clamp_(max=probs.shape[-1] - 1)


class NonFiniteLogitsError(FloatingPointError):
    """The model gave NaN or infinite next-token logits while sampling."""


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, attention_mask), both (len(rows), longest row), padding on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids, mask


def cut_after_first_stop(tokens: list[int], stop_ids: set[int]) -> list[int]:
    """The tokens up to and including the first stop token (all of them when there is none)."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tokens[: i + 1]
    return tokens


def _last_logits_only(model) -> dict:
    """Ask the model for the last position's logits only, where its forward supports it (the
    prefill then never projects the whole prompt onto the vocabulary)."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: 1}
    return {}


@torch.no_grad()
def sample_tokens(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids: list[int] | set[int],
    pad_id: int,
    sampling: Sampling = GREEDY,
    repeats: int = 1,
    generator=None,
) -> list[list[int]]:
    """New token ids for ``len(prompts) * repeats`` rows (the ``repeats`` rows of a prompt are
    consecutive), each cut after its first stop token or at ``max_new_tokens``. Rows that have
    stopped leave the batch (and the KV cache) once they are a quarter of it, so the remaining
    steps cost only the rows still decoding.

    The model is used as it is (call ``model.eval()`` first to switch dropout off)."""
    if not prompts:
        return []
    if max_new_tokens < 1 or repeats < 1:
        raise ValueError(
            f"max_new_tokens and repeats must be >= 1, got {max_new_tokens}, {repeats}"
        )
    with gathered(model):  # under torchrun: whole weights, no collective per token
        return _sample_tokens(
            model, prompts, max_new_tokens, stop_ids, pad_id, sampling, repeats, generator
        )


def _sample_tokens(
    model, prompts, max_new_tokens, stop_ids, pad_id, sampling, repeats, generator
) -> list[list[int]]:
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = position_ids_of(mask)

    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **_last_logits_only(model),
    )
    cache, logits = out.past_key_values, out.logits[:, -1].float()
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)  # transformers Cache: each row `repeats` times
        logits = logits.repeat_interleave(repeats, dim=0)
        mask = mask.repeat_interleave(repeats, dim=0)
        positions = positions.repeat_interleave(repeats, dim=0)

    rows = logits.shape[0]
    stops = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # the original row of each row still decoding
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    next_position = positions[:, -1:] + 1
    non_finite = torch.zeros((), dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        raise_if_stopping("token")  # a run stops within one token of SIGTERM (harness)
        non_finite |= ~torch.isfinite(logits.sum())  # one reduction: NaN and ±inf survive it
        token = choose_next(logits, sampling, generator).masked_fill(finished, pad_id)
        tokens[live, step] = token
        finished |= torch.isin(token, stops)
        done = int(finished.sum())
        if step == max_new_tokens - 1 or done == len(live):
            break
        if done and done >= DROP_STOPPED_SHARE * len(live):  # drop them from batch and cache
            keep = (~finished).nonzero().squeeze(-1)
            live, token, mask = live[keep], token[keep], mask[keep]
            next_position, finished = next_position[keep], finished[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=next_position,
            past_key_values=cache,
            use_cache=True,
        )
        cache, logits = out.past_key_values, out.logits[:, -1].float()
        next_position = next_position + 1
    if bool(non_finite):
        raise NonFiniteLogitsError(
            "The model gave NaN or infinite next-token logits while sampling: its weights are "
            "probably no longer finite (a diverged update). Lower the learning rate or resume "
            "from an earlier checkpoint."
        )
    tokens = tokens.tolist()
    stop_set = set(int(s) for s in stop_ids)
    return [cut_after_first_stop(row, stop_set) for row in tokens]
