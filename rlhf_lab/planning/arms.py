"""The runs of a plan before they are planned (:class:`Arm`), and how a comparison's runs are
matched: policy-gradient arms share one rollout shape, the same prompts and the same step
settings; a question about reward models and best-of-n plans the reward models, each
reward-selected strategy once per reward model (its scorer) and the matched random control.
Torch-free."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import (
    Recipe,
    algorithm_spec,
    find_recipe,
    list_recipes,
    matched_controls,
    recipe_for_algorithm,
)
from rlhf_lab.planning.configs import ConfigChange, resolve_config
from rlhf_lab.planning.overrides import Override, format_override
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.trainer_config import TrainerConfig

# Matched random controls of the reward-selected rejection-sampling strategies (from the specs).
MATCHED_CONTROL: dict[str, str] = matched_controls()


# Policy-gradient settings held equal across the arms of a comparison: the rollout shape
# (prompts per step × rollouts per prompt), the prompts (task, count, held-out set, seed), the
# generation, the number of steps and optimizer steps per rollout, and the reward.
PG_MATCHED_KEYS = (
    "rollout.prompts_per_step",
    "rollout.num_rollouts",
    "data.specs",
    "data.size",
    "data.eval_size",
    "seed",
    "rollout.max_new_tokens",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.top_k",
    "rollout.min_p",
    "train.max_steps",
    "train.num_epochs",
    "train.batch_size",
    "train.gradient_accumulation_steps",
    "eval.eval_every",
    "eval.max_new_tokens",
    "reward.format_weight",
)


_MISSING = object()


class Arm(BaseModel):
    """One run to plan: the recipe, its name in the plan, the overrides that match it to the
    other runs, and what it waits for."""

    recipe: Recipe
    name: str
    matched: list[Override] = Field(default_factory=list)
    after: list[str] = Field(default_factory=list)
    model: str | None = Field(default=None, description="its model swap (None: the plan's)")
    starts_from_run: bool = Field(
        default=False, description="its model.name is a run of the plan: no model swap"
    )


def needs_groups(algorithm: str) -> bool:
    try:
        return bool(algorithm_spec(algorithm).needs_groups)
    except LabError:
        return False


def match_policy_gradients(
    arms: list[Arm], model: str | None, overrides: list[Override]
) -> tuple[list[str], list[str]]:
    """Give the policy-gradient arms the settings of one reference arm (the first that needs
    groups of rollouts, else the first): the same rollout shape, prompts, generation and steps.
    Fills each arm's ``matched`` overrides; returns (the matched key=value list, notes)."""
    pg = [a for a in arms if a.recipe.family == "policy_gradients"]
    if len(pg) < 2:
        return [], []
    shrunk = {a.name: shrink_config(a.recipe, overrides, model=model) for a in pg}
    ref = next((a for a in pg if needs_groups(shrunk[a.name].algorithm)), pg[0])
    ref_config = shrunk[ref.name].trainer_config
    values = {k: ref_config.get(k, _MISSING) for k in PG_MATCHED_KEYS}
    values = {k: v for k, v in values.items() if v is not _MISSING}
    for arm in pg:
        if arm is ref:
            continue
        config = shrunk[arm.name].trainer_config
        arm.matched += [  # after the arm's own (a tool arm's env.name)
            Override.of(key, value)
            for key, value in values.items()
            if config.get(key, _MISSING) != value
        ]
    prompts = values.get("rollout.prompts_per_step")
    rollouts = values.get("rollout.num_rollouts")
    notes = []
    if isinstance(prompts, int) and isinstance(rollouts, int):
        notes.append(
            f"matched sample budget: {prompts * rollouts} completions per step ({prompts} prompts "
            f"× {rollouts} rollouts) in every run, the shape of {ref.name}"
            + (" (it needs groups of rollouts)" if needs_groups(ref.recipe.algorithm) else "")
            + f"; the same {values.get('data.size', '?')} prompts (task, held-out set, seed)"
        )
    shown = [
        format_override(k, v) if len(format_override(k, v)) <= 60 else f"{k} (as in {ref.name})"
        for k, v in values.items()
    ]
    return shown, notes


def matched_overrides(
    recipes: list[str], model: str | None = None, overrides: Iterable[Override] = ()
) -> dict[str, list[Override]]:
    """The overrides that match several recipes to each other (policy gradients: one rollout
    shape, the same prompts and step settings; other families: none), by recipe as given; the
    caller's ``overrides`` go after them. For launching matched runs without a plan (a sweep)."""
    arms = [Arm(recipe=find_recipe(r), name=f"{i}") for i, r in enumerate(recipes)]
    match_policy_gradients(arms, model, list(overrides))
    return {r: arm.matched for r, arm in zip(recipes, arms, strict=True)}


def pending_changes(pending: list[Override], config: TrainerConfig) -> list[ConfigChange]:
    """The diff entries of overrides that wait for an upstream run (see :func:`_plan_run`): the
    value as written, beside the config's."""
    changes = []
    for item in pending:
        node = config.get(item.key)
        shipped = node if isinstance(node, str | int | float | bool) else None
        used = item.text.partition("=")[2]
        changes.append(ConfigChange(key=item.key, shipped=shipped, used=used))
    return changes


