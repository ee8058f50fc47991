"""Prompts for the loops that sample from their policy (policy gradients, on-policy distillation),
from one of two sources (``data.source``, :class:`trainers.core.config.PromptDataSection`):

* ``reasoning_gym`` (default): a seeded reasoning-gym ``composite`` of ``data.specs``. Each prompt
  is the chat ``[system: SYSTEM_PROMPT, user: question]`` plus what scoring needs
  (``meta = {"task", "entry"}``: reasoning-gym scores an answer against its own entry). The
  held-out split is drawn from the same task mixture with a different seed, and any question
  that also appears in the training prompts is dropped from it (:func:`composite_prompts`).
* ``preference``: the prompts of a preference dataset (``data.dataset``), read with the shared
  preference loader (:mod:`trainers.core.preferences`: HH-RLHF transcripts, UltraFeedback message
  lists, plain ``prompt``/``chosen``/``rejected``), or of a prompt-only file with a ``prompt``
  column (a string or a message list). Prompts are deduplicated (HH-RLHF repeats a prompt across
  pairs), put in a seeded order, and the first ``eval_size`` are held out; the next ``size`` are
  the training prompts. These prompts have no reference answer (``meta`` is empty): they are
  scored by a reward model. ``builtin`` (or ``builtin:task_a,task_b``) takes the prompts of the
  built-in preference pairs (:func:`trainers.core.builtin_data.builtin_preference_records`):
  reasoning-gym questions that do carry ``meta``, so the verifier can score them (as the gold
  signal, or in the reward).

Training prompts are served by :class:`PromptStream`: one seeded permutation per epoch, consumed
``prompts_per_step`` at a time (a short tail is dropped, as a ``drop_last`` loader would), with a
position that a checkpoint can save and restore.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from trainers.core.builtin_data import builtin_preference_records
from trainers.core.config import ConfigError
from trainers.core.messages import system_and_user
from trainers.core.records import PreferenceRecord, Prompt
from trainers.core.splits import rows_to_read, shuffled
from trainers.core.tasks import SYSTEM_PROMPT, TASK_CONFIGS, import_reasoning_gym

__all__ = [
    "HELD_OUT_SEED_OFFSET",
    "Prompt",
    "PromptStream",
    "build_composite",
    "builtin_questions",
    "check_specs",
    "composite_prompts",
    "load_run_prompts",
    "preference_prompts",
    "to_prompt",
]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# A reasoning-gym composite (policy gradients, distillation)
# ---------------------------------------------------------------------------------------------

HELD_OUT_SEED_OFFSET = 1_000_003  # held-out items come from a different composite seed


def build_composite(specs: Sequence[Any], size: int, seed: int) -> Any:
    """``reasoning_gym.create_dataset("composite", ...)`` of ``specs`` (objects with ``name``,
    ``weight`` and ``config``); bad specs raise ConfigError."""
    rg = import_reasoning_gym()
    from reasoning_gym.composite import DatasetSpec

    datasets = [DatasetSpec(name=s.name, weight=s.weight, config=dict(s.config)) for s in specs]
    try:
        return rg.create_dataset("composite", size=size, seed=seed, datasets=datasets)
    except (ValueError, TypeError, AssertionError, KeyError) as err:
        known = ""
        if "not registered" in str(err):
            from reasoning_gym.factory import DATASETS

            known = f" Known tasks include: {', '.join(sorted(DATASETS)[:30])}, ..."
        raise ConfigError(
            f"data.specs: reasoning-gym could not build the task mixture "
            f"({type(err).__name__}: {err}).{known}"
        ) from None


def to_prompt(item: dict) -> Prompt:
    """A composite item as a :class:`Prompt` (``[system, user]``, scoring meta)."""
    question = str(item["question"]).strip()
    return Prompt(
        messages=system_and_user(SYSTEM_PROMPT, question),
        question=question,
        answer=str(item["answer"]),
        meta={"task": item["metadata"]["source_dataset"], "entry": item},
    )


def composite_prompts(
    specs: Sequence[Any], size: int, eval_size: int, seed: int
) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts). The held-out ones come from the same mixture with
    another seed, and never repeat a training question."""
    train_ds = build_composite(specs, size, seed)
    train = [to_prompt(train_ds[i]) for i in range(size)]
    held_out: list[Prompt] = []
    if eval_size > 0:
        seen = {p.question for p in train}
        pool_size = 4 * eval_size + 16
        pool = build_composite(specs, pool_size, seed + HELD_OUT_SEED_OFFSET)
        for i in range(pool_size):
            prompt = to_prompt(pool[i])
            if prompt.question not in seen:
                seen.add(prompt.question)
                held_out.append(prompt)
                if len(held_out) == eval_size:
                    break
    return train, held_out


