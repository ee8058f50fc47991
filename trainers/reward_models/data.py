"""Data for the three reward-model kinds: loading, offline generators, tokenisation, collation.

**Preference** data is the direct-alignment family's (``trainers.direct_alignment.data``):
``load_preference_records`` (UltraFeedback, HH, plain pairs; hub, file or folder) and the offline
``builtin:reasoning-preferences`` set, tokenised by its ``tokenize_records`` (chat template, prompt
cut from the left, pairs identical after truncation dropped). Nothing is re-implemented here.

**ORM** rows (one prompt, several labelled completions). Accepted columns:

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
  reference solution (label 1) and a copy whose final ``####`` number is perturbed (label 0) —
  the book's earlier "correct vs perturbed final answer" check.

Only the first ``rollouts_per_prompt`` completions of a row are kept (label-blind, as the book).
The train / eval split is made over prompts, so a prompt never appears on both sides.
Sequences longer than ``max_length`` are dropped, not truncated (truncation would cut the final
answer the label is about), and counted.

**PRM** rows follow PRM800K (``tasksource/PRM800K``, ``openai/prm800k``): ``question.problem``
and ``label.steps[]``, each step with ``completions[]`` (``text``, ``rating`` in {−1, 0, 1},
``flagged``), ``human_completion`` and ``chosen_completion``. We follow the labelled trajectory:
at each step the chosen completion, else the human-written step (rated +1 by the dataset's
definition when it carries no rating), else — the step where labelling stopped — the
lowest-rated completion, which ends the solution. The book instead appended *every* rated
alternative of a step one after the other, which mixes alternatives into one incoherent trace.
A simpler row form ``{"problem": str, "steps": [str], "ratings": [int|null]}`` is also read.

PRM text format (the book's): ``"Problem: {problem}\\nReasoning trace:\\n"`` followed by each
step as ``step.strip() + separator``; the separator (``data.step_separator``, default
``"\\n<step>\\n"``) is tokenised on its own, and the **last token of each step's separator**
carries that step's label. Classes: 3 labels = {−1: bad 0, 0: neutral 1, +1: good 2}; 2 labels =
{−1: bad 0, 0 and +1: not bad 1}. Unknown or missing ratings are unlabelled (ignored by the
loss; the book mapped them to neutral). A solution longer than ``max_length`` is split into
windows: each window repeats the problem, labels a run of consecutive steps and fills the
remaining budget with as many of the steps just before them as fit (the book's chunks dropped
that context).
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainers.core.datasets import hub_dataset_error, is_hub_error, looks_like_path
from trainers.core.generation import chat_template_ids
from trainers.core.logprobs import split_rows
from trainers.core.tasks import (
    SYSTEM_PROMPT,
    TASK_CONFIGS,
    TASK_KITS,
    extract_answer,
    format_response,
    import_reasoning_gym,
    reason_generic,
    wrong_generic,
)
from trainers.direct_alignment.data import (  # reused as is (see the module docstring)
    DEFAULT_BUILTIN_TASKS,
    DatasetNotFoundError,
    builtin_preference_records,
    load_preference_records,
    split_train_eval,
    tokenize_records,
)
from trainers.reward_models.config import BUILTIN_OUTCOMES, BUILTIN_STEPS

logger = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_OUTCOMES",
    "BUILTIN_STEPS",
    "DatasetNotFoundError",
    "GSM8K_SYSTEM_PROMPT",
    "OutcomeExample",
    "OutcomeRecord",
    "PRM_PROMPT",
    "StepExample",
    "StepRecord",
    "builtin_outcome_records",
    "builtin_preference_records",
    "builtin_step_records",
    "chat_ids",
    "collate_outcomes",
    "collate_pairs",
    "collate_pairs_split",
    "collate_steps",
    "encode_solution",
    "gsm8k_final_answer",
    "load_outcome_records",
    "load_preference_records",
    "load_step_records",
    "parse_outcome_row",
    "parse_prm800k_row",
    "rating_to_class",
    "read_rows",
    "right_pad",
    "split_train_eval",
    "tokenize_outcomes",
    "tokenize_records",
    "tokenize_steps",
    "window_solution",
]

GSM8K_SYSTEM_PROMPT = (
    "Solve the math problem step by step. End with exactly one line in the form #### <number>. "
    "Do not write anything after that line."
)
"""System prompt of the book's GSM8K rollouts, used for ORM rows whose prompt is a string."""

