"""Preference reward-model data: the direct-alignment preference records and tokenisation
(shared through :mod:`trainers.core.preferences`) and the reward model's own pair batches."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainers.core.builtin_data import DEFAULT_BUILTIN_TASKS, builtin_preference_records
from trainers.core.logprobs import split_rows
from trainers.core.preferences import TokenizedExample, load_preference_records, tokenize_records
from trainers.core.splits import split_train_eval
from trainers.core.tokenization import right_pad

__all__ = [
    "DEFAULT_BUILTIN_TASKS",
    "builtin_preference_records",
    "collate_pairs",
    "collate_pairs_split",
    "load_preference_records",
    "split_train_eval",
    "tokenize_records",
]


def collate_pairs(examples: Sequence[TokenizedExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Direct-alignment ``TokenizedExample`` pairs -> one batch of [all chosen; all rejected]
    sequences (prompt + response), right-padded; the first half are the chosen ones."""
    if not examples:
        raise ValueError("collate_pairs got an empty batch")
    seqs = [ex.prompt_ids + ex.chosen_ids for ex in examples]
    seqs += [ex.prompt_ids + ex.rejected_ids for ex in examples]
    ids, mask = right_pad(seqs, pad_id)
    return {"input_ids": ids, "attention_mask": mask}


def collate_pairs_split(
    examples: Sequence[TokenizedExample], pad_id: int
) -> dict[str, torch.Tensor | int]:
    """The rows of :func:`collate_pairs` laid out ``[left-padded prompt | right-padded
    response]`` (``trainers.core.logprobs.split_rows``) so a pair's two rows share one forward
    of its prompt; adds ``prompt_width``."""
    if not examples:
        raise ValueError("collate_pairs got an empty batch")
    prompts = [ex.prompt_ids for ex in examples] * 2
    responses = [ex.chosen_ids for ex in examples] + [ex.rejected_ids for ex in examples]
    ids, mask, _, width_p = split_rows(prompts, responses, pad_id)
    return {"input_ids": ids, "attention_mask": mask, "prompt_width": width_p}
