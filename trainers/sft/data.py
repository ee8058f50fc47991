"""Demonstration data for supervised fine-tuning.

Pipeline: ``load_sft_records`` (hub id, local file or folder, or the built-in offline set)
-> ``split_train_eval`` -> ``tokenize_records`` (chat template, loss mask on assistant turns,
right truncation) -> ``collate`` per micro-batch (padded to the longest row of the batch).

Accepted schemas:

* ``messages``: a list of ``{"role", "content"}`` dicts per row (the HuggingFaceH4/no_robots
  schema: ``prompt``, ``prompt_id``, ``messages``, ``category``; extra columns are ignored);
* ``prompt`` + ``completion``: strings (the prompt becomes one user message), or message lists;
* ``builtin:reasoning-sft[:task_a,task_b]``: demonstrations generated offline from reasoning-gym
  (system = the tag-format instruction, user = the question, assistant =
  ``<think>reasoning</think>\\n<answer>answer</answer>``), each verified to score 1.0;
* ``builtin:tool-sft[:task_a,task_b]``: the same on arithmetic tasks, half of them calling the
  calculator first (assistant call, ``tool`` reply, assistant answer;
  :mod:`trainers.core.tool_demonstrations`); trained with ``train_on="all_assistant"``.

Messages after the last assistant turn carry no training signal and are dropped; a conversation
with no assistant turn is skipped (and counted).

Loss mask. For an assistant turn i, the trained tokens are those of
``template(messages[:i+1])`` after ``template(messages[:i], add_generation_prompt=True)``: the
turn's content and its end-of-turn token. Anything the template writes after the last
end-of-turn token of the turn (ChatML's trailing newline) is not trained, since generation stops
at that token. ``train_on="final"`` trains the last assistant turn only (the book's choice);
``"all_assistant"`` trains every assistant turn. Prompt tokens, other turns and padding are
never trained.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from trainers.core.builtin_data import (
    DEMONSTRATION_SET_SIZE,
    builtin_demonstrations,
    split_builtin_name,
    task_settings,
)
from trainers.core.datasets import (  # noqa: F401  (re-exported for the SFT trainer)
    DATA_EXTENSIONS,
    DatasetNotFoundError,
    looks_like_path,
    open_split,
)
from trainers.core.generation import end_of_turn_ids
from trainers.core.messages import as_messages, end_at_last_assistant
from trainers.core.records import SFTRecord
from trainers.core.splits import collect_records, hold_out, rows_to_read
from trainers.core.tasks import score_response
from trainers.core.tokenization import (
    chat_template_ids,
    chunks,
    require_chat_template,
    right_pad,
    text_ids,
)
from trainers.core.tool_demonstrations import sft_demonstration_set
from trainers.sft.config import BUILTIN_DATASET, BUILTIN_NAMES, DEFAULT_BUILTIN_TASKS, TOOL_DATASET

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_DATASET",
    "BUILTIN_DEFAULT_SIZE",
    "TOOL_DATASET",
    "DEFAULT_BUILTIN_TASKS",
    "DATA_EXTENSIONS",
    "DatasetNotFoundError",
    "SFTRecord",
    "TokenizedSFT",
    "builtin_sft_records",
    "collate",
    "load_sft_records",
    "longest_tool_demonstration",
    "looks_like_path",
    "parse_builtin_name",
    "score_record_response",
    "split_train_eval",
    "task_settings",
    "tokenize_records",
]

BUILTIN_DEFAULT_SIZE = DEMONSTRATION_SET_SIZE
"""Built-in demonstrations generated when ``max_samples`` is not given."""

T = TypeVar("T")


def builtin_hint() -> str:
    """What to use instead when a dataset cannot be opened (ends the loading errors)."""
    return (
        f"For offline runs use the built-in demonstrations `{BUILTIN_DATASET}` (generated "
        f"from reasoning-gym tasks; `{BUILTIN_DATASET}:spell_backward,chain_sum` picks tasks; "
        f"`{TOOL_DATASET}` demonstrates the calculator tool), "
        "or a local .jsonl/.json/.parquet/.csv file or folder."
    )


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


def _parse_messages_row(row: dict) -> SFTRecord | None:
    """A ``messages`` row, cut after its last assistant turn; None without one."""
    messages = end_at_last_assistant(as_messages(row["messages"]))
    if messages is None or len(messages) < 2:
        return None
    return SFTRecord(messages=messages)


def _parse_prompt_completion_row(row: dict) -> SFTRecord | None:
    """A ``prompt`` + ``completion`` row (strings or message lists); None when unusable."""
    prompt = as_messages(row["prompt"])
    completion = row["completion"]
    if isinstance(completion, list):  # conversational: a list holding the assistant message(s)
        messages = end_at_last_assistant(prompt + as_messages(completion))
    else:
        messages = prompt + [{"role": "assistant", "content": str(completion or "")}]
    if not messages or len(messages) < 2 or not prompt:
        return None
    return SFTRecord(messages=messages)


def detect_schema(columns: Sequence[str]) -> str:
    """``messages`` or ``prompt_completion`` from the column names; ValueError otherwise."""
    cols = set(columns)
    if "messages" in cols:
        return "messages"
    if {"prompt", "completion"} <= cols:
        return "prompt_completion"
    raise ValueError(
        f"unrecognised SFT schema: found columns {sorted(cols)}. Expected a `messages` column "
        "(a list of {role, content} per row, as in HuggingFaceH4/no_robots) or `prompt` and "
        "`completion` columns (strings or message lists)."
    )


_PARSERS = {"messages": _parse_messages_row, "prompt_completion": _parse_prompt_completion_row}


def load_sft_records(
    dataset: str,
    split: str = "train",
    max_samples: int | None = None,
    seed: int = 42,
    *,
    builtin_tasks: list[str] | None = None,
    builtin_task_configs: dict[str, dict] | None = None,
    stats: dict | None = None,
) -> list[SFTRecord]:
    """Load demonstrations as :class:`SFTRecord` objects.

    ``dataset``: a hub id, a local data file or folder (``split`` is ignored for a single file:
    the file is the split), or ``builtin:reasoning-sft[:task_a,task_b]`` /
    ``builtin:tool-sft[:task_a,task_b]``. With ``max_samples``
    the rows are shuffled with ``seed`` and the first N usable ones kept (the book took the first
    N rows unshuffled, a biased subset on sorted data). ``stats`` receives ``schema``,
    ``n_rows`` (rows read), ``n_records`` and ``skipped`` (rows without an assistant turn).

    Raises :class:`DatasetNotFoundError` for a missing path or an unreachable hub dataset, and
    ``ValueError`` for an unrecognised schema.
    """
    out = stats if stats is not None else {}
    out.update({"schema": None, "n_rows": 0, "n_records": 0, "skipped": 0})
    if dataset.startswith("builtin:"):
        parse_builtin_name(dataset)  # an unknown builtin: name is refused here
        records = sft_demonstration_set(
            dataset, split, max_samples, seed, builtin_tasks, builtin_task_configs
        )
        out.update({"schema": "builtin", "n_rows": len(records), "n_records": len(records)})
        return records

    ds = _load_hf_dataset(dataset, split)
    if len(ds) == 0:
        raise ValueError(f"dataset {dataset!r} (split {split!r}) has no rows")
    schema = detect_schema(ds.column_names)
    out["schema"] = schema
    rows, limit = rows_to_read(ds, max_samples, seed)
    records, n_rows, skipped = collect_records(rows, _PARSERS[schema], limit)
    out.update({"n_rows": n_rows, "n_records": len(records), "skipped": skipped})
    if out["skipped"]:
        logger.warning("%s: skipped %d row(s) without an assistant turn", dataset, out["skipped"])
    return records


def _load_hf_dataset(dataset: str, split: str) -> Any:
    """Open ``dataset`` (file, folder or hub id) and return one split."""
    return open_split(dataset, split, builtin_hint())


def split_train_eval(records: Sequence[T], eval_size: int, seed: int) -> tuple[list[T], list[T]]:
    """Hold out ``eval_size`` records chosen with ``seed``; both parts keep the input order.
    At least one record must stay for training."""
    n = len(records)
    if not 0 <= eval_size < n:
        raise ValueError(
            f"eval_size ({eval_size}) must be smaller than the number of records ({n})"
        )
    return hold_out(records, eval_size, seed + 17)


# --------------------------------------------------------------------------------------------
# Built-in demonstrations from reasoning-gym
# --------------------------------------------------------------------------------------------


def parse_builtin_name(dataset: str) -> list[str] | None:
    """``builtin:reasoning-sft:a,b`` -> ["a", "b"]; ``builtin:reasoning-sft`` -> None (the same
    for ``builtin:tool-sft``). Raises :class:`DatasetNotFoundError` for any other ``builtin:``
    name."""
    name, tasks = split_builtin_name(dataset)
    if name not in BUILTIN_NAMES:
        raise DatasetNotFoundError(
            f"unknown built-in dataset {dataset!r}; the built-in SFT sets are {BUILTIN_DATASET!r} "
            f"and {TOOL_DATASET!r} (optionally followed by :task_a,task_b)"
        )
    return tasks


def builtin_sft_records(
    n: int,
    seed: int,
    tasks: Sequence[str] | None = None,
    task_configs: dict[str, dict] | None = None,
) -> list[SFTRecord]:
    """``n`` built-in demonstrations (:func:`trainers.core.builtin_data.builtin_demonstrations`)
    of ``tasks``, by default the SFT set's own tasks."""
    return builtin_demonstrations(n, seed, list(tasks or DEFAULT_BUILTIN_TASKS), task_configs)