PRM_PROMPT = "Problem: {problem}\nReasoning trace:\n"

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}

# ---------------------------------------------------------------------------------------------
# Records and tokenised examples
# ---------------------------------------------------------------------------------------------


@dataclass
class OutcomeRecord:
    """One prompt (chat messages) with its completions and 0/1 correctness labels."""

    prompt: list[dict]
    completions: list[str]
    labels: list[int]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.labels):
            raise ValueError(
                f"{len(self.completions)} completions but {len(self.labels)} labels in one row"
            )


@dataclass
class StepRecord:
    """One solution: the problem, its steps in order and each step's rating (−1/0/1, None)."""

    problem: str
    steps: list[str]
    ratings: list[int | None]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.steps) != len(self.ratings):
            raise ValueError(f"{len(self.steps)} steps but {len(self.ratings)} ratings")


@dataclass
class OutcomeExample:
    """Prompt + completion ids of one completion; ``group`` = index of its prompt."""

    input_ids: list[int]
    prompt_len: int
    label: int
    group: int


@dataclass
class StepExample:
    """One window of a solution: ids, the separator positions it labels, their classes.
    ``solution`` = index of the solution, ``first_step`` = index of the first labelled step."""

    input_ids: list[int]
    positions: list[int]
    labels: list[int]
    solution: int
    first_step: int


# ---------------------------------------------------------------------------------------------
# Reading rows from files, folders and the hub
# ---------------------------------------------------------------------------------------------


def _hint(kind: str) -> str:
    builtin = {"orm": BUILTIN_OUTCOMES, "prm": BUILTIN_STEPS}[kind]
    return (
        f"For offline runs use `{builtin}`, or a local .jsonl/.json/.parquet/.csv file or folder."
    )


def _read_json_file(path: Path) -> list[dict]:
    """Rows of a .jsonl file (or a .json list). Read with ``json`` rather than ``datasets``:
    nested, ragged schemas such as PRM800K's make the ``datasets`` JSON loader fail to cast."""
    text = path.read_text()
    stripped = text.lstrip()
    if path.suffix.lower() == ".json" and stripped.startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{n}: not valid JSON ({err})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every row must be a JSON object")
    return rows


def _hub_error(dataset: str, kind: str, err: BaseException) -> DatasetNotFoundError:
    return hub_dataset_error(dataset, err, _hint(kind))


def read_rows(dataset: str, split: str, kind: str) -> list[dict]:
    """Every row of a local file / folder or a hub dataset split, as dicts."""
    path = Path(dataset).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".json", ".jsonl"):
            return _read_json_file(path)
        if suffix not in _FILE_BUILDERS:
            raise ValueError(
                f"unsupported data file {str(path)!r}: expected one of {sorted(_FILE_BUILDERS)}"
            )
        import datasets

        ds = datasets.load_dataset(
            _FILE_BUILDERS[suffix], data_files={"train": str(path)}, split="train"
        )
        return list(ds)
    if path.is_dir():
        import datasets

        return list(datasets.load_dataset(str(path), split=split))
    if looks_like_path(dataset):
        raise DatasetNotFoundError(
            f"dataset path {dataset!r} does not exist (resolved to {str(path.absolute())!r}). "
            + _hint(kind)
        )
    import datasets

    try:
        return list(datasets.load_dataset(dataset, split=split))
    except Exception as err:
        if is_hub_error(err):
            raise _hub_error(dataset, kind, err) from err
        raise


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
            raise _hub_error(dataset, "prm", err) from err
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


