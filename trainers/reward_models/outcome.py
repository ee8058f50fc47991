"""Outcome reward model (ORM) data: one prompt with several completions, each labelled 0/1.

Accepted columns:

* the prompt: ``prompt`` (string or chat messages) or ``question`` (GSM8K). A string prompt is
  wrapped as ``[system: GSM8K_SYSTEM_PROMPT, user: text]`` (the book's rollout prompt, which asks
  for a final ``#### <number>`` line); a message list is used as is;
* ``completions``: list of completion strings (the book's rollouts dataset
  ``RLHF-Book/gsm8k-qwen3-0.6B-rollouts`` and our fixture);
* ``labels`` or ``rewards``: list of 0/1 correctness labels, one per completion (numbers are read
  as correct when > 0.5);
* ``answer``: the GSM8K reference solution ending with ``#### <number>``. When a row has
  completions but no labels, each completion is labelled by comparing its ``####`` number with
  the reference's. When a row has no completions at all (plain GSM8K), its completions are the
  reference solution (label 1) and a copy whose final ``####`` number is perturbed (label 0).

Only the first ``rollouts_per_prompt`` completions of a row are kept (label-blind, as the book).
The train / eval split is made over prompts, so a prompt never appears on both sides.
Sequences longer than ``max_length`` are dropped, not truncated (truncation would cut the final
answer the label is about), and counted. The offline set ``builtin:reasoning-outcomes`` comes
from :func:`trainers.core.builtin_data.builtin_outcome_records`.
"""

from __future__ import annotations

import logging
import math
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainers.core.builtin_data import builtin_outcome_records
from trainers.core.messages import as_messages, system_and_user
from trainers.core.records import OutcomeRecord
from trainers.core.splits import collect_records, shuffled, split_seed
from trainers.core.tokenization import response_ids, right_pad
from trainers.reward_models.config import BUILTIN_OUTCOMES
from trainers.reward_models.sources import builtin_tasks, chat_ids, read_rows

logger = logging.getLogger(__name__)

__all__ = [
    "GSM8K_SYSTEM_PROMPT",
    "OutcomeExample",
    "OutcomeRecord",
    "builtin_outcome_records",
    "collate_outcomes",
    "corrupt_final_answer",
    "gsm8k_final_answer",
    "load_outcome_records",
    "parse_outcome_row",
    "tokenize_outcomes",
]

GSM8K_SYSTEM_PROMPT = (
    "Solve the math problem step by step. End with exactly one line in the form #### <number>. "
    "Do not write anything after that line."
)
"""System prompt of the book's GSM8K rollouts, used for ORM rows whose prompt is a string."""


@dataclass
class OutcomeExample:
    """Prompt + completion ids of one completion; ``group`` = index of its prompt."""

    input_ids: list[int]
    prompt_len: int
    label: int
    group: int


_FINAL_RE = re.compile(r"####\s*([^\n]*)")


def _normalise_number(text: str) -> str:
    """A number's text without commas, ``$``, spaces or a trailing period (``72.0`` -> ``72``)."""
    text = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def gsm8k_final_answer(text: str) -> str | None:
    """The number after the last ``####`` of a GSM8K solution, normalised (commas, ``$``,
    spaces and a trailing period removed; ``72.0`` -> ``72``); None without a ``####`` line."""
    found = _FINAL_RE.findall(text or "")
    if not found:
        return None
    value = _normalise_number(found[-1])
    return value or None


def corrupt_final_answer(solution: str, rng: random.Random) -> str:
    """The same solution with its final ``#### <number>`` changed to a different number."""
    final = gsm8k_final_answer(solution)
    if final is None:
        raise ValueError("the solution has no '#### <number>' line")
    try:
        value = float(final)
        delta = rng.choice([1, 2, 3, 5, 10, -1, -2, -3])
        if value + delta < 0 <= value:
            delta = -delta
        new = value + delta
        wrong = str(int(new)) if new.is_integer() else repr(new)
    except ValueError:
        wrong = final + "0"
    head, _, _ = solution.rpartition("####")
    return f"{head}#### {wrong}"


def _prompt_messages(value: Any) -> list[dict]:
    """An ORM prompt as messages: a string gets the GSM8K system prompt, a message list is
    used as is."""
    if isinstance(value, str):
        return system_and_user(GSM8K_SYSTEM_PROMPT, value.strip())
    if isinstance(value, list):
        try:
            return as_messages(value)
        except ValueError:
            pass
    raise ValueError(f"a prompt must be a string or a list of chat messages, got {value!r:.80}")