def check_specs(specs: Sequence[Any]) -> None:
    """Preflight: build a one-item mixture so an unknown task or bad setting fails early."""
    ds = build_composite(specs, 1, 0)
    try:
        ds[0]
    except Exception as err:  # noqa: BLE001 - reasoning-gym raises many kinds
        raise ConfigError(
            f"data.specs: reasoning-gym could not generate an item ({type(err).__name__}: {err})"
        ) from None


# ---------------------------------------------------------------------------------------------
# Questions task by task (rejection sampling's built-in sets)
# ---------------------------------------------------------------------------------------------

TaskEntry = tuple[str, dict]
"""(reasoning-gym task, entry with ``question``, ``answer`` and ``metadata``)."""


def _distinct_entries(
    rg: Any, task: str, t_idx: int, size: int, seed: int, settings: dict, exclude: set[str]
) -> list[dict]:
    """Up to ``size`` entries of ``task`` whose questions are neither repeated nor excluded."""
    try:
        ds = rg.create_dataset(task, seed=seed + 100_003 * t_idx, size=size, **settings)
    except Exception as err:  # noqa: BLE001 - reasoning-gym raises many kinds
        raise ValueError(f"cannot build reasoning-gym task {task!r}: {err}") from err
    seen, out = set(exclude), []
    for i in range(len(ds)):
        entry = ds[i]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            out.append(entry)
    return out