def _shuffled(rows: Sequence[dict], seed: int) -> list[dict]:
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in order]


# ---------------------------------------------------------------------------------------------
# ORM: GSM8K-style rows and labelled completions
# ---------------------------------------------------------------------------------------------

_FINAL_RE = re.compile(r"####\s*([^\n]*)")


def _normalise_number(text: str) -> str:
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


def _as_messages(value: Any) -> list[dict]:
    if isinstance(value, str):
        return [
            {"role": "system", "content": GSM8K_SYSTEM_PROMPT},
            {"role": "user", "content": value.strip()},
        ]
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value):
        return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in value]
    raise ValueError(f"a prompt must be a string or a list of chat messages, got {value!r:.80}")


def _as_label(value: Any) -> int:
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
    prompt = _as_messages(prompt_value)
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
) -> list[OutcomeRecord]:
    """ORM records (one per prompt). ``builtin:reasoning-outcomes[:task_a,task_b]`` generates
    ``max_samples`` prompts offline; otherwise rows are shuffled with ``seed`` and the first
    ``max_samples`` usable ones are kept. ``stats`` gets ``n_rows``, ``n_records``, ``skipped``,
    ``labels_from_answer``, ``generated_from_answer``, ``short_rows`` (fewer completions than
    ``rollouts_per_prompt``)."""
    out = stats if stats is not None else {}
    if dataset.startswith("builtin:"):
        tasks = _builtin_tasks(dataset, BUILTIN_OUTCOMES)
        n = 500 if max_samples is None else max_samples
        records = builtin_outcome_records(n, _split_seed(seed, split), rollouts_per_prompt, tasks)
        out.update({"n_rows": len(records), "n_records": len(records), "skipped": 0})
        return records
    rows = _shuffled(read_rows(dataset, split, "orm"), seed)
    counts: dict[str, int] = {}
    records, skipped, n_rows = [], 0, 0
    for row in rows:
        if max_samples is not None and len(records) >= max_samples:
            break
        n_rows += 1
        rec = parse_outcome_row(row, rollouts_per_prompt, counts)
        if rec is None:
            skipped += 1
            continue
        records.append(rec)
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


# ---------------------------------------------------------------------------------------------
# PRM: PRM800K-style rows
# ---------------------------------------------------------------------------------------------

_PROBLEM_KEYS = ("problem", "question", "prompt", "problem_statement", "content")


def _int_rating(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None


def _problem_of(row: dict) -> str | None:
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
) -> list[StepRecord]:
    """PRM records (one per solution). ``builtin:reasoning-steps`` generates ``max_samples``
    solutions offline; a local file/folder is read whole, shuffled with ``seed`` and cut to
    ``max_samples``; a hub dataset with PRM800K's ``phase{1,2}_<split>.jsonl`` files is streamed
    in file order until ``max_samples`` usable rows (as the book), then shuffled."""
    out = stats if stats is not None else {}
    if dataset.startswith("builtin:"):
        _builtin_tasks(dataset, BUILTIN_STEPS)
        n = 1000 if max_samples is None else max_samples
        records = builtin_step_records(n, _split_seed(seed, split))
        out.update({"n_rows": len(records), "n_records": len(records), "skipped": 0})
        return records
    path = Path(dataset).expanduser()
    if path.exists() or looks_like_path(dataset):
        rows = _shuffled(read_rows(dataset, split, "prm"), seed)
    else:
        rows = _shuffled(_stream_prm800k(dataset, split, max_samples), seed)
    records, skipped, n_rows = [], 0, 0
    for row in rows:
        if max_samples is not None and len(records) >= max_samples:
            break
        n_rows += 1
        rec = parse_prm800k_row(row)
        if rec is None:
            skipped += 1
            continue
        records.append(rec)
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


# ---------------------------------------------------------------------------------------------
# Offline generators (reasoning-gym)
# ---------------------------------------------------------------------------------------------


