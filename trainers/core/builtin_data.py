"""The offline ``builtin:*`` datasets of every family, generated from reasoning-gym tasks.

One place for every generator (each deterministic in its arguments):

* :func:`builtin_demonstrations`: demonstrations for SFT (``builtin:reasoning-sft``); the
  calculator-use demonstrations of ``builtin:tool-sft`` are in
  :mod:`trainers.core.tool_demonstrations` (they reuse :func:`next_demonstration`);
* :func:`builtin_preference_records`: chosen/rejected pairs (``builtin:reasoning-preferences``),
  used by direct alignment and preference reward models;
* :func:`builtin_outcome_records`: prompts with labelled completions for ORMs
  (``builtin:reasoning-outcomes``);
* :func:`builtin_step_records`: step-rated chain-sum solutions for PRMs
  (``builtin:reasoning-steps``);
* the prompts of the loops that sample from their policy (a reasoning-gym ``composite`` for
  policy gradients and distillation, task-by-task questions for rejection sampling) are in
  :mod:`trainers.core.prompts`.

The per-task worked reasoning and wrong answers come from :mod:`trainers.core.tasks`. Changing a
draw from a seeded generator here changes every built-in dataset (and what the learning tests
train on): ``tests/trainers/core/test_shared_data.py`` pins a fingerprint of each.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from trainers.core.messages import system_and_user
from trainers.core.records import OutcomeRecord, PreferenceRecord, SFTRecord, StepRecord
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

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_BUILTIN_TASKS",
    "DEMONSTRATION_SET_SIZE",
    "DEMONSTRATION_TASKS",
    "ERROR_KINDS",
    "PRM_TASK_CONFIG",
    "TOOL_DEMONSTRATION_TASKS",
    "TOOL_SFT_DATASET",
    "builtin_demonstrations",
    "default_demonstration_tasks",
    "builtin_outcome_records",
    "builtin_preference_records",
    "builtin_step_records",
    "next_demonstration",
    "split_builtin_name",
    "task_seeds",
    "task_settings",
    "worked_response",
]

DEFAULT_BUILTIN_TASKS: tuple[str, ...] = ("spell_backward", "chain_sum", "letter_counting")
"""Tasks of the built-in preference, demonstration and outcome sets when none are named."""

T = TypeVar("T")
Reason = Callable[[dict, str], str]
Wrong = Callable[[dict, random.Random], list]

# --------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------


def split_builtin_name(dataset: str) -> tuple[str, list[str] | None]:
    """``builtin:name:task_a,task_b`` -> (``builtin:name``, ["task_a", "task_b"]); no task list
    (or an empty one) gives None. Checking the name is the caller's job."""
    name, _, task_spec = dataset.partition(":")[2].partition(":")
    tasks = [t.strip() for t in task_spec.split(",") if t.strip()]
    return f"builtin:{name}", tasks or None


def task_settings(task: str, overrides: dict[str, dict] | None = None) -> dict:
    """reasoning-gym settings of ``task``: TASK_CONFIGS, updated by ``overrides[task]``."""
    return {**TASK_CONFIGS.get(task, {}), **(overrides or {}).get(task, {})}