def _draw_questions(
    tasks: list[str], settings: dict[str, dict], n: int, seed: int, exclude: set[str], repeats: bool
) -> list[TaskEntry]:
    """``n`` entries, the tasks taking turns; a task short of distinct questions repeats them
    (``repeats``) or gives fewer, with a warning."""
    if n == 0:
        return []
    rg = import_reasoning_gym()
    per_task = -(-n // len(tasks))
    pools = [
        _distinct_entries(rg, task, t_idx, 4 * per_task + 64, seed, settings[task], exclude)
        for t_idx, task in enumerate(tasks)
    ]
    out: list[TaskEntry] = []
    for k in range(per_task * len(tasks)):
        if len(out) >= n:
            break
        t_idx, j = k % len(tasks), k // len(tasks)
        pool = pools[t_idx]
        if j >= len(pool) and not (repeats and pool):
            continue
        e = pool[j % len(pool)]
        entry = {"question": e["question"], "answer": e["answer"], "metadata": e["metadata"]}
        out.append((tasks[t_idx], entry))
    short = [t for t, pool in zip(tasks, pools, strict=True) if len(pool) < per_task]
    if short:
        what = "some training questions repeat" if repeats else f"{len(out)} held-out prompts"
        logger.warning(
            "reasoning-gym task(s) %s have fewer than %d distinct questions with these settings: %s",
            short,
            per_task,
            what,
        )
    return out


def builtin_questions(
    tasks: list[str], task_configs: dict[str, dict], n_train: int, n_test: int, seed: int
) -> tuple[list[TaskEntry], list[TaskEntry]]:
    """Train and held-out questions from reasoning-gym, ``tasks`` taking turns (each task with
    its easy settings, updated by ``task_configs``). Questions are unique within the training
    slice while the settings allow it (then they repeat, with a warning); held-out questions
    never occur in the training slice (fewer are returned, with a warning, when the settings
    leave too few). ValueError when a task cannot be built."""
    settings = {t: {**TASK_CONFIGS.get(t, {}), **task_configs.get(t, {})} for t in tasks}
    train = _draw_questions(tasks, settings, n_train, seed, set(), repeats=True)
    asked = {entry["question"] for _, entry in train}
    test = _draw_questions(tasks, settings, n_test, seed + 7_000_003, asked, repeats=False)
    return train, test


def load_run_prompts(data: Any, seed: int) -> tuple[list[Prompt], list[Prompt], dict]:
    """(training prompts, held-out prompts, load statistics) for a config's ``data`` section."""
    if data.source == "preference":
        return preference_prompts(data.dataset, data.split, data.size, data.eval_size, seed)
    train, held = composite_prompts(data.specs, data.size, data.eval_size, seed)
    return train, held, {"source": "reasoning_gym"}


def _question(messages: list[dict]) -> str:
    """The text of the prompt's last user message (what samples.jsonl shows as the question)."""
    for msg in reversed(messages):
        if msg["role"] == "user":
            return msg["content"]
    return messages[-1]["content"] if messages else ""


def _record_prompt(record: PreferenceRecord) -> Prompt:
    """A preference record's prompt; built-in records keep their reasoning-gym entry (``meta``
    with ``task`` and ``entry``), so the verifier can score completions of it."""
    meta = record.meta or {}
    if "task" in meta and "entry" in meta:
        answer = str(meta["entry"].get("answer", ""))
        return Prompt(
            messages=list(record.prompt),
            question=_question(record.prompt),
            answer=answer,
            meta={"task": meta["task"], "entry": meta["entry"]},
        )
    return Prompt(
        messages=list(record.prompt), question=_question(record.prompt), answer="", meta={}
    )


def _prompt_only_records(
    dataset: str, split: str, n: int, seed: int, schema_error: str
) -> list[PreferenceRecord]:
    """Rows of a dataset with a ``prompt`` column and no pairs (a string or a message list);
    ConfigError (with the preference loader's ``schema_error``) when there is no such column."""
    from trainers.core.datasets import open_split
    from trainers.core.messages import as_messages

    ds = open_split(dataset, split, _HINT)
    if "prompt" not in ds.column_names:
        raise ConfigError(
            f"data.dataset={dataset!r}: no prompts found. {schema_error} A prompt-only dataset "
            "needs a `prompt` column (a string or a list of messages)."
        )
    rows, limit = rows_to_read(ds, n, seed)
    out = []
    for row in rows:
        try:
            messages = as_messages(row.get("prompt"))
        except ValueError:
            continue
        if messages and any(m["content"].strip() for m in messages):
            out.append(PreferenceRecord(prompt=messages, chosen="", rejected=None))
        if len(out) >= limit:
            break
    return out


_HINT = (
    "For offline runs use data.dataset=builtin (the prompts of the built-in preference pairs), "
    "or a local .jsonl/.json/.parquet/.csv file or folder."
)


def _preference_records(dataset: str, split: str, n: int, seed: int) -> tuple[list, str]:
    """Up to ``n`` records (seeded order) of a preference or prompt-only dataset, and the
    format read."""
    from trainers.core.datasets import DatasetNotFoundError
    from trainers.core.preferences import load_preference_records

    if dataset == "builtin" or dataset.startswith("builtin:"):
        spec = dataset.partition(":")[2]
        tasks = [t.strip() for t in spec.split(",") if t.strip()] or None
        return builtin_preference_records(n, seed, tasks), "builtin"
    stats: dict = {}
    try:
        records = load_preference_records(dataset, split, "auto", n, seed, stats=stats)
        return records, str(stats.get("format"))
    except DatasetNotFoundError as err:
        raise ConfigError(f"data.dataset: {err}") from None
    except ValueError as err:
        schema_error = str(err)
    return _prompt_only_records(dataset, split, n, seed, schema_error), "prompt"


def preference_prompts(
    dataset: str, split: str, size: int, eval_size: int, seed: int
) -> tuple[list[Prompt], list[Prompt], dict]:
    """(training prompts, held-out prompts, statistics) from the prompts of a preference
    dataset: deduplicated, in a seeded order, the first ``eval_size`` held out and the next
    ``size`` for training (fewer when the dataset has fewer distinct prompts)."""
    wanted = size + eval_size
    # HH-RLHF repeats prompts across pairs; the built-in generator rarely does (and is slower)
    builtin = dataset == "builtin" or dataset.startswith("builtin:")
    margin = wanted // 8 if builtin else wanted
    records, fmt = _preference_records(dataset, split, wanted + margin + 16, seed)
    unique: dict[str, Prompt] = {}
    for record in records:
        key = json.dumps(record.prompt, sort_keys=True)
        if key not in unique:
            unique[key] = _record_prompt(record)
    prompts = shuffled(list(unique.values()), seed)
    held_out, train = prompts[:eval_size], prompts[eval_size:wanted]
    if not train:
        raise ConfigError(
            f"data.dataset={dataset!r}: {len(prompts)} distinct prompt(s) found, none left for "
            f"training after data.eval_size={eval_size} held out"
        )
    stats = {
        "source": "preference",
        "format": fmt,
        "records_read": len(records),
        "distinct_prompts": len(prompts),
    }
    return train, held_out, stats


class PromptStream:
    """Training prompts in a seeded order, ``n`` at a time, epoch after epoch."""

    def __init__(self, n_prompts: int, seed: int, epoch: int = 0, index: int = 0):
        self.n_prompts, self.seed = n_prompts, seed
        self.epoch, self.index = epoch, index
        self._order_epoch: int | None = None
        self._order: list[int] = []

    def _order_of(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            from trainers.core.training import epoch_order

            self._order, self._order_epoch = epoch_order(self.n_prompts, self.seed, epoch), epoch
        return self._order

    def take(self, n: int) -> list[int]:
        """The next ``n`` prompt indices (never straddling an epoch boundary)."""
        if n > self.n_prompts:
            raise ValueError(f"cannot take {n} prompts from {self.n_prompts}")
        if self.index + n > self.n_prompts:
            self.epoch, self.index = self.epoch + 1, 0
        ids = self._order_of(self.epoch)[self.index : self.index + n]
        self.index += n
        return ids

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_state(cls, n_prompts: int, seed: int, state: dict) -> PromptStream:
        return cls(n_prompts, seed, epoch=int(state["epoch"]), index=int(state["index"]))