def _split_seed(seed: int, split: str) -> int:
    """Other splits draw from far-away seeds so their items do not repeat the train items."""
    return seed if split == "train" else seed + 1_000_003 * (1 + zlib.crc32(split.encode()) % 89)


def _builtin_tasks(dataset: str, expected: str) -> list[str] | None:
    name, _, spec = dataset.partition(":")[2].partition(":")
    if f"builtin:{name}" != expected:
        raise DatasetNotFoundError(
            f"unknown built-in dataset {dataset!r}; expected {expected!r}"
            + (" (optionally with :task_a,task_b)" if expected == BUILTIN_OUTCOMES else "")
        )
    tasks = [t.strip() for t in spec.split(",") if t.strip()]
    if tasks and expected == BUILTIN_STEPS:
        raise DatasetNotFoundError(f"{BUILTIN_STEPS} takes no task list (it uses chain_sum)")
    return tasks or None


_LEADS = ("", "Let me check each part. ", "Step by step. ")
_INCORRECT_KINDS = ("wrong_answer", "no_tags", "answer_outside_tags", "truncated")
_INCORRECT_WEIGHTS = (0.4, 0.2, 0.2, 0.2)


def _incorrect_completion(ds, entry, reason, wrong, rng) -> tuple[str, str]:
    """A plausible incorrect completion and its kind; reasoning-gym scores it below 1."""
    answer = str(entry["answer"])
    wrongs = list(dict.fromkeys(c for c in wrong(entry, rng) if c and c != answer))
    kind = rng.choices(_INCORRECT_KINDS, weights=_INCORRECT_WEIGHTS)[0]
    if kind == "wrong_answer":
        rng.shuffle(wrongs)
        for cand in wrongs:
            text = format_response(reason(entry, cand), cand)
            if ds.score_answer(extract_answer(text), entry) < 1.0:
                return text, kind
        kind = "no_tags"
    stated = rng.choice(wrongs) if wrongs and rng.random() < 0.5 else answer
    if kind == "no_tags":
        text = f"{reason(entry, stated)} The answer is {stated}."
    elif kind == "answer_outside_tags":
        text = f"<think>{reason(entry, stated)}</think>\n{stated}"
    else:  # truncated: stops inside the reasoning, no answer
        body = reason(entry, stated)
        text = f"<think>{body[: max(1, len(body) // 2)]}"
    return text, kind


