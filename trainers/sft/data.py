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
  ``<think>reasoning</think>\\n<answer>answer</answer>``), each verified to score 1.0.

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
import random
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from trainers.core.datasets import (  # noqa: F401  (re-exported for the SFT trainer)
    DATA_EXTENSIONS,
    DatasetNotFoundError,
    looks_like_path,
    open_split,
)
from trainers.core.generation import chat_template_ids, end_of_turn_ids
from trainers.core.tasks import (
    SYSTEM_PROMPT,
    TASK_CONFIGS,
    TASK_KITS,
    extract_answer,
    format_response,
    import_reasoning_gym,
    reason_generic,
    score_response,
)
from trainers.sft.config import BUILTIN_DATASET, DEFAULT_BUILTIN_TASKS

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_DATASET",
    "BUILTIN_DEFAULT_SIZE",
    "DEFAULT_BUILTIN_TASKS",
    "DATA_EXTENSIONS",
    "DatasetNotFoundError",
    "SFTRecord",
    "TokenizedSFT",
    "builtin_sft_records",
    "collate",
    "has_tag_format",
    "load_sft_records",
    "looks_like_path",
    "parse_builtin_name",
    "score_record_response",
    "split_train_eval",
    "tokenize_records",
]

BUILTIN_DEFAULT_SIZE = 2000
"""Built-in demonstrations generated when ``max_samples`` is not given."""

T = TypeVar("T")


def builtin_hint() -> str:
    return (
        f"For offline runs use the built-in demonstrations `{BUILTIN_DATASET}` (generated "
        f"from reasoning-gym tasks; `{BUILTIN_DATASET}:spell_backward,chain_sum` picks tasks), "
        "or a local .jsonl/.json/.parquet/.csv file or folder."
    )


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass
class SFTRecord:
    """One conversation, ending with the assistant turn to imitate.

    ``meta`` carries provenance; built-in records hold ``task`` and the reasoning-gym ``entry``
    so generations can be scored with :func:`score_record_response`.
    """

    messages: list[dict]
    meta: dict = field(default_factory=dict)

    @property
    def prompt(self) -> list[dict]:
        """Every message before the final assistant turn (what a sample is generated from)."""
        return self.messages[:-1]

    @property
    def reference(self) -> str:
        """The final assistant turn (the demonstration)."""
        return self.messages[-1]["content"]


def _as_messages(value: Any) -> list[dict]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        out = []
        for msg in value:
            if not isinstance(msg, dict) or "role" not in msg:
                raise ValueError(f"expected chat messages with 'role' and 'content', got {msg!r}")
            out.append({"role": str(msg["role"]), "content": str(msg.get("content") or "")})
        return out
    raise ValueError(f"expected a string or a list of messages, got {type(value).__name__}")


def _end_at_last_assistant(messages: list[dict]) -> list[dict] | None:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return messages[: i + 1]
    return None


def _parse_messages_row(row: dict) -> SFTRecord | None:
    messages = _end_at_last_assistant(_as_messages(row["messages"]))
    if messages is None or len(messages) < 2:
        return None
    return SFTRecord(messages=messages)


def _parse_prompt_completion_row(row: dict) -> SFTRecord | None:
    prompt = _as_messages(row["prompt"])
    completion = row["completion"]
    if isinstance(completion, list):  # conversational: a list holding the assistant message(s)
        messages = _end_at_last_assistant(prompt + _as_messages(completion))
    else:
        messages = prompt + [{"role": "assistant", "content": str(completion or "")}]
    if not messages or len(messages) < 2 or not prompt:
        return None
    return SFTRecord(messages=messages)


