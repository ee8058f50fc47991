"""Preference data for the direct-alignment family.

Pipeline: ``load_preference_records`` (hub id, local file or folder, or the built-in offline set)
-> ``split_train_eval`` -> ``tokenize_records`` (chat template, truncation, identical-pair drop)
-> optionally ``attach_kl_responses`` (KTO) -> ``collate_split`` per micro-batch (``collate``:
the same rows right-padded). ``fingerprint_examples`` keys the on-disk reference log-prob cache.

Reading, parsing and tokenising preference data is shared with the reward models and lives in
:mod:`trainers.core.preferences` (formats, truncation rules) and
:mod:`trainers.core.builtin_data` (the offline set); this module re-exports those names and
holds what only direct alignment needs: KL pairs for KTO, the batch row layout and the cache key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Sequence

import torch

from trainers.core.builtin_data import DEFAULT_BUILTIN_TASKS, builtin_preference_records
from trainers.core.datasets import DatasetNotFoundError
from trainers.core.logprobs import split_rows
from trainers.core.preferences import (
    BUILTIN_DEFAULT_SIZE,
    FORMATS,
    MIN_PROMPT_TOKENS,
    TokenizedExample,
    detect_format,
    load_preference_records,
    parse_hh_conversation,
    tokenize_records,
)
from trainers.core.records import PreferenceRecord
from trainers.core.splits import split_train_eval
from trainers.core.tasks import SYSTEM_PROMPT, extract_answer, score_response
from trainers.core.tokenization import right_pad
from trainers.direct_alignment.config import BUILTIN_DATASET

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_DATASET",
    "BUILTIN_DEFAULT_SIZE",
    "DEFAULT_BUILTIN_TASKS",
    "DatasetNotFoundError",
    "FORMATS",
    "MIN_PROMPT_TOKENS",
    "PreferenceRecord",
    "SYSTEM_PROMPT",
    "TokenizedExample",
    "attach_kl_responses",
    "builtin_preference_records",
    "collate",
    "collate_split",
    "detect_format",
    "extract_answer",
    "fingerprint_examples",
    "load_preference_records",
    "parse_hh_conversation",
    "preference_rows",
    "score_builtin_response",  # = trainers.core.tasks.score_response
    "split_train_eval",
    "tokenize_records",
]

score_builtin_response = score_response


def attach_kl_responses(
    examples: Sequence[TokenizedExample], max_length: int | None = None
) -> list[TokenizedExample]:
    """Give example i the response of example (i + 1) mod n as its KL (mismatched) completion.

    The KTO reference point z is estimated from such mismatched prompt/completion pairs; fixing
    them at data-preparation time lets their reference log-probs be cached with the rest. The
    desirable response of the neighbour is used, or its undesirable one when it has none. With
    ``max_length`` the KL response is cut on the right so prompt + response fits. Returns new
    examples; the inputs are not modified. An empty list gives an empty list; a single example
    can only get its own response (a matched pair), which is allowed with a warning.
    """
    n = len(examples)
    if n == 1:
        logger.warning("attach_kl_responses: one example only; its KL pair is not mismatched")
    out = []
    for i, ex in enumerate(examples):
        nxt = examples[(i + 1) % n]
        resp = nxt.chosen_ids if nxt.chosen_ids is not None else nxt.rejected_ids
        resp = list(resp)
        if max_length is not None:
            resp = resp[: max(max_length - len(ex.prompt_ids), 1)]
        out.append(dataclasses.replace(ex, kl_response_ids=resp))
    return out


def preference_rows(
    examples: Sequence[TokenizedExample], with_kl: bool = False
) -> tuple[list[tuple[list[int], list[int], int]], dict[str, list[int]]]:
    """The sequences of a micro-batch as (prompt ids, response ids, example index), in the row
    order every collate uses: every chosen (desirable) response, then every rejected
    (undesirable) one, then (``with_kl``) every KL response, each in example order; and the row
    positions of each kind."""
    if not examples:
        raise ValueError("collate got an empty batch")
    rows: list[tuple[list[int], list[int], int]] = []
    index: dict[str, list[int]] = {"chosen": [], "rejected": [], "kl": []}
    for ex_i, ex in enumerate(examples):
        if ex.chosen_ids is not None:
            index["chosen"].append(len(rows))
            rows.append((ex.prompt_ids, ex.chosen_ids, ex_i))
    for ex_i, ex in enumerate(examples):
        if ex.rejected_ids is not None:
            index["rejected"].append(len(rows))
            rows.append((ex.prompt_ids, ex.rejected_ids, ex_i))
    if with_kl:
        for ex_i, ex in enumerate(examples):
            if ex.kl_response_ids is None:
                raise ValueError("with_kl=True but an example has no kl_response_ids")
            index["kl"].append(len(rows))
            rows.append((ex.prompt_ids, ex.kl_response_ids, ex_i))
    if not rows:
        raise ValueError("collate: no responses in the batch")
    return rows, index


def _row_index(
    examples: Sequence[TokenizedExample], rows: list[tuple], index: dict[str, list[int]]
) -> dict[str, torch.Tensor | bool]:
    """The row bookkeeping every collate returns (see :func:`collate`)."""
    return {
        "chosen_index": torch.tensor(index["chosen"], dtype=torch.long),
        "rejected_index": torch.tensor(index["rejected"], dtype=torch.long),
        "kl_index": torch.tensor(index["kl"], dtype=torch.long),
        "row_example": torch.tensor([e for _, _, e in rows], dtype=torch.long),
        "paired": all(ex.chosen_ids is not None and ex.rejected_ids is not None for ex in examples),
    }


def collate(
    examples: Sequence[TokenizedExample], pad_id: int, with_kl: bool = False
) -> dict[str, torch.Tensor | bool]:
    """Right-padded batch of prompt + response rows, padded to the longest row of this batch
    (row order: :func:`preference_rows`).

    Returns ``input_ids``, ``attention_mask`` and ``loss_mask`` (N, T) long tensors
    (``loss_mask`` is 1 on response tokens, aligned with ``input_ids``: the trainer shifts it
    with the labels), ``chosen_index``, ``rejected_index``, ``kl_index`` (row positions),
    ``row_example`` (the example each row came from) and ``paired`` (every example has both
    responses; paired losses need it).
    """
    rows, index = preference_rows(examples, with_kl)
    input_ids, attention_mask = right_pad([p + r for p, r, _ in rows], pad_id)
    loss_mask = attention_mask.clone()
    for row, (p, _, _) in enumerate(rows):
        loss_mask[row, : len(p)] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        **_row_index(examples, rows, index),
    }


def collate_split(
    examples: Sequence[TokenizedExample], pad_id: int, with_kl: bool = False
) -> dict[str, torch.Tensor | bool | int]:
    """The same rows as :func:`collate` laid out ``[left-padded prompt | right-padded
    response]`` (``trainers.core.logprobs.split_rows``), so the chosen, rejected and KL rows of
    an example can share one forward of its prompt. Returns ``input_ids``, ``attention_mask``,
    ``completion_mask`` (N, T_response), ``prompt_width`` and the row index of :func:`collate`.
    """
    rows, index = preference_rows(examples, with_kl)
    ids, attn, completion_mask, width_p = split_rows(
        [p for p, _, _ in rows], [r for _, r, _ in rows], pad_id
    )
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "completion_mask": completion_mask,
        "prompt_width": width_p,
        **_row_index(examples, rows, index),
    }


def fingerprint_examples(examples: Sequence[TokenizedExample]) -> str:
    """SHA-256 hex digest of every example's token ids (KL ids included), in order.

    Stable across processes and machines (no Python ``hash``); any change of a token, of the
    order, or of which responses are present changes it.
    """
    h = hashlib.sha256(b"direct-alignment-examples/v1\n")
    for ex in examples:
        payload = [ex.prompt_ids, ex.chosen_ids, ex.rejected_ids, ex.kl_response_ids]
        h.update(json.dumps(payload, separators=(",", ":")).encode())
        h.update(b"\n")
    return h.hexdigest()