def builtin_outcome_records(
    n: int, seed: int, completions_per_prompt: int = 4, tasks: Sequence[str] | None = None
) -> list[OutcomeRecord]:
    """``n`` prompts from reasoning-gym tasks (default: spell_backward, chain_sum,
    letter_counting, in equal shares), each with ``completions_per_prompt`` completions in the
    ``<think>``/``<answer>`` format: between 1 and k−1 correct ones (short worked reasoning and
    the right answer) and the rest incorrect — a wrong answer with reasoning that leads to it
    (40 %), no tags (20 %), the answer outside the tags (20 %), or a completion cut off inside
    its reasoning (20 %). Every completion's reasoning opens with a lead-in sentence drawn from
    the same list whatever its label, so the lead-in says nothing about correctness.

    Every label is reasoning-gym's verdict (1 iff it scores the extracted answer 1.0); each
    prompt has both classes, so ranking accuracy is defined. Deterministic in
    ``(n, seed, completions_per_prompt, tasks)``; ``meta`` holds ``task``, ``entry`` and each
    completion's ``kinds``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if completions_per_prompt < 2:
        raise ValueError("completions_per_prompt must be >= 2 (one correct, one incorrect)")
    tasks = list(tasks) if tasks else list(DEFAULT_BUILTIN_TASKS)
    rg = import_reasoning_gym()
    rng = random.Random(seed)
    per_task = -(-n // len(tasks)) if n else 0
    sets = {}
    for t_idx, name in enumerate(tasks):
        try:
            sets[name] = rg.create_dataset(
                name,
                seed=seed + 7919 * (t_idx + 1),
                size=max(2 * per_task + 16, 16),
                **TASK_CONFIGS.get(name, {}),
            )
        except Exception as err:
            raise ValueError(f"cannot build reasoning-gym task {name!r}: {err}") from err
    cursors = dict.fromkeys(tasks, 0)
    records = []
    for i in range(n):
        name = tasks[i % len(tasks)]
        ds = sets[name]
        reason, wrong = TASK_KITS.get(name, (reason_generic, wrong_generic))
        while True:
            entry = ds[cursors[name]]
            cursors[name] += 1
            answer = str(entry["answer"])
            if ds.score_answer(answer, entry) == 1.0:
                break
            if cursors[name] >= len(ds):
                raise ValueError(f"reasoning-gym task {name!r}: its own answers do not score 1.0")
        n_correct = rng.randint(1, completions_per_prompt - 1)
        items = []
        for j in range(completions_per_prompt):
            lead = rng.choice(_LEADS)  # the same lead-ins for both classes: no shortcut

            def led(e, final, lead=lead, reason=reason):
                return lead + reason(e, final)

            if j < n_correct:
                items.append((format_response(led(entry, answer), answer), "correct"))
            else:
                items.append(_incorrect_completion(ds, entry, led, wrong, rng))
        rng.shuffle(items)
        texts = [t for t, _ in items]
        labels = [int(ds.score_answer(extract_answer(t), entry) == 1.0) for t in texts]
        records.append(
            OutcomeRecord(
                prompt=[
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": entry["question"]},
                ],
                completions=texts,
                labels=labels,
                meta={
                    "task": name,
                    "entry": {
                        "question": entry["question"],
                        "answer": answer,
                        "metadata": entry["metadata"],
                    },
                    "kinds": [k for _, k in items],
                },
            )
        )
    return records


PRM_TASK_CONFIG = {"min_terms": 3, "max_terms": 5, "min_digits": 1, "max_digits": 1}
_NEUTRAL_STEPS = (
    "I work from left to right, keeping a running total.",
    "Let me combine the terms in order.",
    "I will add and subtract one term at a time.",
)
ERROR_KINDS = ("arithmetic", "operand", "operation")
_ERROR_DELTAS = (-3, -2, -1, 1, 2, 3)


def _worked_chain(
    first: int, ops: list[tuple[str, int]], error_at: int | None, kind: str | None, delta: int
) -> tuple[list[str], list[int], int]:
    """Steps ``"{left} {op} {term} = {result}"`` of a chain sum with the error ``kind``
    injected at operation ``error_at`` (None: a clean solution); ratings +1 before the error,
    −1 from it on. Returns (steps, ratings, final total)."""
    steps, ratings, state, bad = [], [], first, False
    for j, (op, num) in enumerate(ops):
        left, shown = state, op
        if j == error_at:
            bad = True
            if kind == "operand":
                left = state + delta
            elif kind == "operation":
                shown = "*"
        result = left + num if shown == "+" else left - num if shown == "-" else left * num
        if j == error_at and kind == "arithmetic":
            result += delta
        steps.append(f"{left} {shown} {num} = {result}")
        ratings.append(-1 if bad else 1)
        state = result
    return steps, ratings, state


def builtin_step_records(
    n: int,
    seed: int,
    error_rate: float = 0.5,
    neutral_rate: float = 0.5,
    task_config: dict | None = None,
) -> list[StepRecord]:
    """``n`` step-by-step solutions of reasoning-gym ``chain_sum`` problems (3–5 one-digit terms
    by default), one operation per step, ``"{running} {op} {term} = {result}"``, then
    ``"The answer is {final}."``.

    * With probability ``neutral_rate`` a first step restates the method (rated 0, neutral).
    * With probability ``error_rate`` one operation step (uniformly chosen) carries an injected
      error, of one of three kinds in equal shares: ``arithmetic`` (the result is off by 1–3),
      ``operand`` (the running total is miscopied from the previous line, off by 1–3) or
      ``operation`` (the term is multiplied instead of added or subtracted, a misread
      operation). Later steps compute correctly from the wrong value, so the final answer is
      wrong (an ``operation`` error that happens to give the right total becomes
      ``arithmetic``).
    * Ratings: +1 before the error, −1 from the injected step on, the final step included.

    reasoning-gym scores the final answer of a clean solution 1.0 and of a corrupted one below
    1. ``meta``: ``task``, ``entry``, ``final_answer``, ``error_step`` (index into ``steps``, or
    None) and ``error_kind``. Deterministic in its arguments."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rg = import_reasoning_gym()
    ds = rg.create_dataset(
        "chain_sum", seed=seed, size=max(n, 1), **(task_config or PRM_TASK_CONFIG)
    )
    rng = random.Random(seed + 17)
    records = []
    for i in range(n):
        entry = ds[i]
        tokens = entry["metadata"]["expression"].split()
        first = int(tokens[0])
        ops = list(zip(tokens[1::2], (int(t) for t in tokens[2::2]), strict=True))
        lead: list[str] = []
        if rng.random() < neutral_rate:
            lead = [rng.choice(_NEUTRAL_STEPS)]
        has_error = rng.random() < error_rate
        error_at = rng.randrange(len(ops)) if has_error else None
        kind = rng.choice(ERROR_KINDS) if has_error else None
        delta = rng.choice(_ERROR_DELTAS)
        steps, ratings, final = _worked_chain(first, ops, error_at, kind, delta)
        if has_error and str(final) == str(entry["answer"]):
            kind = "arithmetic"
            steps, ratings, final = _worked_chain(first, ops, error_at, kind, delta)
        steps = [*lead, *steps, f"The answer is {final}."]
        ratings = [0] * len(lead) + ratings + [-1 if has_error else 1]
        records.append(
            StepRecord(
                problem=entry["question"],
                steps=steps,
                ratings=ratings,
                meta={
                    "task": "chain_sum",
                    "entry": {
                        "question": entry["question"],
                        "answer": str(entry["answer"]),
                        "metadata": entry["metadata"],
                    },
                    "final_answer": str(final),
                    "error_step": None if error_at is None else len(lead) + error_at,
                    "error_kind": kind,
                },
            )
        )
    return records


