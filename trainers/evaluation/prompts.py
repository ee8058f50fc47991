"""The held-out prompts of an evaluation.

Reasoning-gym questions come from a seed range no trainer draws from: every built-in set and the
policy-gradient prompts are generated from ``seed + small offsets`` (the config's seed, a few
multiples of 100 003 or 1 000 003 for tasks and splits, plus the item index: under ~10^8 above the
seed), and reasoning-gym item ``i`` of a dataset seeded ``s`` is drawn from ``Random(s + i)``.
The evaluation's mixture is seeded :data:`EVAL_SEED_BASE` (2·10^9), far from all of them. Seeds
being disjoint does not make questions distinct (a task with few distinct questions repeats them
under any seed), so with ``prompts.exclude_training`` the target run's own training questions
are regenerated when they come from a built-in set and every question among them is dropped.

Preference prompts (winrate, generation) are a direct-alignment run's held-out split (the same
split its trainer held out), or the prompts of a named preference dataset's split.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from trainers.core.builtin_data import (
    DEFAULT_BUILTIN_TASKS,
    default_demonstration_tasks,
    split_builtin_name,
    task_settings,
)
from trainers.core.config import ConfigError
from trainers.core.messages import system_and_user
from trainers.core.preferences import configured_preference_records
from trainers.core.prompts import build_composite, builtin_questions, composite_prompts, to_prompt
from trainers.core.splits import split_train_eval
from trainers.core.tasks import SYSTEM_PROMPT
from trainers.core.tool_demonstrations import demonstration_question, sft_demonstration_set
from trainers.evaluation.config import BUILTIN_ARITHMETIC, EvalConfig
from trainers.evaluation.targets import ModelRef

EVAL_SEED_BASE = 2_000_000_000
"""Seed of the evaluation's reasoning-gym mixture and arithmetic set (see the module doc)."""

TRAINING_SEED_SPAN = 100_000_000
"""How far above its config seed a trainer's generators reach (a generous bound)."""

POOL_FACTOR = 50
"""Questions drawn per question asked, at most (repeats and training questions are skipped)."""