def _as_label(value: Any) -> int:
    """A 0/1 correctness label from a bool or a number (correct when > 0.5)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return int(value > 0.5)
    raise ValueError(f"cannot read {value!r} as a 0/1 correctness label")


def parse_outcome_row(
    row: dict, rollouts_per_prompt: int | None = None, counts: dict | None = None
) -> OutcomeRecord | None:
    """One ORM row -> :class:`OutcomeRecord` (see the module docstring for the columns), or
    None when the row has no prompt or no way to label its completions."""
    counts = counts if counts is not None else {}
    prompt_value = row.get("prompt") if row.get("prompt") is not None else row.get("question")
    if prompt_value is None or (isinstance(prompt_value, str) and not prompt_value.strip()):
        return None
    prompt = _prompt_messages(prompt_value)
    reference = row.get("answer")
    completions = row.get("completions")
    labels = row.get("labels") if row.get("labels") is not None else row.get("rewards")
    meta: dict[str, Any] = {}
    if completions is None:
        if not reference or gsm8k_final_answer(reference) is None:
            return None
        rng = random.Random(zlib.crc32(str(prompt_value).encode()))
        completions = [reference, corrupt_final_answer(reference, rng)]
        labels = [1, 0]
        meta["completions_from"] = "reference+perturbed"
        counts["generated_from_answer"] = counts.get("generated_from_answer", 0) + 1
    elif labels is None:
        want = gsm8k_final_answer(reference or "")
        if want is None:
            return None
        labels = [int(gsm8k_final_answer(c) == want) for c in completions]
        meta["labels_from"] = "answer"
        counts["labels_from_answer"] = counts.get("labels_from_answer", 0) + 1
    completions = [str(c) for c in completions]
    labels = [_as_label(v) for v in labels]
    if len(completions) != len(labels):
        raise ValueError(
            f"ORM row has {len(completions)} completions but {len(labels)} labels: "
            f"{str(prompt_value)[:60]!r}"
        )
    if rollouts_per_prompt is not None:
        if len(completions) < rollouts_per_prompt:
            counts["short_rows"] = counts.get("short_rows", 0) + 1
        completions, labels = completions[:rollouts_per_prompt], labels[:rollouts_per_prompt]
    if not completions:
        return None
    if reference:
        meta["answer"] = gsm8k_final_answer(reference)
    return OutcomeRecord(prompt=prompt, completions=completions, labels=labels, meta=meta)


def load_outcome_records(
    dataset: str,
    split: str = "train",
    max_samples: int | None = None,
    rollouts_per_prompt: int = 32,
    seed: int = 42,
    *,
    stats: dict | None = None,
    task_configs: dict[str, dict] | None = None,
) -> list[OutcomeRecord]:
    """ORM records (one per prompt). ``builtin:reasoning-outcomes[:task_a,task_b]`` generates
    ``max_samples`` prompts offline; otherwise rows are shuffled with ``seed`` and the first
    ``max_samples`` usable ones are kept; ``task_configs[task]`` updates a built-in task's
    reasoning-gym settings. ``stats`` gets ``n_rows``, ``n_records``, ``skipped``,
    ``labels_from_answer``, ``generated_from_answer``, ``short_rows`` (fewer completions than
    ``rollouts_per_prompt``)."""
    out = stats if stats is not None else {}
    if dataset.startswith("builtin:"):
        tasks = builtin_tasks(dataset, BUILTIN_OUTCOMES)
        n = 500 if max_samples is None else max_samples
        records = builtin_outcome_records(
            n, split_seed(seed, split), rollouts_per_prompt, tasks, task_configs
        )
        out.update({"n_rows": len(records), "n_records": len(records), "skipped": 0})
        return records
    rows = shuffled(read_rows(dataset, split, "orm"), seed)
    counts: dict[str, int] = {}
    records, n_rows, skipped = collect_records(
        rows, lambda row: parse_outcome_row(row, rollouts_per_prompt, counts), max_samples
    )
    if not records:
        raise ValueError(
            f"dataset {dataset!r} gave no ORM rows: each row needs a `prompt` or `question` and "
            "`completions` with `labels`/`rewards`, or a GSM8K `answer` ending in '#### <number>'"
        )
    out.update({"n_rows": n_rows, "n_records": len(records), "skipped": skipped, **counts})
    if counts.get("short_rows"):
        logger.warning(
            "%d prompt(s) have fewer than %d completions", counts["short_rows"], rollouts_per_prompt
        )
    return records


def tokenize_outcomes(
    records: Sequence[OutcomeRecord], tokenizer: Any, max_length: int
) -> tuple[list[OutcomeExample], dict]:
    """One :class:`OutcomeExample` per completion. ids = the chat template of
    ``prompt + [assistant: completion]`` (so the completion ends with the end-of-turn token(s)),
    split at the length of the prompt's template with the generation prompt. Completions whose
    sequence exceeds ``max_length`` are dropped (``dropped_too_long``)."""
    stats = {"n_completions": 0, "n_out": 0, "dropped_too_long": 0, "prefix_fallback": 0}
    examples: list[OutcomeExample] = []
    for g, rec in enumerate(records):
        prompt = chat_ids(tokenizer, [rec.prompt], add_generation_prompt=True)[0]
        convs = [rec.prompt + [{"role": "assistant", "content": c}] for c in rec.completions]
        fulls = chat_ids(tokenizer, convs, add_generation_prompt=False)
        for text, full, label in zip(rec.completions, fulls, rec.labels, strict=True):
            stats["n_completions"] += 1
            response, fell_back = response_ids(tokenizer, prompt, full, text)
            full = prompt + response
            stats["prefix_fallback"] += int(fell_back)
            if len(full) > max_length:
                stats["dropped_too_long"] += 1
                continue
            examples.append(OutcomeExample(full, len(prompt), int(label), g))
    stats["n_out"] = len(examples)
    if stats["dropped_too_long"]:
        logger.warning(
            "dropped %d completion(s) longer than max_length=%d",
            stats["dropped_too_long"],
            max_length,
        )
    return examples, stats


def collate_outcomes(examples: Sequence[OutcomeExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded completions with their ``completion_mask`` (prompt tokens 0), ``labels``
    and ``groups`` (the prompt each row belongs to)."""
    if not examples:
        raise ValueError("collate_outcomes got an empty batch")
    ids, mask = right_pad([ex.input_ids for ex in examples], pad_id)
    completion = mask.clone()
    for row, ex in enumerate(examples):
        completion[row, : ex.prompt_len] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "completion_mask": completion,
        "labels": torch.tensor([ex.label for ex in examples], dtype=torch.long),
        "groups": torch.tensor([ex.group for ex in examples], dtype=torch.long),
    }
