"""Where reward-model data comes from: local files, folders and hub datasets read as rows, the
``builtin:*`` names of the offline sets, and the chat-template ids every kind tokenises with.
Shared by :mod:`trainers.reward_models.outcome` and :mod:`trainers.reward_models.steps`."""

from __future__ import annotations

from typing import Any

from trainers.core import datasets as core_datasets
from trainers.core.builtin_data import split_builtin_name
from trainers.core.datasets import DatasetNotFoundError, hub_dataset_error
from trainers.core.tokenization import chat_template_ids, require_chat_template
from trainers.reward_models.config import BUILTIN_OUTCOMES, BUILTIN_STEPS

__all__ = ["builtin_tasks", "chat_ids", "hint", "hub_error", "read_rows"]


def hint(kind: str) -> str:
    """The offline alternative to name when an ``orm`` or ``prm`` dataset cannot be opened."""
    builtin = {"orm": BUILTIN_OUTCOMES, "prm": BUILTIN_STEPS}[kind]
    return (
        f"For offline runs use `{builtin}`, or a local .jsonl/.json/.parquet/.csv file or folder."
    )


def hub_error(dataset: str, kind: str, err: BaseException) -> DatasetNotFoundError:
    """The error for a hub dataset of ``kind`` that could not be loaded."""
    return hub_dataset_error(dataset, err, hint(kind))


def read_rows(dataset: str, split: str, kind: str) -> list[dict]:
    """Every row of a local file / folder or a hub dataset split, as dicts
    (:func:`trainers.core.datasets.read_rows` with the hint of ``kind``)."""
    return core_datasets.read_rows(dataset, split, hint(kind))


def builtin_tasks(dataset: str, expected: str) -> list[str] | None:
    """The task list of a ``builtin:`` name, after checking that it names ``expected``
    (the step set takes no task list)."""
    name, tasks = split_builtin_name(dataset)
    if name != expected:
        raise DatasetNotFoundError(
            f"unknown built-in dataset {dataset!r}; expected {expected!r}"
            + (" (optionally with :task_a,task_b)" if expected == BUILTIN_OUTCOMES else "")
        )
    if tasks and expected == BUILTIN_STEPS:
        raise DatasetNotFoundError(f"{BUILTIN_STEPS} takes no task list (it uses chain_sum)")
    return tasks


def chat_ids(tokenizer: Any, conversations: list[list[dict]], add_generation_prompt: bool) -> list:
    """Token ids of each conversation through the tokenizer's chat template."""
    if not conversations:
        return []
    require_chat_template(
        tokenizer,
        "reward models format prompts with apply_chat_template. Use a tokenizer with one or set "
        "tokenizer.chat_template.",
    )
    return chat_template_ids(tokenizer, conversations, add_generation_prompt)