@dataclass
class EvalPrompt:
    """One prompt: its chat messages, a stable id (hash of the messages) and what scoring needs
    (reasoning-gym: ``task`` and ``entry``; math: ``gold``)."""

    messages: list[dict]
    meta: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        text = json.dumps(self.messages, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def question(self) -> str:
        return str(self.messages[-1]["content"]).strip()


def prompt_set_fingerprint(prompts: list[EvalPrompt]) -> str:
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(p.id.encode())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# The target run's tasks and training questions
# ---------------------------------------------------------------------------------------------


def _spec(name: str, config: dict) -> Any:
    return SimpleNamespace(name=name, weight=1.0, config=dict(config))


def run_task_specs(ref: ModelRef) -> list[Any] | None:
    """The reasoning-gym tasks (name, weight, config) the target run trained on, or None when
    its data is not a reasoning-gym set."""
    cfg, family = ref.run_config, ref.family
    if cfg is None:
        return None
    data = cfg.data
    if family == "policy_gradients":
        if getattr(data, "source", "reasoning_gym") != "reasoning_gym":
            return None
        return [
            SimpleNamespace(name=s.name, weight=s.weight, config=dict(s.config)) for s in data.specs
        ]
    if family == "sft" and data.dataset.startswith("builtin:"):
        named = split_builtin_name(data.dataset)[1]
        tasks = named or data.builtin_tasks or list(default_demonstration_tasks(data.dataset))
        return [_spec(t, task_settings(t, data.builtin_task_configs)) for t in tasks]
    if family == "direct_alignment" and data.dataset.startswith("builtin:"):
        tasks = split_builtin_name(data.dataset)[1] or data.builtin_tasks
        return [_spec(t, task_settings(t)) for t in tasks or DEFAULT_BUILTIN_TASKS]
    if family == "rejection_sampling" and data.is_builtin:
        return [_spec(t, task_settings(t, data.builtin_task_configs)) for t in data.builtin_tasks]
    return None


def run_seed(ref: ModelRef) -> int | None:
    cfg = ref.run_config
    return getattr(cfg, "seed", None) if cfg is not None else None


def training_questions(ref: ModelRef) -> set[str] | None:
    """Every question of the target run's data when it is a built-in set this process can
    regenerate (the held-out part included: it is not evaluation data either); None otherwise."""
    cfg, family = ref.run_config, ref.family
    if cfg is None:
        return None
    data = cfg.data
    if family == "policy_gradients" and run_task_specs(ref) is not None:
        train, held = composite_prompts(data.specs, data.size, data.eval_size, cfg.seed)
        return {p.question.strip() for p in train + held}
    if family == "sft" and data.dataset.startswith("builtin:"):
        records = sft_demonstration_set(
            data.dataset,
            data.split,
            data.max_samples,
            cfg.seed,
            data.builtin_tasks,
            data.builtin_task_configs,
        )
        return {str(demonstration_question(r)).strip() for r in records}
    if family == "direct_alignment" and data.dataset.startswith("builtin:"):
        records = configured_preference_records(data, cfg.seed)
        return {str(r.prompt[-1]["content"]).strip() for r in records}
    if family == "rejection_sampling" and data.is_builtin:
        n_test = 200 if data.max_test_samples is None else data.max_test_samples
        train, test = builtin_questions(
            data.builtin_tasks,
            data.builtin_task_configs,
            data.max_train_samples or 1000,
            n_test,
            cfg.seed,
        )
        return {entry["question"].strip() for _, entry in train + test}
    return None


# ---------------------------------------------------------------------------------------------
# Prompt sets
# ---------------------------------------------------------------------------------------------


def tasks_source(cfg: EvalConfig, ref: ModelRef) -> str:
    """Where the evaluated tasks come from: ``prompts.tasks``, ``the target run`` (the tasks it
    trained on) or ``the built-in mix`` (a plain model, or a run not trained on reasoning-gym
    tasks)."""
    if cfg.prompts.tasks:
        return "prompts.tasks"
    return "the target run" if run_task_specs(ref) else "the built-in mix"


def reasoning_specs(cfg: EvalConfig, ref: ModelRef) -> list[Any]:
    """The tasks to ask: ``prompts.tasks`` when named (settings: ``prompts.task_configs``, else
    the run's own for that task, else the defaults), else the target run's tasks, else the
    built-in mix (``DEFAULT_BUILTIN_TASKS``: a plain model name, or a run trained on other
    data, is evaluated on it)."""
    own = {s.name: s for s in run_task_specs(ref) or []}
    names = list(cfg.prompts.tasks)
    if not names:
        if own:
            return [
                _spec(s.name, {**s.config, **cfg.prompts.task_configs.get(s.name, {})})
                for s in own.values()
            ]
        names = list(DEFAULT_BUILTIN_TASKS)
    specs = []
    for name in names:
        base = own[name].config if name in own else task_settings(name)
        specs.append(_spec(name, {**base, **cfg.prompts.task_configs.get(name, {})}))
    return specs


def reasoning_prompts(cfg: EvalConfig, ref: ModelRef) -> tuple[list[EvalPrompt], dict[str, Any]]:
    """``prompts.size`` reasoning-gym questions from the evaluation seed range, none repeated,
    none among the target run's training questions (when ``prompts.exclude_training`` and they
    can be regenerated). Returns the prompts and what was done (for eval.json)."""
    specs = reasoning_specs(cfg, ref)
    seed = run_seed(ref)
    if seed is not None and abs(seed - EVAL_SEED_BASE) < TRAINING_SEED_SPAN:
        raise ConfigError(
            f"the target run's seed {seed} is within {TRAINING_SEED_SPAN} of the evaluation's "
            f"seed range ({EVAL_SEED_BASE}): its training questions could be evaluation ones"
        )
    exclude = training_questions(ref) if cfg.prompts.exclude_training else None
    size = cfg.prompts.size
    pool_size = POOL_FACTOR * size + 1000  # items are drawn lazily, as far as needed
    pool = build_composite(specs, pool_size, EVAL_SEED_BASE)
    seen: set[str] = set()
    prompts, dropped = [], 0
    for i in range(pool_size):
        prompt = to_prompt(pool[i])
        q = prompt.question.strip()
        if q in seen:
            continue
        seen.add(q)
        if exclude is not None and q in exclude:
            dropped += 1
            continue
        prompts.append(EvalPrompt(prompt.messages, dict(prompt.meta)))
        if len(prompts) == size:
            break
    if not prompts:
        raise ConfigError(
            "every generated question occurs in the target run's training data; these task "
            "settings have too few distinct questions to hold any out"
        )
    info = {
        "source": "reasoning_gym",
        "tasks": [{"name": s.name, "config": s.config} for s in specs],
        "tasks_from": tasks_source(cfg, ref),
        "seed": EVAL_SEED_BASE,
        "requested": size,
        "n_prompts": len(prompts),
        "training_questions_checked": exclude is not None,
        "dropped_as_training": dropped,
    }
    return prompts, info


def preference_prompts(cfg: EvalConfig, ref: ModelRef) -> tuple[list[EvalPrompt], dict[str, Any]]:
    """Prompts of a preference set: ``prompts.dataset``'s ``prompts.split``, or the target
    direct-alignment run's held-out split; at most ``prompts.size``, no prompt twice, none of
    the run's training prompts."""
    p = cfg.prompts
    train_prompts: set[str] = set()
    if ref.family == "direct_alignment":
        run_cfg = ref.run_config
        train, held_out = split_train_eval(
            configured_preference_records(run_cfg.data, run_cfg.seed),
            eval_size=run_cfg.data.eval_size,
            seed=run_cfg.seed,
        )
        train_prompts = {_key(r.prompt) for r in train}
    if p.dataset is None:
        if ref.family != "direct_alignment":
            raise ConfigError(
                "prompts.source=preference needs prompts.dataset (a preference dataset) unless "
                "the target is a direct-alignment run (its held-out split is used)"
            )
        if not held_out:
            raise ConfigError(f"the target run {ref.given!r} held out no pairs (eval_size 0)")
        records, source = held_out, f"{ref.run_config.data.dataset} (the run's held-out split)"
    else:
        from trainers.core.preferences import load_preference_records

        try:
            records = load_preference_records(
                p.dataset, p.split, "auto", 4 * p.size + 16, seed=cfg.seed
            )
        except ValueError as err:
            raise ConfigError(f"prompts.dataset: {err}") from None
        source = f"{p.dataset} ({p.split})"
    prompts, seen, dropped = [], set(), 0
    for r in records:
        key = _key(r.prompt)
        if key in seen:
            continue
        seen.add(key)
        if p.exclude_training and key in train_prompts:
            dropped += 1
            continue
        prompts.append(EvalPrompt(list(r.prompt), dict(r.meta)))
        if len(prompts) == p.size:
            break
    if not prompts:
        raise ConfigError(f"no held-out prompts left in {source}")
    info = {
        "source": "preference",
        "dataset": source,
        "requested": p.size,
        "n_prompts": len(prompts),
        "training_questions_checked": ref.family == "direct_alignment",
        "dropped_as_training": dropped,
    }
    return prompts, info


def _key(messages: list[dict]) -> str:
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)