# ---------------------------------------------------------------------------------------------
# Tokenisation
# ---------------------------------------------------------------------------------------------


def chat_ids(tokenizer, conversations: list[list[dict]], add_generation_prompt: bool) -> list:
    """Token ids of each conversation through the tokenizer's chat template."""
    if not conversations:
        return []
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the tokenizer has no chat template; reward models format prompts with "
            "apply_chat_template. Use a tokenizer with one or set tokenizer.chat_template."
        )
    return chat_template_ids(tokenizer, conversations, add_generation_prompt)


def tokenize_outcomes(
    records: Sequence[OutcomeRecord], tokenizer, max_length: int
) -> tuple[list[OutcomeExample], dict]:
    """One :class:`OutcomeExample` per completion. ids = the chat template of
    ``prompt + [assistant: completion]`` (so the completion ends with the end-of-turn token(s)),
    split at the length of the prompt's template with the generation prompt. Completions whose
    sequence exceeds ``max_length`` are dropped (``dropped_too_long``)."""
    stats = {"n_completions": 0, "n_out": 0, "dropped_too_long": 0, "prefix_fallback": 0}
    eos = getattr(tokenizer, "eos_token_id", None)
    examples: list[OutcomeExample] = []
    for g, rec in enumerate(records):
        prompt = chat_ids(tokenizer, [rec.prompt], add_generation_prompt=True)[0]
        convs = [rec.prompt + [{"role": "assistant", "content": c}] for c in rec.completions]
        fulls = chat_ids(tokenizer, convs, add_generation_prompt=False)
        for text, full, label in zip(rec.completions, fulls, rec.labels, strict=True):
            stats["n_completions"] += 1
            if not (len(full) > len(prompt) and full[: len(prompt)] == prompt):
                full = prompt + list(tokenizer(text, add_special_tokens=False)["input_ids"])
                full += [eos] if eos is not None else []
                stats["prefix_fallback"] += 1
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