def detect_schema(columns: Sequence[str]) -> str:
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
    the file is the split), or ``builtin:reasoning-sft[:task_a,task_b]``. With ``max_samples``
    the rows are shuffled with ``seed`` and the first N usable ones kept (the book took the first
    N rows unshuffled, a biased subset on sorted data). ``stats`` receives ``schema``,
    ``n_rows`` (rows read), ``n_records`` and ``skipped`` (rows without an assistant turn).

    Raises :class:`DatasetNotFoundError` for a missing path or an unreachable hub dataset, and
    ``ValueError`` for an unrecognised schema.
    """
    out = stats if stats is not None else {}
    out.update({"schema": None, "n_rows": 0, "n_records": 0, "skipped": 0})
    if dataset.startswith("builtin:"):
        tasks = parse_builtin_name(dataset) or builtin_tasks
        n = BUILTIN_DEFAULT_SIZE if max_samples is None else max_samples
        # other splits draw from a far-away seed so their questions differ from the train split
        if split != "train":
            seed = seed + 1_000_003 * (1 + zlib.crc32(split.encode()) % 89)
        records = builtin_sft_records(n, seed, tasks, builtin_task_configs)
        out.update({"schema": "builtin", "n_rows": len(records), "n_records": len(records)})
        return records

    ds = _load_hf_dataset(dataset, split)
    if len(ds) == 0:
        raise ValueError(f"dataset {dataset!r} (split {split!r}) has no rows")
    schema = detect_schema(ds.column_names)
    out["schema"] = schema
    parse = _PARSERS[schema]
    if max_samples is None:
        rows: Iterable[dict] = iter(ds)
        limit = len(ds)
    else:
        order = list(range(len(ds)))
        random.Random(seed).shuffle(order)
        rows = (ds[i] for i in order)
        limit = max_samples
    records: list[SFTRecord] = []
    for row in rows:
        if len(records) >= limit:
            break
        out["n_rows"] += 1
        rec = parse(row)
        if rec is None:
            out["skipped"] += 1
            continue
        records.append(rec)
    out["n_records"] = len(records)
    if out["skipped"]:
        logger.warning("%s: skipped %d row(s) without an assistant turn", dataset, out["skipped"])
    return records


def _load_hf_dataset(dataset: str, split: str):
    """Open ``dataset`` (file, folder or hub id) and return one split."""
    return open_split(dataset, split, builtin_hint())


def split_train_eval(records: Sequence[T], eval_size: int, seed: int) -> tuple[list[T], list[T]]:
    """Hold out ``eval_size`` records chosen with ``seed``; both parts keep the input order."""
    n = len(records)
    if not 0 <= eval_size < n:
        raise ValueError(
            f"eval_size ({eval_size}) must be smaller than the number of records ({n})"
        )
    order = list(range(n))
    random.Random(seed + 17).shuffle(order)
    held = set(order[:eval_size])
    return (
        [r for i, r in enumerate(records) if i not in held],
        [r for i, r in enumerate(records) if i in held],
    )


# --------------------------------------------------------------------------------------------
# Built-in demonstrations from reasoning-gym
# --------------------------------------------------------------------------------------------


def parse_builtin_name(dataset: str) -> list[str] | None:
    """``builtin:reasoning-sft:a,b`` -> ["a", "b"]; ``builtin:reasoning-sft`` -> None.
    Raises :class:`DatasetNotFoundError` for any other ``builtin:`` name."""
    name, _, task_spec = dataset.partition(":")[2].partition(":")
    if f"builtin:{name}" != BUILTIN_DATASET:
        raise DatasetNotFoundError(
            f"unknown built-in dataset {dataset!r}; the built-in SFT set is {BUILTIN_DATASET!r} "
            f"(optionally {BUILTIN_DATASET}:task_a,task_b)"
        )
    tasks = [t.strip() for t in task_spec.split(",") if t.strip()]
    return tasks or None


def task_settings(task: str, overrides: dict[str, dict] | None = None) -> dict:
    """reasoning-gym settings of ``task``: TASK_CONFIGS, updated by ``overrides[task]``."""
    return {**TASK_CONFIGS.get(task, {}), **(overrides or {}).get(task, {})}


def builtin_sft_records(
    n: int,
    seed: int,
    tasks: Sequence[str] | None = None,
    task_configs: dict[str, dict] | None = None,
) -> list[SFTRecord]:
    """``n`` demonstrations generated offline from reasoning-gym, deterministic in the inputs.

    Tasks take equal shares (round-robin), questions are unique within the set (unless a task's
    settings allow fewer distinct questions than its share: then it repeats, with a warning), and
    every demonstration's answer is checked with the task's own scorer (1.0 required). The result is
    shuffled. ``meta`` = ``{"task", "entry": {question, answer, metadata}}``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    tasks = list(tasks) if tasks else list(DEFAULT_BUILTIN_TASKS)
    rg = import_reasoning_gym()
    per_task = -(-n // len(tasks)) if n else 0
    sources = {}
    for t_idx, name in enumerate(tasks):
        try:
            sources[name] = rg.create_dataset(
                name,
                seed=seed + 100_003 * t_idx,
                size=max(4 * per_task + 64, 64),
                **task_settings(name, task_configs),
            )
        except Exception as err:
            raise ValueError(f"cannot build reasoning-gym task {name!r}: {err}") from err

    cursors = dict.fromkeys(tasks, 0)
    seen: set[str] = set()
    exhausted: set[str] = set()  # tasks whose distinct questions ran out: repeats allowed
    records: list[SFTRecord] = []
    for i in range(n):
        name = tasks[i % len(tasks)]
        ds = sources[name]
        reason = TASK_KITS.get(name, (reason_generic, None))[0]
        while True:
            if cursors[name] >= len(ds):
                if name in exhausted:
                    raise ValueError(f"reasoning-gym task {name!r}: no answer scores 1.0")
                logger.warning(
                    "reasoning-gym task %r has fewer than %d distinct questions with these "
                    "settings; the built-in set repeats some (held-out ones may occur in training)",
                    name,
                    per_task,
                )
                exhausted.add(name)
                cursors[name] = 0
            entry = ds[cursors[name]]
            cursors[name] += 1
            if entry["question"] in seen and name not in exhausted:
                continue
            answer = str(entry["answer"])
            response = format_response(reason(entry, answer), answer)
            if ds.score_answer(extract_answer(response), entry) == 1.0:
                break
        seen.add(entry["question"])
        records.append(
            SFTRecord(
                messages=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": entry["question"]},
                    {"role": "assistant", "content": response},
                ],
                meta={
                    "task": name,
                    "entry": {
                        "question": entry["question"],
                        "answer": answer,
                        "metadata": entry["metadata"],
                    },
                },
            )
        )
    random.Random(seed).shuffle(records)
    return records