def open_prompts(cfg: EvalConfig, ref: ModelRef) -> tuple[list[EvalPrompt], dict[str, Any]]:
    """The prompts of the winrate and generation suites (``prompts.source``)."""
    source = cfg.prompts.source
    if source == "auto":
        source = "preference" if ref.family == "direct_alignment" else "reasoning_gym"
    if source == "preference":
        return preference_prompts(cfg, ref)
    return reasoning_prompts(cfg, ref)


def math_prompts(cfg: EvalConfig) -> tuple[list[EvalPrompt], dict[str, Any]]:
    """The first ``prompts.size`` rows of the math dataset, as prompts with their gold."""
    from trainers.evaluation.math_answers import (
        builtin_arithmetic_rows,
        gold_of_rows,
        read_gsm8k_rows,
    )

    m = cfg.math
    if m.dataset == BUILTIN_ARITHMETIC:
        rows = builtin_arithmetic_rows(cfg.prompts.size, EVAL_SEED_BASE)
    else:
        try:
            rows = read_gsm8k_rows(m.dataset, m.subset, m.split)[: cfg.prompts.size]
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if not rows:
        raise ConfigError(f"math.dataset {m.dataset!r} has no rows")
    try:
        golds = gold_of_rows(rows, m.dataset)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    system = m.system_prompt if m.system_prompt is not None else SYSTEM_PROMPT
    prompts = [
        EvalPrompt(
            system_and_user(system, str(row["question"]))
            if system
            else [{"role": "user", "content": str(row["question"])}],
            {"gold": gold},
        )
        for row, gold in zip(rows, golds, strict=True)
    ]
    info = {"source": m.dataset, "split": m.split, "n_prompts": len(prompts)}
    return prompts, info