def encode_solution(
    tokenizer, problem: str, steps: Sequence[str], separator: str
) -> tuple[list[int], list[list[int]]]:
    """(prompt ids, [ids of ``step.strip()`` + separator ids for each step]). Pieces are
    tokenised separately, so the separator's tokens are the same after every step and its last
    token marks where the step's label is read."""
    prompt = list(
        tokenizer(PRM_PROMPT.format(problem=problem.strip()), add_special_tokens=False)["input_ids"]
    )
    sep = list(tokenizer(separator, add_special_tokens=False)["input_ids"])
    if not sep:
        raise ValueError(f"the step separator {separator!r} encodes to no token")
    pieces = [
        list(tokenizer(s.strip(), add_special_tokens=False)["input_ids"]) + sep for s in steps
    ]
    return prompt, pieces


def window_solution(
    prompt: list[int], pieces: list[list[int]], max_length: int
) -> tuple[list[tuple[list[int], list[int], int, int]], bool]:
    """Split one encoded solution into windows that fit ``max_length``.

    Each window is (ids, separator positions, first labelled step, end step): the prompt, then
    steps ``[context, end)`` where steps ``[first, end)`` are labelled and steps
    ``[context, first)`` are earlier steps kept as context, as many as fit. Returns the windows
    and whether a step had to be dropped (a single step longer than the budget ends the
    solution there)."""
    budget = max_length - len(prompt)
    windows = []
    start, n = 0, len(pieces)
    while start < n:
        if budget <= 0 or len(pieces[start]) > budget:
            return windows, True
        end, used = start, 0
        while end < n and used + len(pieces[end]) <= budget:
            used += len(pieces[end])
            end += 1
        context = start
        while context > 0 and used + len(pieces[context - 1]) <= budget:
            context -= 1
            used += len(pieces[context])
        ids = list(prompt)
        positions = []
        for k in range(context, end):
            ids.extend(pieces[k])
            if k >= start:
                positions.append(len(ids) - 1)
        windows.append((ids, positions, start, end))
        start = end
    return windows, False


def tokenize_steps(
    records: Sequence[StepRecord],
    tokenizer,
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


# ---------------------------------------------------------------------------------------------
# Collation (right padding to the longest row of the batch)
# ---------------------------------------------------------------------------------------------


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def collate_pairs(examples, pad_id: int) -> dict[str, torch.Tensor]:
    """Direct-alignment ``TokenizedExample`` pairs -> one batch of [all chosen; all rejected]
    sequences (prompt + response), right-padded; the first half are the chosen ones."""
    if not examples:
        raise ValueError("collate_pairs got an empty batch")
    seqs = [ex.prompt_ids + ex.chosen_ids for ex in examples]
    seqs += [ex.prompt_ids + ex.rejected_ids for ex in examples]
    ids, mask = right_pad(seqs, pad_id)
    return {"input_ids": ids, "attention_mask": mask}


def collate_pairs_split(examples, pad_id: int) -> dict[str, torch.Tensor | int]:
    """The rows of :func:`collate_pairs` laid out ``[left-padded prompt | right-padded
    response]`` (``trainers.core.logprobs.split_rows``) so a pair's two rows share one forward
    of its prompt; adds ``prompt_width``."""
    if not examples:
        raise ValueError("collate_pairs got an empty batch")
    prompts = [ex.prompt_ids for ex in examples] * 2
    responses = [ex.chosen_ids for ex in examples] + [ex.rejected_ids for ex in examples]
    ids, mask, _, width_p = split_rows(prompts, responses, pad_id)
    return {"input_ids": ids, "attention_mask": mask, "prompt_width": width_p}


def collate_outcomes(examples: Sequence[OutcomeExample], pad_id: int) -> dict[str, torch.Tensor]:
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
