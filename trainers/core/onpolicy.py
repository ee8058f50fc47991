"""The "sample from the current policy" half of the loops that sample, then score the samples.

Online DPO (trainers/direct_alignment/online.py) ranks what the policy sampled; on-policy
distillation (trainers/distillation/train.py) has a teacher score every sampled token; policy
gradients sample each step's groups (trainers/policy_gradients/generation.py, and its difficulty
probe the same way). They start each step the same way, and the code for it lives here once:

- :func:`step_generator` — the step's sampling RNG, fixed by (seed, step) so a resumed run draws
  exactly what the uninterrupted one drew;
- :func:`sample_policy` — ``repeats`` completions per prompt (consecutive rows) from the model in
  eval mode (dropout off), its training mode restored afterwards; prompts in chunks of
  ``batch_size`` when given (greedy held-out evaluation), each completion up to and including its
  first end-of-turn token (trainers/core/decoding.py: one prefill per prompt);
- :func:`rows_of` — each completion's owner (prompt, metadata...) in the same row order, for the
  scorer;
- :func:`greedy_rollouts` — greedy completions of held-out prompts (policy gradients' and
  distillation's evaluation), each cut after its first end-of-turn token
  (:func:`cut_at_first_stop`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import nn

from trainers.core.decoding import Sampling, sample_tokens
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.harness import raise_if_stopping
from trainers.core.records import Prompt
from trainers.core.rundir import phase_progress

T = TypeVar("T")


def step_generator(device: torch.device | str, seed: int, step: int) -> torch.Generator:
    """The sampling RNG of optimizer step ``step`` (the number of steps already taken)."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + step)


def pad_id_of(tokenizer: Any) -> int:
    """The tokenizer's padding id (0 when it has none: padded positions are masked anyway)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def sample_policy(
    model,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: Sampling,
    repeats: int = 1,
    generator: torch.Generator | None = None,
    batch_size: int | None = None,
) -> list[list[int]]:
    """``repeats`` completions per prompt (rows ``repeats·i … repeats·i + repeats − 1`` belong to
    prompt i), sampled from ``model`` as it is now, with dropout off; the model's training mode
    is restored afterwards. ``batch_size`` prompts per decoding call (None: all at once)."""
    if not prompt_ids:
        return []
    step = batch_size or len(prompt_ids)
    stop_ids = set(end_of_turn_ids(tokenizer))
    was_training = model.training
    model.eval()
    out: list[list[int]] = []
    try:
        for start in range(0, len(prompt_ids), step):
            if start:
                raise_if_stopping("sample_batch")
            out += sample_tokens(
                model,
                prompt_ids[start : start + step],
                max_new_tokens=max_new_tokens,
                stop_ids=stop_ids,
                pad_id=pad_id_of(tokenizer),
                sampling=sampling,
                repeats=repeats,
                generator=generator,
            )
    finally:
        model.train(was_training)
    return out


def rows_of(items: list[T], repeats: int) -> list[T]:
    """Each item ``repeats`` times in a row: the owner of every row :func:`sample_policy` returns."""
    return [item for item in items for _ in range(repeats)]


def cut_at_first_stop(tokens: list[int], stop_ids: set[int]) -> tuple[list[int], bool]:
    """Completion tokens up to and including the first end-of-turn token; and whether it was
    truncated (no end-of-turn token at all)."""
    for i, tok in enumerate(tokens):
        if tok in stop_ids:
            return tokens[: i + 1], False
    return tokens, True


@torch.no_grad()
def greedy_rollouts(
    model: nn.Module,
    tokenizer: Any,
    prompts: list[Prompt],
    max_new_tokens: int,
    batch_size: int,
) -> dict[str, list]:
    """Greedy completions for held-out evaluation, with their token ids: ``texts``, ``lengths``
    (completion tokens, end-of-turn included), ``truncated``, ``prompt_ids`` and
    ``completion_ids`` (up to and including the first end-of-turn token)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    stop_ids = set(end_of_turn_ids(tokenizer))
    was_training = model.training
    model.eval()
    out: dict[str, list] = {
        "texts": [],
        "lengths": [],
        "truncated": [],
        "prompt_ids": [],
        "completion_ids": [],
    }
    for start in range(0, len(prompts), batch_size):
        rows = [chat_prompt_ids(tokenizer, p.messages) for p in prompts[start : start + batch_size]]
        new_tokens = sample_tokens(
            model, rows, max_new_tokens=max_new_tokens, stop_ids=stop_ids, pad_id=pad_id
        )
        phase_progress(min(start + batch_size, len(prompts)), len(prompts))
        for prompt_row, tokens in zip(rows, new_tokens, strict=True):
            kept, cut = cut_at_first_stop(tokens, stop_ids)
            out["lengths"].append(len(kept))
            out["truncated"].append(cut)
            out["texts"].append(
                tokenizer.decode(kept if cut else kept[:-1], skip_special_tokens=True)
            )
            out["prompt_ids"].append(prompt_row)
            out["completion_ids"].append(kept)
    model.train(was_training)
    return out


def greedy_completions(
    model: nn.Module,
    tokenizer: Any,
    prompts: list[Prompt],
    max_new_tokens: int,
    batch_size: int,
) -> tuple[list[str], list[int], list[bool]]:
    """Greedy completions for held-out evaluation: (texts, lengths, truncated)."""
    out = greedy_rollouts(model, tokenizer, prompts, max_new_tokens, batch_size)
    return out["texts"], out["lengths"], out["truncated"]