_TAG_FORMAT = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)


def has_tag_format(text: str) -> bool:
    """True when ``text`` is exactly one ``<think>…</think>`` block then one non-empty
    ``<answer>…</answer>`` block (surrounding whitespace allowed, nothing else)."""
    text = text.strip()
    match = _TAG_FORMAT.fullmatch(text)
    if match is None or not match.group(2).strip():
        return False
    return all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>"))


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
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the tokenizer has no chat template; SFT formats conversations with "
            "apply_chat_template. Set model.chat_template_source to a model that has one."
        )
    stats = dict.fromkeys(
        ("n_in", "n_out", "truncated", "dropped_no_targets", "prefix_fallback", "turns_skipped"),
        0,
    )
    stats["n_in"] = len(records)
    stop_ids = set(end_of_turn_ids(tokenizer))
    eos = tokenizer.eos_token_id
    examples: list[TokenizedSFT] = []
    chunk = 256
    for start in range(0, len(records), chunk):
        batch = records[start : start + chunk]
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
                response = list(tokenizer(text, add_special_tokens=False)["input_ids"])
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


def collate(examples: Sequence[TokenizedSFT], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` (N, T) long tensors,
    padded to the longest row of this micro-batch (not to ``max_length``)."""
    if not examples:
        raise ValueError("collate got an empty batch")
    width = max(len(ex.input_ids) for ex in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, ex in enumerate(examples):
        n = len(ex.input_ids)
        input_ids[row, :n] = torch.tensor(ex.input_ids, dtype=torch.long)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(ex.loss_mask, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