def per_task_share(n: int, n_tasks: int) -> int:
    """Items each task must supply when ``n`` items are dealt round-robin over ``n_tasks``."""
    return -(-n // n_tasks) if n else 0


def task_seeds(seed: int, n_tasks: int) -> list[int]:
    """A seed per task, far apart (``seed + 100_003·i`` for task ``i``), so that the tasks'
    entries do not follow one another."""
    return [seed + 100_003 * t_idx for t_idx in range(n_tasks)]


def task_datasets(
    tasks: Sequence[str],
    seeds: Sequence[int],
    size: int,
    task_configs: dict[str, dict] | None = None,
) -> dict[str, Any]:
    """One reasoning-gym dataset per task (``seeds[i]`` for ``tasks[i]``), built with the task's
    settings (:func:`task_settings`); a task that cannot be built raises ValueError naming it."""
    rg = import_reasoning_gym()
    out = {}
    for name, seed in zip(tasks, seeds, strict=True):
        try:
            out[name] = rg.create_dataset(
                name, seed=seed, size=size, **task_settings(name, task_configs)
            )
        except Exception as err:  # unknown task name or config
            raise ValueError(f"cannot build reasoning-gym task {name!r}: {err}") from err
    return out


def entry_meta(entry: dict, answer: str) -> dict:
    """The copy of a reasoning-gym entry that records keep (what scoring needs)."""
    return {"question": entry["question"], "answer": answer, "metadata": entry["metadata"]}


def kit_of(task: str) -> tuple[Reason, Wrong]:
    """(worked reasoning, wrong answers) of ``task``; generic ones for tasks without a kit."""
    return TASK_KITS.get(task, (reason_generic, wrong_generic))


def first_wrong_response(
    dataset: Any, entry: dict, reason: Reason, candidates: list[str], rng: random.Random
) -> str | None:
    """Shuffle ``candidates`` (wrong answers) with ``rng`` and return the first well-formed
    response stating one that the task scores below 1; None if every candidate scores 1."""
    rng.shuffle(candidates)
    for cand in candidates:
        text = format_response(reason(entry, cand), cand)
        if dataset.score_answer(extract_answer(text), entry) < 1.0:
            return text
    return None


def distinct_wrongs(entry: dict, wrong: Wrong, rng: random.Random) -> list[str]:
    """The task's wrong answers for ``entry``, without blanks, repeats or the right answer."""
    answer = str(entry["answer"])
    return list(dict.fromkeys(c for c in wrong(entry, rng) if c and c != answer))


# --------------------------------------------------------------------------------------------
# SFT demonstrations
# --------------------------------------------------------------------------------------------


def worked_response(ds: Any, name: str, entry: dict) -> str | None:
    """The worked ``<think>…</think>\n<answer>…</answer>`` response of ``entry`` (task
    ``name``, dataset ``ds``) when it scores 1.0 with the task's scorer; None otherwise."""
    reason = TASK_KITS.get(name, (reason_generic, None))[0]
    answer = str(entry["answer"])
    response = format_response(reason(entry, answer), answer)
    return response if ds.score_answer(extract_answer(response), entry) == 1.0 else None


def next_demonstration(
    ds: Any,
    name: str,
    cursors: dict,
    seen: set,
    exhausted: set,
    per_task: int,
    respond: Callable[[Any, str, dict], T | None] = worked_response,
) -> tuple[dict, T]:
    """The next unseen entry of task ``name`` for which ``respond(ds, name, entry)`` gives a
    demonstration (not None), and that demonstration (by default the worked response, kept
    when it scores 1.0). When the task runs out of distinct questions it starts over (with a
    warning) and repeats are allowed from then on."""
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
        demonstration = respond(ds, name, entry)
        if demonstration is not None:
            return entry, demonstration


def draw_demonstrations(
    n: int,
    seed: int,
    tasks: Sequence[str],
    task_configs: dict[str, dict] | None,
    respond_for: Callable[[int], Callable[[Any, str, dict], T | None]],
) -> list[tuple[str, dict, T]]:
    """``n`` (task, entry, demonstration) triples: tasks take turns, row ``i`` made by
    ``respond_for(i)`` from the next unseen entry it accepts (:func:`next_demonstration`), each
    task's entries drawn with its own seed. Shared by every built-in demonstration set."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not tasks:
        raise ValueError("a demonstration set needs at least one task")
    tasks = list(tasks)
    per_task = per_task_share(n, len(tasks))
    sources = task_datasets(
        tasks, task_seeds(seed, len(tasks)), max(4 * per_task + 64, 64), task_configs
    )
    cursors = dict.fromkeys(tasks, 0)
    seen: set[str] = set()
    exhausted: set[str] = set()
    out: list[tuple[str, dict, T]] = []
    for i in range(n):
        name = tasks[i % len(tasks)]
        entry, made = next_demonstration(
            sources[name], name, cursors, seen, exhausted, per_task, respond_for(i)
        )
        seen.add(entry["question"])
        out.append((name, entry, made))
    return out


def builtin_demonstrations(
    n: int,
    seed: int,
    tasks: Sequence[str],
    task_configs: dict[str, dict] | None = None,
) -> list[SFTRecord]:
    """``n`` demonstrations of ``tasks`` (system = the tag-format instruction, user = the
    question, assistant = ``<think>reasoning</think>\\n<answer>answer</answer>``).

    Tasks take turns; questions are unique within the set unless a task's settings allow fewer
    distinct questions than its share (then it repeats, with a warning); every demonstration's
    answer scores 1.0 with the task's own scorer. The result is shuffled with ``seed``.
    ``meta`` = ``{"task", "entry": {question, answer, metadata}}``.
    """
    drawn = draw_demonstrations(n, seed, tasks, task_configs, lambda i: worked_response)
    records = [
        SFTRecord(
            messages=[
                *system_and_user(SYSTEM_PROMPT, entry["question"]),
                {"role": "assistant", "content": response},
            ],
            meta={"task": name, "entry": entry_meta(entry, str(entry["answer"]))},
        )
        for name, entry, response in drawn
    ]
    random.Random(seed).shuffle(records)
    return records


DEMONSTRATION_TASKS: tuple[str, ...] = ("spell_backward", "chain_sum")
"""Tasks of ``builtin:reasoning-sft`` when neither its name nor ``data.builtin_tasks`` picks any."""

DEMONSTRATION_SET_SIZE = 2000
"""Demonstrations generated when ``max_samples`` is not given."""

TOOL_SFT_DATASET = "builtin:tool-sft"
"""The calculator-use demonstrations (``builtin:tool-sft[:task_a,task_b]``), generated by
:mod:`trainers.core.tool_demonstrations`."""

TOOL_DEMONSTRATION_TASKS: tuple[str, ...] = ("basic_arithmetic", "chain_sum")
"""Tasks of ``builtin:tool-sft`` when neither its name nor ``data.builtin_tasks`` picks any."""


def default_demonstration_tasks(dataset: str) -> tuple[str, ...]:
    """The tasks of a built-in SFT set whose name lists none: :data:`TOOL_DEMONSTRATION_TASKS`
    for ``builtin:tool-sft``, :data:`DEMONSTRATION_TASKS` for ``builtin:reasoning-sft``."""
    if split_builtin_name(dataset)[0] == TOOL_SFT_DATASET:
        return TOOL_DEMONSTRATION_TASKS
    return DEMONSTRATION_TASKS


# --------------------------------------------------------------------------------------------
# Preference pairs
# --------------------------------------------------------------------------------------------

# Mix of rejected kinds: right format + wrong answer, no tags at all, answer outside the tags.
_REJECT_KINDS = ("wrong_answer", "no_tags", "answer_outside_tags")
_REJECT_WEIGHTS = (0.5, 0.25, 0.25)


def _make_rejected(
    dataset: Any, entry: dict, reason: Reason, wrong: Wrong, rng: random.Random
) -> tuple[str, str]:
    """A plausible bad response for ``entry`` and its kind; it always scores < 1."""
    answer = str(entry["answer"])
    kind = rng.choices(_REJECT_KINDS, weights=_REJECT_WEIGHTS)[0]
    if kind == "wrong_answer":
        text = first_wrong_response(dataset, entry, reason, distinct_wrongs(entry, wrong, rng), rng)
        if text is not None:
            return text, kind
        kind = "no_tags"  # no perturbation scored below 1: fall back to a format error
    # Format errors: the stated answer is right or wrong at random; without <answer> tags the
    # extracted answer is None, so the response scores 0 either way.
    stated = answer
    if rng.random() < 0.5:
        cands = [c for c in wrong(entry, rng) if c and c != answer]
        if cands:
            stated = rng.choice(cands)
    if kind == "no_tags":
        text = stated if rng.random() < 0.5 else f"The answer is {stated}."
    else:
        text = f"<think>{reason(entry, stated)}</think>\n{stated}"
    assert dataset.score_answer(extract_answer(text), entry) < 1.0
    return text, kind


def _next_scoring_entry(ds: Any, name: str, cursors: dict, misses: list[int], n: int) -> dict:
    """The next entry of task ``name`` whose worked response scores 1.0 (``misses[0]`` counts
    the failures across the whole set; too many means the task's answers are unusable)."""
    reason = kit_of(name)[0]
    while True:
        entry = ds[cursors[name]]
        cursors[name] += 1
        answer = str(entry["answer"])
        chosen = format_response(reason(entry, answer), answer)
        if ds.score_answer(extract_answer(chosen), entry) == 1.0:
            return entry
        misses[0] += 1
        if misses[0] > n + 100:
            raise ValueError(f"reasoning-gym task {name!r}: its own answers do not score 1.0")


def builtin_preference_records(
    n: int, seed: int, tasks: list[str] | None = None, settings: dict[str, dict] | None = None
) -> list[PreferenceRecord]:
    """``n`` preference records: prompt = the tag-format instruction + a task question; chosen
    = short correct reasoning in ``<think>`` and the right answer in ``<answer>`` (scores 1.0);
    rejected = the right format with a wrong answer (half of the records), no tags at all, or
    the answer outside the tags (scores < 1). Tasks take equal shares; the result is shuffled
    and depends only on ``(n, seed, tasks, settings)``; ``settings[task]`` updates that task's
    reasoning-gym settings (:func:`task_settings`). ``meta``: ``task``, ``entry``,
    ``rejected_kind``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    tasks = list(tasks) if tasks else list(DEFAULT_BUILTIN_TASKS)
    rng = random.Random(seed)
    per_task = per_task_share(n, len(tasks))
    sources = task_datasets(
        tasks, task_seeds(seed, len(tasks)), max(2 * per_task + 16, 16), settings
    )
    cursors = dict.fromkeys(tasks, 0)
    records: list[PreferenceRecord] = []
    misses = [0]
    for i in range(n):
        name = tasks[i % len(tasks)]
        ds = sources[name]
        reason, wrong = kit_of(name)
        entry = _next_scoring_entry(ds, name, cursors, misses, n)
        answer = str(entry["answer"])
        chosen = format_response(reason(entry, answer), answer)
        rejected, kind = _make_rejected(ds, entry, reason, wrong, rng)
        records.append(
            PreferenceRecord(
                prompt=system_and_user(SYSTEM_PROMPT, entry["question"]),
                chosen=chosen,
                rejected=rejected,
                meta={"task": name, "entry": entry_meta(entry, answer), "rejected_kind": kind},
            )
        )
    rng.shuffle(records)
    return records


# --------------------------------------------------------------------------------------------
# ORM outcomes
# --------------------------------------------------------------------------------------------

_LEADS = ("", "Let me check each part. ", "Step by step. ")
_INCORRECT_KINDS = ("wrong_answer", "no_tags", "answer_outside_tags", "truncated")
_INCORRECT_WEIGHTS = (0.4, 0.2, 0.2, 0.2)


def _incorrect_completion(
    ds: Any, entry: dict, reason: Reason, wrong: Wrong, rng: random.Random
) -> tuple[str, str]:
    """A plausible incorrect completion and its kind; reasoning-gym scores it below 1."""
    answer = str(entry["answer"])
    wrongs = distinct_wrongs(entry, wrong, rng)
    kind = rng.choices(_INCORRECT_KINDS, weights=_INCORRECT_WEIGHTS)[0]
    if kind == "wrong_answer":
        text = first_wrong_response(ds, entry, reason, wrongs, rng)
        if text is not None:
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


def _next_answerable_entry(ds: Any, name: str, cursors: dict) -> dict:
    """The next entry of task ``name`` whose own answer scores 1.0."""
    while True:
        entry = ds[cursors[name]]
        cursors[name] += 1
        if ds.score_answer(str(entry["answer"]), entry) == 1.0:
            return entry
        if cursors[name] >= len(ds):
            raise ValueError(f"reasoning-gym task {name!r}: its own answers do not score 1.0")


def _led(lead: str, reason: Reason) -> Reason:
    """``reason`` with ``lead`` written before its text."""

    def led(entry: dict, final: str) -> str:
        return lead + reason(entry, final)

    return led


def _outcome_completions(
    ds: Any, entry: dict, k: int, reason: Reason, wrong: Wrong, rng: random.Random
) -> list[tuple[str, str]]:
    """``k`` (completion, kind) pairs for one prompt, shuffled: 1..k−1 correct, the rest
    incorrect; every reasoning opens with a lead-in drawn whatever the label."""
    answer = str(entry["answer"])
    n_correct = rng.randint(1, k - 1)
    items = []
    for j in range(k):
        led = _led(rng.choice(_LEADS), reason)  # the same lead-ins for both classes
        if j < n_correct:
            items.append((format_response(led(entry, answer), answer), "correct"))
        else:
            items.append(_incorrect_completion(ds, entry, led, wrong, rng))
    rng.shuffle(items)
    return items


def builtin_outcome_records(
    n: int,
    seed: int,
    completions_per_prompt: int = 4,
    tasks: Sequence[str] | None = None,
    settings: dict[str, dict] | None = None,
) -> list[OutcomeRecord]:
    """``n`` prompts from reasoning-gym tasks (equal shares), each with
    ``completions_per_prompt`` completions in the tag format: between 1 and k−1 correct ones and
    the rest incorrect — a wrong answer with reasoning that leads to it (40 %), no tags (20 %),
    the answer outside the tags (20 %), or a completion cut off inside its reasoning (20 %).

    Every label is reasoning-gym's verdict (1 iff the extracted answer scores 1.0), and each
    prompt has both classes. ``settings[task]`` updates that task's reasoning-gym settings
    (:func:`task_settings`). Deterministic in ``(n, seed, completions_per_prompt, tasks,
    settings)``; ``meta`` holds ``task``, ``entry`` and each completion's ``kinds``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if completions_per_prompt < 2:
        raise ValueError("completions_per_prompt must be >= 2 (one correct, one incorrect)")
    tasks = list(tasks) if tasks else list(DEFAULT_BUILTIN_TASKS)
    rng = random.Random(seed)
    per_task = per_task_share(n, len(tasks))
    seeds = [seed + 7919 * (t_idx + 1) for t_idx in range(len(tasks))]
    sources = task_datasets(tasks, seeds, max(2 * per_task + 16, 16), settings)
    cursors = dict.fromkeys(tasks, 0)
    records = []
    for i in range(n):
        name = tasks[i % len(tasks)]
        ds = sources[name]
        reason, wrong = kit_of(name)
        entry = _next_answerable_entry(ds, name, cursors)
        items = _outcome_completions(ds, entry, completions_per_prompt, reason, wrong, rng)
        texts = [t for t, _ in items]
        records.append(
            OutcomeRecord(
                prompt=system_and_user(SYSTEM_PROMPT, entry["question"]),
                completions=texts,
                labels=[int(ds.score_answer(extract_answer(t), entry) == 1.0) for t in texts],
                meta={
                    "task": name,
                    "entry": entry_meta(entry, str(entry["answer"])),
                    "kinds": [k for _, k in items],
                },
            )
        )
    return records


# --------------------------------------------------------------------------------------------
# PRM steps
# --------------------------------------------------------------------------------------------

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


def _chain_operations(expression: str) -> tuple[int, list[tuple[str, int]]]:
    """``"3 + 4 - 2"`` -> (3, [("+", 4), ("-", 2)])."""
    tokens = expression.split()
    return int(tokens[0]), list(zip(tokens[1::2], (int(t) for t in tokens[2::2]), strict=True))


def _step_record(
    entry: dict, rng: random.Random, error_rate: float, neutral_rate: float
) -> StepRecord:
    """One rated solution of a chain-sum ``entry`` (see :func:`builtin_step_records`)."""
    first, ops = _chain_operations(entry["metadata"]["expression"])
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
    return StepRecord(
        problem=entry["question"],
        steps=[*lead, *steps, f"The answer is {final}."],
        ratings=[0] * len(lead) + ratings + [-1 if has_error else 1],
        meta={
            "task": "chain_sum",
            "entry": entry_meta(entry, str(entry["answer"])),
            "final_answer": str(final),
            "error_step": None if error_at is None else len(lead) + error_at,
            "error_kind": kind,
        },
    )


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
      ``operand`` (the running total is miscopied, off by 1–3) or ``operation`` (the term is
      multiplied instead). Later steps compute correctly from the wrong value, so the final
      answer is wrong (an ``operation`` error that gives the right total becomes
      ``arithmetic``).
    * Ratings: +1 before the error, −1 from the injected step on, the final step included.

    ``meta``: ``task``, ``entry``, ``final_answer``, ``error_step`` (index into ``steps``, or
    None) and ``error_kind``. Deterministic in its arguments."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rg = import_reasoning_gym()
    ds = rg.create_dataset(
        "chain_sum", seed=seed, size=max(n, 1), **(task_config or PRM_TASK_CONFIG)
    )
    rng = random.Random(seed + 17)
    return [_step_record(ds[i], rng, error_rate, neutral_rate) for i in range(n)]
