"""Process reward model (PRM) data: solutions whose every step is rated.

Rows follow PRM800K (``tasksource/PRM800K``, ``openai/prm800k``): ``question.problem`` and
``label.steps[]``, each step with ``completions[]`` (``text``, ``rating`` in {−1, 0, 1},
``flagged``), ``human_completion`` and ``chosen_completion``. We follow the labelled trajectory:
at each step the chosen completion, else the human-written step (rated +1 by the dataset's
definition when it carries no rating), else — the step where labelling stopped — the
lowest-rated completion, which ends the solution. The book instead appended *every* rated
alternative of a step one after the other, which mixes alternatives into one incoherent trace.
A simpler row form ``{"problem": str, "steps": [str], "ratings": [int|null]}`` is also read.

Text format (the book's): ``"Problem: {problem}\\nReasoning trace:\\n"`` followed by each
step as ``step.strip() + separator``; the separator (``data.step_separator``, default
``"\\n<step>\\n"``) is tokenised on its own, and the **last token of each step's separator**
carries that step's label. Classes: 3 labels = {−1: bad 0, 0: neutral 1, +1: good 2}; 2 labels =
{−1: bad 0, 0 and +1: not bad 1}. Unknown or missing ratings are unlabelled (ignored by the
loss; the book mapped them to neutral). A solution longer than ``max_length`` is split into
windows: each window repeats the problem, labels a run of consecutive steps and fills the
remaining budget with as many of the steps just before them as fit (the book's chunks dropped
that context). The offline set ``builtin:reasoning-steps`` comes from
:func:`trainers.core.builtin_data.builtin_step_records`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainers.core.builtin_data import PRM_TASK_CONFIG, builtin_step_records
from trainers.core.datasets import is_hub_error, looks_like_path
from trainers.core.records import StepRecord
from trainers.core.reward_model import PRM_PROMPT, encode_solution, window_solution
from trainers.core.splits import collect_records, shuffled, split_seed
from trainers.core.tokenization import right_pad
from trainers.reward_models.config import BUILTIN_STEPS
from trainers.reward_models.sources import builtin_tasks, hub_error, read_rows

__all__ = [
    "PRM_PROMPT",
    "StepExample",
    "StepRecord",
    "builtin_step_records",
    "collate_steps",
    "encode_solution",
    "load_step_records",
    "parse_prm800k_row",
    "rating_to_class",
    "tokenize_steps",
    "window_solution",
]


@dataclass
class StepExample:
    """One window of a solution: ids, the separator positions it labels, their classes.
    ``solution`` = index of the solution, ``first_step`` = index of the first labelled step."""

    input_ids: list[int]
    positions: list[int]
    labels: list[int]
    solution: int
    first_step: int


def _stream_prm800k(dataset: str, split: str, limit: int | None) -> list[dict]:
    """PRM800K on the hub is a set of jsonl files (``phase1_<split>.jsonl``,
    ``phase2_<split>.jsonl``) that the ``datasets`` JSON loader cannot cast; stream them line by
    line (as the book does) until ``limit`` usable rows, else fall back to ``datasets``."""
    from huggingface_hub import HfFileSystem

    try:
        fs = HfFileSystem()
        files = [f"datasets/{dataset}/phase{p}_{split}.jsonl" for p in (1, 2)]
        files = [f for f in files if fs.exists(f)]
    except Exception as err:
        if is_hub_error(err):
            raise hub_error(dataset, "prm", err) from err
        raise
    if not files:
        return read_rows(dataset, split, "prm")
    rows: list[dict] = []
    for name in files:
        with fs.open(name, "r") as fh:
            for line in fh:
                if limit is not None and len(rows) >= limit:
                    return rows
                if line.strip():
                    row = json.loads(line)
                    if parse_prm800k_row(row) is not None:
                        rows.append(row)
    return rows


_PROBLEM_KEYS = ("problem", "question", "prompt", "problem_statement", "content")


def _int_rating(value: Any) -> int | None:
    """A whole-number rating, or None for anything else (booleans included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None


def _problem_of(row: dict) -> str | None:
    """The problem text of a PRM800K or simple row, or None."""
    question = row.get("question")
    if isinstance(question, dict):
        for key in _PROBLEM_KEYS:
            if isinstance(question.get(key), str) and question[key].strip():
                return question[key]
    if isinstance(question, str) and question.strip():
        return question
    for key in ("problem", "prompt"):
        if isinstance(row.get(key), str) and row[key].strip():
            return row[key]
    return None


def parse_prm800k_row(row: dict) -> StepRecord | None:
    """A PRM800K row (or the simple ``problem/steps/ratings`` form) -> the labelled trajectory
    as a :class:`StepRecord`, or None when it has no problem or no step."""
    problem = _problem_of(row)
    if problem is None:
        return None
    if isinstance(row.get("steps"), list):  # the simple form
        steps = [str(s) for s in row["steps"]]
        ratings = row.get("ratings", row.get("labels"))
        if ratings is None or len(ratings) != len(steps):
            return None
        ratings = [_int_rating(r) for r in ratings]
        return StepRecord(problem, steps, ratings, {"format": "simple"}) if steps else None

    label = row.get("label")
    if not isinstance(label, dict) or not isinstance(label.get("steps"), list):
        return None
    steps: list[str] = []
    ratings: list[int | None] = []
    for step in label["steps"]:
        comps = [c for c in (step.get("completions") or []) if isinstance(c, dict)]
        chosen = step.get("chosen_completion")
        human = step.get("human_completion")
        if isinstance(chosen, int) and 0 <= chosen < len(comps) and comps[chosen].get("text"):
            steps.append(str(comps[chosen]["text"]))
            ratings.append(_int_rating(comps[chosen].get("rating")))
            continue
        if human:
            text = human.get("text") if isinstance(human, dict) else str(human)
            if text:
                rating = _int_rating(human.get("rating")) if isinstance(human, dict) else None
                steps.append(str(text))
                ratings.append(1 if rating is None else rating)  # human steps are +1 (PRM800K)
                continue
        rated = [c for c in comps if c.get("text") and _int_rating(c.get("rating")) is not None]
        if rated:  # where labelling stopped: the worst-rated alternative ends the solution
            worst = min(rated, key=lambda c: _int_rating(c["rating"]))
            steps.append(str(worst["text"]))
            ratings.append(_int_rating(worst["rating"]))
        break
    if not steps:
        return None
    meta = {"format": "prm800k", "finish_reason": label.get("finish_reason")}
    return StepRecord(problem, steps, ratings, meta)


def load_step_records(
    dataset: str,
    split: str = "train",
    max_samples: int | None = None,
    seed: int = 42,
    *,
    stats: dict | None = None,
    task_configs: dict[str, dict] | None = None,
) -> list[StepRecord]:
    """PRM records (one per solution). ``builtin:reasoning-steps`` generates ``max_samples``
    solutions offline (``task_configs["chain_sum"]`` updates its chain-sum settings,
    ``PRM_TASK_CONFIG``); a local file/folder is read whole, shuffled with ``seed`` and cut to
    ``max_samples``; a hub dataset with PRM800K's ``phase{1,2}_<split>.jsonl`` files is streamed
    in file order until ``max_samples`` usable rows (as the book), then shuffled."""
    out = stats if stats is not None else {}
    if dataset.startswith("builtin:"):
        builtin_tasks(dataset, BUILTIN_STEPS)
        n = 1000 if max_samples is None else max_samples
        chain = (task_configs or {}).get("chain_sum")
        config = {**PRM_TASK_CONFIG, **chain} if chain else None
        records = builtin_step_records(n, split_seed(seed, split), task_config=config)
        out.update({"n_rows": len(records), "n_records": len(records), "skipped": 0})
        return records
    path = Path(dataset).expanduser()
    if path.exists() or looks_like_path(dataset):
        rows = shuffled(read_rows(dataset, split, "prm"), seed)
    else:
        rows = shuffled(_stream_prm800k(dataset, split, max_samples), seed)
    records, n_rows, skipped = collect_records(rows, parse_prm800k_row, max_samples)
    if not records:
        raise ValueError(
            f"dataset {dataset!r} gave no PRM rows: each row needs question.problem and "
            "label.steps[].completions[] with text and rating (PRM800K), or problem/steps/ratings"
        )
    out.update({"n_rows": n_rows, "n_records": len(records), "skipped": skipped})
    return records


def rating_to_class(rating: int | None, num_labels: int = 3) -> int:
    """PRM800K rating -> class index; −100 (ignored) for a missing or unknown rating.
    3 labels: −1 -> 0 (bad), 0 -> 1 (neutral), +1 -> 2 (good).
    2 labels: −1 -> 0 (bad), 0 and +1 -> 1 (not bad)."""
    table = {3: {-1: 0, 0: 1, 1: 2}, 2: {-1: 0, 0: 1, 1: 1}}[num_labels]
    return table.get(rating, -100) if rating is not None else -100


def tokenize_steps(
    records: Sequence[StepRecord],
    tokenizer: Any,
    max_length: int,
    separator: str,
    num_labels: int = 3,
) -> tuple[list[StepExample], dict]:
    """:class:`StepExample` windows of every solution (see :func:`window_solution`); windows
    with no labelled step are left out. Stats: ``n_solutions``, ``n_out`` (windows),
    ``split_solutions`` (solutions that needed several windows), ``truncated_solutions``,
    ``dropped_solutions`` (nothing labelled left), ``n_steps`` (labelled)."""
    stats = {
        "n_solutions": len(records),
        "n_out": 0,
        "split_solutions": 0,
        "truncated_solutions": 0,
        "dropped_solutions": 0,
        "n_steps": 0,
    }
    examples: list[StepExample] = []
    for s_idx, rec in enumerate(records):
        prompt, pieces = encode_solution(tokenizer, rec.problem, rec.steps, separator)
        windows, truncated = window_solution(prompt, pieces, max_length)
        stats["truncated_solutions"] += int(truncated)
        stats["split_solutions"] += int(len(windows) > 1)
        kept = 0
        for ids, positions, first, end in windows:
            labels = [rating_to_class(r, num_labels) for r in rec.ratings[first:end]]
            if all(y == -100 for y in labels):
                continue
            examples.append(StepExample(ids, positions, labels, s_idx, first))
            stats["n_steps"] += sum(1 for y in labels if y != -100)
            kept += 1
        stats["dropped_solutions"] += int(kept == 0)
    stats["n_out"] = len(examples)
    return examples, stats


def collate_steps(examples: Sequence[StepExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Batch of windows + the flat list of labelled positions: ``rows``/``positions`` index
    (batch row, token) of every step label, ``labels`` their classes."""
    if not examples:
        raise ValueError("collate_steps got an empty batch")
    ids, mask = right_pad([ex.input_ids for ex in examples], pad_id)
    rows = [r for r, ex in enumerate(examples) for _ in ex.positions]
    positions = [p for ex in examples for p in ex.positions]
    labels = [y for ex in examples for y in ex.labels]
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "rows": torch.tensor(rows, dtype=torch.long),
        "positions": torch.tensor(positions, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
    }