def score_record_response(response: str, record: SFTRecord) -> float | None:
    """reasoning-gym score of a generated response for a built-in record; None otherwise."""
    if "task" not in record.meta:
        return None
    return score_response(response, record.meta)


# --------------------------------------------------------------------------------------------
# Tokenisation and the loss mask
# --------------------------------------------------------------------------------------------


@dataclass
class TokenizedSFT:
    """``input_ids`` of the conversation and ``loss_mask`` aligned with them (1 = a target
    token; the trainer shifts it with the labels). ``n_targets`` = targets after the shift."""

    input_ids: list[int]
    loss_mask: list[int]

    @property
    def n_targets(self) -> int:
        """Trained tokens once the mask is shifted with the labels."""
        return int(sum(self.loss_mask[1:]))


def tokenize_records(
    records: Sequence[SFTRecord],
    tokenizer,
    max_length: int,
    train_on: str = "final",
) -> tuple[list[TokenizedSFT], dict]:
    """Tokenise conversations with the chat template and mark the trained tokens.

    Returns the examples (in input order, minus dropped ones) and stats: ``n_in``, ``n_out``,
    ``truncated`` (conversations cut at ``max_length``), ``dropped_no_targets`` (no trained token
    left after truncation), ``prefix_fallback`` (final turns whose template rendering is not an
    extension of the prompt's; tokenised as prompt + text + eos instead), ``turns_skipped``
    (earlier assistant turns with the same problem under ``all_assistant``).
    """
    if train_on not in ("final", "all_assistant"):
        raise ValueError(f"train_on must be 'final' or 'all_assistant', got {train_on!r}")
    require_chat_template(
        tokenizer,
        "SFT formats conversations with apply_chat_template. Set model.chat_template_source "
        "to a model that has one.",
    )
    stats = dict.fromkeys(
        ("n_in", "n_out", "truncated", "dropped_no_targets", "prefix_fallback", "turns_skipped"),
        0,
    )
    stats["n_in"] = len(records)
    stop_ids = set(end_of_turn_ids(tokenizer))
    eos = tokenizer.eos_token_id
    examples: list[TokenizedSFT] = []
    for batch in chunks(records):
        fulls = chat_template_ids(
            tokenizer, [r.messages for r in batch], add_generation_prompt=False
        )
        # every (record, assistant turn) to mark
        spans = []
        for b, rec in enumerate(batch):
            turns = [i for i, m in enumerate(rec.messages) if m["role"] == "assistant" and i > 0]
            if train_on == "final":
                turns = turns[-1:]
            spans += [(b, i) for i in turns]
        heads = chat_template_ids(tokenizer, [batch[b].messages[:i] for b, i in spans], True)
        upto = chat_template_ids(tokenizer, [batch[b].messages[: i + 1] for b, i in spans], False)
        masks = [[0] * len(f) for f in fulls]
        for (b, i), head, part in zip(spans, heads, upto, strict=True):
            full = fulls[b]
            final_turn = i == len(batch[b].messages) - 1
            if len(part) > len(head) and part[: len(head)] == head and full[: len(part)] == part:
                end = len(part)
                stops = [k for k in range(len(head), end) if part[k] in stop_ids]
                if stops:
                    end = stops[-1] + 1
                for k in range(len(head), end):
                    masks[b][k] = 1
            elif final_turn:
                text = batch[b].messages[i]["content"]
                response = text_ids(tokenizer, text)
                if eos is not None:
                    response.append(eos)
                earlier = masks[b][: len(head)] if full[: len(head)] == head else [0] * len(head)
                fulls[b] = head + response
                masks[b] = earlier + [1] * len(response)
                stats["prefix_fallback"] += 1
            else:
                stats["turns_skipped"] += 1
        for b in range(len(batch)):
            ids, mask = fulls[b], masks[b]
            if len(ids) > max_length:
                ids, mask = ids[:max_length], mask[:max_length]
                stats["truncated"] += 1
            ex = TokenizedSFT(input_ids=ids, loss_mask=mask)
            if ex.n_targets == 0:
                stats["dropped_no_targets"] += 1
                continue
            examples.append(ex)
    stats["n_out"] = len(examples)
    if stats["prefix_fallback"] or stats["turns_skipped"]:
        logger.warning(
            "chat template broke the prefix property: %d final turn(s) tokenised as text + eos, "
            "%d earlier turn(s) not trained",
            stats["prefix_fallback"],
            stats["turns_skipped"],
        )
    return examples, stats


def longest_tool_demonstration(records: Sequence[SFTRecord], tokenizer) -> int:
    """Tokens of the longest tool demonstration (``meta["tool"]``) among ``records`` through
    the chat template; 0 when there is none. Its system message carries the tool's instructions,
    so it is far longer than a plain demonstration (up to ~255 tokens with ``tiny``'s)."""
    tools = [r.messages for r in records if r.meta.get("tool")]
    longest = 0
    for batch in chunks(tools):
        longest = max([longest, *map(len, chat_template_ids(tokenizer, batch, False))])
    return longest


def collate(examples: Sequence[TokenizedSFT], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` (N, T) long tensors,
    padded to the longest row of this micro-batch (not to ``max_length``)."""
    if not examples:
        raise ValueError("collate got an empty batch")
    input_ids, attention_mask = right_pad([ex.input_ids for ex in examples], pad_id)
    loss_mask, _ = right_pad([ex.loss_mask for ex in examples], 0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
