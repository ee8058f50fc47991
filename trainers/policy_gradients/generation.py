"""Sampling completions for a rollout step (greedy completions for held-out evaluation:
:func:`trainers.core.onpolicy.greedy_rollouts`).

Each prompt is prefilled once and its ``num_rollouts`` completions are sampled from the repeated
KV cache (``trainers/core/decoding.py``: left padding, temperature / top-k / top-p / min-p). The
completion mask ends after the *first* end-of-turn token (inclusive).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainers.core.decoding import Sampling, sample_tokens
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.onpolicy import cut_at_first_stop
from trainers.core.records import Prompt
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.experience import Experience, assemble


def _sampling(cfg: PolicyGradientConfig) -> Sampling:
    """The rollout section's sampling filters as the decoding loop takes them."""
    rc = cfg.rollout
    return Sampling(
        temperature=rc.temperature, top_k=rc.top_k, top_p=rc.top_p, min_p=rc.min_p or 0.0
    )


@torch.no_grad()
def generate_group_batch(
    model: nn.Module, tokenizer: Any, prompts: list[Prompt], cfg: PolicyGradientConfig
) -> Experience:
    """``num_rollouts`` sampled completions per prompt (rows of a group contiguous). Each prompt
    is prefilled once and its KV cache repeated for the group (trainers/core/decoding.py)."""
    rc = cfg.rollout
    G = rc.num_rollouts
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = set(end_of_turn_ids(tokenizer))
    sampling = _sampling(cfg)
    groups_per_call = max(1, (rc.generation_batch_size or len(prompts) * G) // G)

    was_training = model.training
    model.eval()
    prompt_rows, completion_rows, truncated, texts, owners = [], [], [], [], []
    for start in range(0, len(prompts), groups_per_call):
        chunk = prompts[start : start + groups_per_call]
        encoded = [chat_prompt_ids(tokenizer, p.messages) for p in chunk]
        new_tokens = sample_tokens(
            model,
            encoded,
            max_new_tokens=rc.max_new_tokens,
            stop_ids=stop_ids,
            pad_id=pad_id,
            sampling=sampling,
            repeats=G,
        )
        for row, tokens in enumerate(new_tokens):
            kept, cut = cut_at_first_stop(tokens, stop_ids)
            prompt_rows.append(encoded[row // G])
            completion_rows.append(kept)
            truncated.append(cut)
            body = kept if cut else kept[:-1]
            texts.append(tokenizer.decode(body, skip_special_tokens=True))
            owners.append(chunk[row // G])
    model.train(was_training)
    ids, attn, lens, cmask = assemble(prompt_rows, completion_rows, pad_id)
    return Experience(
        input_ids=ids,
        attention_mask=attn,
        prompt_lens=lens,
        completion_mask=cmask,
        truncated=torch.tensor(truncated, dtype=torch.bool),
        texts=texts,
        prompts=owners,
    )
