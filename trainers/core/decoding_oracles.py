"""What the rollout engine (trainers/core/decoding.py) is checked against: the sampling loop it
replaced and transformers' ``generate``. The tests check that the engine gives the same tokens
(tests/trainers/core/test_decoding.py) and bench/decoding.py times the engine against both. No
trainer runs them.

:func:`previous_sample_tokens` is ``sample_tokens`` as it was at a2bb8bb, before the engine: it
grows transformers' ``DynamicCache`` by ``torch.cat`` and the 2-D attention mask by one column
per token, and drops stopped rows from the batch and the cache once they are a quarter of it
(:data:`~trainers.core.decoding.DROP_STOPPED_SHARE`); it has no stop-signal check and a short
error for non-finite logits. :func:`generate_greedy` is ``model.generate`` greedy with the same
stop tokens.
"""

from __future__ import annotations

import torch

from trainers.core.decoding import (
    DROP_STOPPED_SHARE,
    GREEDY,
    NonFiniteLogitsError,
    Sampling,
    _last_logits_only,
    choose_next,
    cut_after_first_stop,
    left_pad,
)
from trainers.core.logprobs import position_ids_of

__all__ = ["generate_greedy", "previous_sample_tokens"]


@torch.no_grad()
def previous_sample_tokens(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids,
    pad_id: int,
    sampling: Sampling = GREEDY,
    repeats: int = 1,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """The completion ids of each prompt (``repeats`` rows per prompt), cut after the first stop
    token, as the loop before the rollout engine drew them."""
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
        raise NonFiniteLogitsError("non-finite logits")
    stop_set = set(int(s) for s in stop_ids)
    return [cut_after_first_stop(row, stop_set) for row in tokens.tolist()]


def generate_greedy(
    model, prompts: list[list[int]], pad_id: int, stop_ids, max_new_tokens: int
) -> list[list[int]]:
    """transformers' greedy ``generate`` of each prompt (left-padded), stopping at ``stop_ids``,
    cut after the first stop token as the engine cuts."""
    ids, mask = left_pad(prompts, pad_id)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=sorted(stop_ids) or None,
    )
    stops = set(stop_ids)
    return [cut_after_first_stop(r, stops) for r in out[:, ids.shape[1] :].tolist()]