def scorer_arms(recipes: list[Recipe], dated: str, preset: bool) -> tuple[list[Arm], list[str]]:
    """Reward models + rejection sampling in one question ("does a PRM beat an ORM for
    best-of-n?"): the RM runs, each reward-selected strategy once per RM with that RM as its
    scorer (after the RM), and each strategy's random control. Returns (arms, notes)."""
    rms = [r for r in recipes if r.family == "reward_models"]
    strategies = [r for r in recipes if r.family == "rejection_sampling"]
    selected = [r for r in strategies if r.algorithm in MATCHED_CONTROL]
    controls = [r for r in strategies if r.algorithm not in MATCHED_CONTROL]
    if not selected:  # only a control was named: plan its reward-selected partner
        partners = {v: k for k, v in MATCHED_CONTROL.items()}
        selected = [recipe_for_algorithm(partners[c.algorithm]) for c in controls]
    for strategy in selected:
        control = recipe_for_algorithm(MATCHED_CONTROL[strategy.algorithm])
        if control.id not in {c.id for c in controls}:
            controls.append(control)
    arms: list[Arm] = []
    for rm in rms:
        matched = []
        if preset and rm.algorithm == "orm":  # score the task the prompts come from
            matched = [Override.of("data.dataset", "builtin:reasoning-outcomes:chain_sum")]
        arms.append(Arm(recipe=rm, name=rm.algorithm, matched=matched))
    for strategy in selected:
        for rm in rms:
            arms.append(
                Arm(
                    recipe=strategy,
                    name=f"{strategy.algorithm}[{rm.algorithm}]",
                    matched=[Override.of("scorer.name", f"run:{placeholder(rm.algorithm)}")],
                    after=[rm.algorithm],
                )
            )
    for control in controls:
        arms.append(Arm(recipe=control, name=control.algorithm))
    notes = [
        "the random controls ignore the scores (same pool, same seed, same selection size), so "
        "one control serves every scorer"
    ]
    if preset:
        notes.append(
            "on a preset model the reward models train on the prompts' task (chain_sum: the "
            "PRM's built-in steps, the ORM's built-in outcomes restricted to chain_sum)"
        )
    return arms, notes


def placeholder(name: str) -> str:
    """How a run of this plan is named before it exists: ``<orm-run-id>``."""
    return f"<{name}-run-id>"


# ---------------------------------------------------------------------------------------------
# Tools (multi-turn environments, issue #28)
# ---------------------------------------------------------------------------------------------

TOOLS_SUFFIX = "_tools"


def _shipped_pg(name: str) -> Recipe | None:
    """The shipped policy-gradient recipe named ``name`` (None when none ships)."""
    return next((r for r in list_recipes("policy_gradients") if r.name == name), None)


def recipe_env(recipe: Recipe) -> str | None:
    """The environment a recipe's file sets (``env.name``; None: single-turn)."""
    return resolve_config(recipe, []).config.get("env.name")


def _tool_arm(recipe: Recipe, env: str | None) -> tuple[Arm, str | None]:
    """The arm of ``recipe`` with tool ``env`` (None: without a tool), and a note when no recipe
    ships for it: the ``<name>_tools`` recipe for a tool (the recipe itself with ``env.name`` set
    otherwise), the recipe without the suffix for no tool (``env.name=null`` otherwise)."""
    stem = recipe.name.removesuffix(TOOLS_SUFFIX)
    if env is None:
        chosen = _shipped_pg(stem) if recipe.name.endswith(TOOLS_SUFFIX) else recipe
        chosen = chosen or recipe
        name = recipe.algorithm
    else:
        chosen = _shipped_pg(stem + TOOLS_SUFFIX) or recipe
        name = f"{recipe.algorithm}+{env}"
    if recipe_env(chosen) == env:
        return Arm(recipe=chosen, name=name), None
    note = None
    if env is not None and recipe_env(chosen) is None:
        note = (
            f"{name}: no {stem}{TOOLS_SUFFIX} recipe ships, so {chosen.name} runs with "
            f"env.name={env} and the environment's default turns and reply budget"
        )
    return Arm(recipe=chosen, name=name, matched=[Override.of("env.name", env)]), note


def tool_arms(recipes: list[Recipe], envs: list[str | None]) -> tuple[list[Arm], list[str]]:
    """The arms of a request that names tools ("GRPO with vs without a calculator"): each
    policy-gradient recipe once per environment in ``envs`` (None: without a tool), the tool
    arms first, so that a comparison's runs take their task and settings from a tools recipe
    (:func:`match_policy_gradients` matches the others to the first). Refused for a recipe of
    another family: tools are a policy-gradient rollout. Returns (arms, notes)."""
    others = [r for r in recipes if r.family != "policy_gradients"]
    if others:
        names = ", ".join(f"{r.name} ({r.family})" for r in others)
        raise InvalidArgument(
            f"tools (a calculator, a python tool) are multi-turn rollouts of the policy-gradient "
            f"family (env.name); {names} cannot use one. Ask for e.g. 'GRPO with a calculator'",
            next=NextStep("list_recipes", {"family": "policy_gradients"}),
        )
    ordered = sorted(envs, key=lambda e: e is None)
    arms: list[Arm] = []
    notes: list[str] = []
    for env in ordered:
        for recipe in recipes:
            arm, note = _tool_arm(recipe, env)
            arms.append(arm)
            notes += [note] if note else []
    if len(ordered) > 1:
        notes.append(
            "with vs without a tool: the runs differ in the environment (env.name) alone; "
            f"those without take the task and settings of {arms[0].name} (matched)"
        )
    return arms, notes


def tool_arms_slug(arms: list[Arm]) -> str:
    """A campaign slug for tool arms: ``grpo-with-calculator-vs-grpo``, ``grpo-with-calculator-
    sanity`` for one."""
    names = [a.name.replace("+", "-with-").replace("_", "-") for a in arms]
    slug = "-vs-".join(names) if len(names) > 1 else f"{names[0]}-sanity"
    return slug if len(slug) <= 60 else "policy-gradients-tools-comparison"
