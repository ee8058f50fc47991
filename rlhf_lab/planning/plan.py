"""Plan an experiment from a request such as "small SimPO sanity check", "compare dpo and ipo",
"compare ppo and grpo" or "does a PRM beat an ORM for best-of-n?": per run the recipe, the
changes from it, the memory estimate beside the free memory of every device, the exact launch
and trainer commands, what to watch and the acceptance criteria; the campaign, the launch order
and the settings held equal across the runs.

Comparisons are matched:

* policy-gradient algorithms get the same sample budget per step (prompts per step × rollouts
  per prompt), the same prompts (task, prompt count, held-out set, seed) and the same generation
  and step settings: the arms take the rollout shape of the first one that needs groups of
  rollouts (GRPO, RLOO, ...), so PPO is never planned as 16 × 1 against GRPO's 4 × 8;
* a question that names reward models and a rejection-sampling (best-of-n) strategy is one
  campaign: the reward-model runs first, then the strategy once per reward model with that
  model's ``final_model/`` as its scorer (``scorer.name``), and its matched random control
  (random selection ignores the scores, so one control serves every scorer).

Nothing is launched or written. Models are never downloaded: a hub model whose files are not in
the local Hugging Face cache is reported in ``warnings`` together with the offline choices. A
plan holds each fact once: the full shrunk config is shrink_config's, each component's
derivation estimate_memory's.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlhf_lab.errors import InvalidArgument, NextStep, NotFound, Unavailable
from rlhf_lab.planning.memory import OFFLINE_CHOICES, MemoryEstimate, estimate_memory, fits, model_facts
from rlhf_lab.paths import LabError, campaign_name, check_slug
from rlhf_lab.planning.calibration import Calibration
from rlhf_lab.planning.calibration_apply import (
    CalibrationPolicy,
    default_policy,
    render_table,
    shrink_calibrated,
    using,
)
from rlhf_lab.planning.catalog import (
    ALGORITHM_ALIASES,
    Recipe,
    acceptance_for,
    algorithm_spec,
    all_algorithms,
    close_algorithm_matches,
    family_info,
    find_recipe,
    get_dotted,
    key_metrics_for,
    list_recipes,
    matched_controls,
    normalize_algorithm,
    recipe_for_algorithm,
    watch_for,
)
from rlhf_lab.planning.configs import ConfigChange
from rlhf_lab.planning.shrink import format_override, shrink_config
from rlhf_lab.planning.time import TimeEstimate, plan_time_total, predict_planned_run
from rlhf_lab.runs.resources import Resources, check_resources

__all__ = [
    "Criteria",
    "DeviceFit",
    "MemoryBrief",
    "Plan",
    "PlannedRun",
    "matched_overrides",
    "parse_request",
    "plan_experiment",
]

# Matched random controls of the reward-selected rejection-sampling strategies (from the specs).
MATCHED_CONTROL: dict[str, str] = matched_controls()
CPU_PARAM_LIMIT = 200_000_000  # above this, a CPU run is too slow to recommend
_COMPARE_WORDS = re.compile(r"\b(compare|comparison|vs\.?|versus|against)\b")
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


class DeviceFit(BaseModel):
    device: str = Field(description="cuda:<index> or cpu")
    name: str
    total_gb: float
    free_gb: float
    estimate_gb: float | None
    fits: bool | None = Field(description="estimate plus a 10% margin fits in the free memory")
    held_by: list[str] = Field(default_factory=list, description="lab runs using this device")


class MemoryBrief(BaseModel):
    """A memory estimate in brief (estimate_memory gives every component and its derivation)."""

    total_gb: float
    dtype: str
    param_count: int
    largest: str = Field(description="the largest component and its GiB")


class Criteria(BaseModel):
    """What to watch and what a good run shows, for the algorithms named (a run's criteria are
    every entry that names its algorithm)."""

    algorithms: list[str]
    key_metrics: list[str] = Field(default_factory=list)
    acceptance: list[str] = Field(default_factory=list)
    watch: list[str] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.key_metrics or self.acceptance or self.watch)


class PlannedRun(BaseModel):
    name: str = Field(description="this run's name in the plan, e.g. grpo or top_per_prompt[prm]")
    recipe: str = Field(description="<family>/<name> of the shipped recipe (or the YAML path)")
    config_path: str
    family: str
    algorithm: str
    model: str | None
    changes: list[ConfigChange] = Field(
        description="values that differ from the recipe: the shrink rules, the matching, yours"
    )
    expected_optimizer_steps: int | None
    memory: dict[str, MemoryBrief] = Field(
        default_factory=dict, description="estimate per device kind (cuda: bf16, cpu: fp32)"
    )
    devices: list[DeviceFit] = Field(default_factory=list)
    recommended_device: str | None = None
    env: dict[str, str] = Field(default_factory=dict, description="environment for the trainer")
    launch_command: str = Field(description="the lab command (it shrinks and records the run)")
    trainer_command: str = Field(description="the same run as a bare trainer command")
    after: list[str] = Field(
        default_factory=list, description="runs of this plan that must finish first (by name)"
    )
    calibration: Calibration | None = Field(
        default=None,
        description="the difficulty probe of the base model and the task/length it chose "
        "(runs that learn from their own samples; rlhf_lab.planning.calibration)",
    )
    calibration_table: list[str] = Field(
        default_factory=list,
        exclude=True,  # the same facts as `calibration`: printed by the CLI, never serialised
        description="the calibration as the CLI prints it",
    )
    time: TimeEstimate | None = None  # predicted wall time here (rlhf_lab.planning.time)


class Plan(BaseModel):
    request: str | None
    intent: Literal["sanity", "compare", "pipeline"]
    pipeline: str | None = Field(
        default=None, description="the pipeline these runs are (run_pipeline launches them all)"
    )
    pipeline_command: str | None = Field(
        default=None, description="the lab command that queues every stage of the pipeline"
    )
    campaign: str = Field(description="ledger slug")
    campaign_name: str = Field(description="YYYY-MM-DD-<slug>: the ledger file and folder")
    runs: list[PlannedRun]
    steps: list[str] = Field(description="the launch order, naming the runs; later steps wait")
    matched: list[str] = Field(
        default_factory=list, description="settings held equal across the runs (key=value)"
    )
    comparison: str | None = None
    criteria: list[Criteria] = Field(
        default_factory=list,
        description="key metrics, acceptance and what to watch; shared ones listed once",
    )
    warnings: list[str] = Field(
        default_factory=list, description="'<runs>: ...' when it concerns some runs only"
    )
    offline_choices: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    time_total_s: float | None = None  # every run, one after another
    time_total: str | None = None


# ---------------------------------------------------------------------------------------------
# Parsing a request
# ---------------------------------------------------------------------------------------------


# Algorithm names too common as plain words to be read from free text ("dpo on my preference
# data"); aliases such as "preference rm" or "reward model" still name them.
_TEXT_EXCLUDED = {"preference"}


def _phrases() -> dict[str, str]:
    """Phrase -> 'algo:<name>' or 'recipe:<id>', for matching inside free text."""
    out: dict[str, str] = {}
    for algo in all_algorithms():
        if algo in _TEXT_EXCLUDED:
            continue
        out[algo] = f"algo:{algo}"
        out[algo.replace("_", " ")] = f"algo:{algo}"
        out[algo.replace("_", "-")] = f"algo:{algo}"
    for alias, algo in ALGORITHM_ALIASES.items():
        out[alias] = f"algo:{algo}"
    for recipe in list_recipes():
        out.setdefault(recipe.name, f"recipe:{recipe.id}")
        out.setdefault(recipe.name.replace("_", " "), f"recipe:{recipe.id}")
        out[recipe.id] = f"recipe:{recipe.id}"
    return out


def _find_targets(text: str) -> list[str]:
    """Algorithms / recipes named in ``text``, in order, longest phrases first."""
    low = text.lower()
    hits: list[tuple[int, int, str]] = []
    for phrase, target in _phrases().items():
        pattern = r"(?<![a-z0-9_./-])" + re.escape(phrase) + r"s?(?![a-z0-9_/-])"
        for m in re.finditer(pattern, low):
            hits.append((m.start(), m.end(), target))
    hits.sort(key=lambda h: (-(h[1] - h[0]), h[0]))
    taken: list[tuple[int, int, str]] = []
    for start, end, target in hits:
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, target))
    ordered = [t for _, _, t in sorted(taken)]
    return list(dict.fromkeys(ordered))


_PRESET_RE = re.compile(r"(?<![a-z0-9_-])(tiny-llama|tiny)(?![a-z0-9_-])")
_SMALL_RE = re.compile(r"\b(?:on|with|using)\s+(?:the\s+)?small\b|\bsmall\s+(?:model|preset)\b")
_HUB_RE = re.compile(r"(?<![\w./-])([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?![\w/-])")
_PATH_RE = re.compile(r"(?:^|\s)((?:\.{1,2}/|/|~/)\S+)")


def _find_model(text: str) -> str | None:
    low = text.lower()
    m = _PRESET_RE.search(low)
    if m:
        return m.group(1)
    if _SMALL_RE.search(low):
        return "small"
    for m in _PATH_RE.finditer(text):
        candidate = m.group(1).rstrip(".,;")
        p = Path(candidate).expanduser()
        if p.exists() and not candidate.endswith((".yaml", ".yml")):
            return candidate
    recipe_ids = {r.id for r in list_recipes()}
    for m in _HUB_RE.finditer(text):
        candidate = m.group(1).rstrip(".,;")
        if candidate in recipe_ids or candidate.endswith((".yaml", ".yml")):
            continue
        if candidate.split("/")[0] in {"trainers", "experiments"}:
            continue
        if not re.search(r"[A-Z0-9]", candidate):  # "and/or" is no model id
            continue
        return candidate
    return None


def _find_config_path(text: str) -> str | None:
    for token in text.split():
        token = token.strip(",;\"'")
        if token.endswith((".yaml", ".yml")) and Path(token).expanduser().is_file():
            return token
    return None


class ParsedRequest(BaseModel):
    targets: list[str] = Field(description="'algo:<name>' / 'recipe:<id>' / 'path:<file>'")
    model: str | None
    compare: bool


def parse_request(text: str) -> ParsedRequest:
    """Algorithms (or recipes / a YAML path), model and intent named in a free-text request."""
    targets = _find_targets(text)
    path = _find_config_path(text)
    if path:
        targets.insert(0, f"path:{path}")
    return ParsedRequest(
        targets=targets,
        model=_find_model(text),
        compare=bool(_COMPARE_WORDS.search(text.lower())) or len(targets) > 1,
    )


def _no_algorithm_error(text: str) -> LabError:
    close: list[str] = []
    for word in re.findall(r"[a-z][a-z0-9_.-]{2,}", text.lower()):
        for m in close_algorithm_matches(word, n=2):
            if m not in close:
                close.append(m)
    hint = f" Did you mean: {', '.join(close[:5])}?" if close else ""
    return InvalidArgument(
        f"no algorithm found in {text!r}.{hint} Name one, e.g. 'dpo sanity check', "
        f"'compare dpo and ipo', 'grpo on tiny'. Algorithms: {', '.join(all_algorithms())}",
        next=NextStep("list_recipes", note="lists every algorithm by family"),
    )


def _recipe_of(target: str) -> Recipe:
    kind, _, value = target.partition(":")
    if kind == "algo":
        return recipe_for_algorithm(value)
    return find_recipe(value)


def _recipe_from_algorithm_arg(algorithm: str) -> Recipe:
    canon = normalize_algorithm(algorithm)
    if canon is not None:
        return recipe_for_algorithm(canon)
    try:
        return find_recipe(algorithm)
    except LabError:
        pass
    close = close_algorithm_matches(algorithm)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise NotFound(
        f"unknown algorithm {algorithm!r}.{hint} Algorithms: {', '.join(all_algorithms())}",
        next=NextStep("list_recipes", note="lists every algorithm by family"),
    )


# ---------------------------------------------------------------------------------------------
# Planning one run
# ---------------------------------------------------------------------------------------------


def _recipe_ref(recipe: Recipe) -> str:
    if not recipe.shipped:
        return recipe.config_path
    try:
        if find_recipe(recipe.name).id == recipe.id:
            return recipe.name
    except LabError:
        pass
    return recipe.id


def _model_warnings(name: str | None) -> tuple[Any, list[str], bool]:
    """(facts or None, warnings, whether the model is unusable here)."""
    if not name:
        return None, ["the config names no model"], True
    from trainers.core.models import hub_offline, hub_reachable

    try:
        facts = model_facts(name)
    except LabError as err:
        return None, [f"model {name!r} cannot be resolved here: {err}"], True
    warnings = list(facts.warnings)
    unusable = False
    if facts.kind == "hub" and not facts.loadable:
        if hub_offline():
            why = "HF_HUB_OFFLINE=1 is set"
        elif not hub_reachable():
            why = "the Hugging Face hub cannot be reached from here"
        else:
            why = None
        if why:
            unusable = True
            warnings = [
                f"model {name} cannot be loaded here: {why} and its weights are not in the "
                f"local Hugging Face cache (no download was attempted); see offline_choices"
            ]
    return facts, warnings, unusable


def _devices(
    res: Resources, memory: dict[str, MemoryEstimate], config: dict[str, Any]
) -> tuple[list[DeviceFit], str | None, list[str]]:
    out: list[DeviceFit] = []
    warnings: list[str] = []
    gpu_est = memory.get("cuda")
    cpu_est = memory.get("cpu")
    for gpu in res.gpus:
        est = gpu_est.total_gb if gpu_est else None
        out.append(
            DeviceFit(
                device=f"cuda:{gpu.index}",
                name=gpu.name,
                total_gb=gpu.total_gb,
                free_gb=gpu.free_gb,
                estimate_gb=est,
                fits=fits(est, gpu.free_gb) if est is not None else None,
                held_by=list(gpu.lab_runs),
            )
        )
    cpu_e = cpu_est.total_gb if cpu_est else None
    out.append(
        DeviceFit(
            device="cpu",
            name=f"{res.cpu_count} CPU cores",
            total_gb=res.ram_total_gb,
            free_gb=res.ram_available_gb,
            estimate_gb=cpu_e,
            fits=fits(cpu_e, res.ram_available_gb) if cpu_e is not None else None,
            held_by=[r.run_id for r in res.lab_runs if r.alive and not r.gpu_indices],
        )
    )
    wanted = str((config.get("model") or {}).get("device") or "auto")
    gpus = [d for d in out if d.device.startswith("cuda")]
    cpu = out[-1]
    choice: str | None = None
    if wanted != "cpu":
        free = [d for d in gpus if d.fits and not d.held_by]
        shared = [d for d in gpus if d.fits and d.held_by]
        if free:
            choice = max(free, key=lambda d: d.free_gb).device
        elif shared:
            pick = max(shared, key=lambda d: d.free_gb)
            choice = pick.device
            warnings.append(
                f"{pick.device} is in use by lab run(s) {', '.join(pick.held_by)}; the estimate "
                "fits beside them, but run one job at a time unless you checked"
            )
        elif gpus:
            warnings.append(
                "the estimate does not fit in the free memory of any GPU: shrink further "
                "(smaller train.batch_size or data.max_length) or plan with the model tiny"
            )
        if wanted == "cuda" and not gpus:
            warnings.append("the config asks for model.device=cuda but this machine has no GPU")
    if choice is None and wanted != "cuda":
        params = cpu_est.param_count if cpu_est else None
        if cpu.fits and params is not None and params <= CPU_PARAM_LIMIT:
            choice = "cpu"
        elif cpu.fits:
            warnings.append(
                f"no GPU here; the model ({params or 0:,} parameters) fits in RAM but a CPU run "
                "would be very slow: plan with the model tiny for a CPU sanity run"
            )
        elif cpu_e is not None:
            warnings.append(
                f"does not fit in the available RAM ({res.ram_available_gb:.1f} GiB free, "
                f"{cpu_e:.1f} GiB needed on CPU)"
            )
    return out, choice, warnings


def _memory_brief(estimate: MemoryEstimate) -> MemoryBrief:
    top = max(estimate.components, key=lambda c: c.gb, default=None)
    return MemoryBrief(
        total_gb=estimate.total_gb,
        dtype=estimate.dtype,
        param_count=estimate.param_count,
        largest=f"{top.name} {top.gb:.3g} GiB" if top else "",
    )


class _Arm(BaseModel):
    """One run to plan: the recipe, its name in the plan, the overrides that match it to the
    other runs, and what it waits for."""

    recipe: Recipe
    name: str
    matched: list[str] = Field(default_factory=list)
    after: list[str] = Field(default_factory=list)
    model: str | None = Field(default=None, description="its model swap (None: the plan's)")
    starts_from_run: bool = Field(
        default=False, description="its model.name is a run of the plan: no model swap"
    )


def _plan_run(
    arm: _Arm,
    model: str | None,
    overrides: list[str],
    slug: str,
    dated: str,
    res: Resources,
    queue: bool = False,
) -> tuple[PlannedRun, list[str]]:
    """A planned run and its warnings (``queue``: its launch waits for the device's jobs)."""
    recipe = arm.recipe
    # ``run:<orm-run-id>`` names a run of this plan: it is checked as that run (lineage's
    # pending runs); any other value naming a run id still unknown is carried as written
    pending = [o for o in arm.matched if "-run-id>" in o and "=run:<" not in o]
    ready = [o for o in arm.matched if o not in pending]
    shrink, calibration = shrink_calibrated(shrink_config, recipe, ready + overrides, model)
    family, algorithm = shrink.family, shrink.algorithm
    facts, warnings, _ = _model_warnings(shrink.model)
    if calibration is not None:
        warnings.extend(calibration.warnings)

    config = shrink.config
    memory: dict[str, MemoryEstimate] = {}
    if facts is not None:
        for device in ("cuda", "cpu"):
            try:
                memory[device] = estimate_memory(
                    family, algorithm, config, facts.params, device=device
                )
            except LabError as err:
                warnings.append(f"memory estimate ({device}) failed: {err}")
    devices, choice, dev_warnings = _devices(res, memory, shrink.config)
    warnings.extend(dev_warnings)
    env: dict[str, str] = {}
    if choice and choice.startswith("cuda:"):
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": choice.split(":")[1]}

    launch = ["uv", "run", "rlhf-lab", "launch", _recipe_ref(recipe), "--shrink"]
    if shrink.model_swap and model:
        launch += ["--model", model]
    for item in [*ready, *overrides, *pending]:  # launch --shrink calibrates again (cached)
        launch += ["--set", item]
    if choice and choice.startswith("cuda:") and choice != "cuda:0":
        launch += ["--device", choice]  # the launcher's `auto` would take cuda:0
    launch += ["--campaign", slug]
    if queue:
        launch += ["--queue"]

    info = family_info(family)
    trainer = ["uv", "run", "python", "-m", info.trainer_module, "--config", recipe.config_path]
    trainer += ["--run-dir", f"experiments/{dated}/runs/<run-id>"]
    for item in [*shrink.overrides, *pending]:
        trainer += ["--set", item]
    env_prefix = " ".join(f"{k}={v}" for k, v in env.items())
    trainer_command = (env_prefix + " " if env_prefix else "") + shlex.join(trainer)

    run = PlannedRun(
        name=arm.name,
        recipe=recipe.id if recipe.shipped else recipe.config_path,
        config_path=recipe.config_path,
        family=family,
        algorithm=algorithm,
        model=shrink.model,
        changes=[*shrink.diff, *_pending_changes(pending, shrink.config)],
        expected_optimizer_steps=shrink.expected_optimizer_steps,
        memory={k: _memory_brief(v) for k, v in memory.items()},
        devices=devices,
        recommended_device=choice,
        env=env,
        launch_command=shlex.join(launch),
        trainer_command=trainer_command,
        after=arm.after,
        calibration=calibration,
        calibration_table=render_table(calibration) if calibration else [],
        time=predict_planned_run(family, algorithm, config, choice),
    )
    return run, list(dict.fromkeys(warnings + shrink.notes))


# ---------------------------------------------------------------------------------------------
# Matching the runs of a comparison
# ---------------------------------------------------------------------------------------------


def _needs_groups(algorithm: str) -> bool:
    try:
        return bool(algorithm_spec(algorithm).needs_groups)
    except LabError:
        return False


def _match_policy_gradients(
    arms: list[_Arm], model: str | None, overrides: list[str]
) -> tuple[list[str], list[str]]:
    """Give the policy-gradient arms the settings of one reference arm (the first that needs
    groups of rollouts, else the first): the same rollout shape, prompts, generation and steps.
    Fills each arm's ``matched`` overrides; returns (the matched key=value list, notes)."""
    pg = [a for a in arms if a.recipe.family == "policy_gradients"]
    if len(pg) < 2:
        return [], []
    shrunk = {a.name: shrink_config(a.recipe, overrides, model=model) for a in pg}
    ref = next((a for a in pg if _needs_groups(shrunk[a.name].algorithm)), pg[0])
    ref_config = shrunk[ref.name].config
    values = {k: get_dotted(ref_config, k, _MISSING) for k in PG_MATCHED_KEYS}
    values = {k: v for k, v in values.items() if v is not _MISSING}
    for arm in pg:
        if arm is ref:
            continue
        config = shrunk[arm.name].config
        arm.matched = [
            format_override(key, value)
            for key, value in values.items()
            if get_dotted(config, key, _MISSING) != value
        ]
    prompts = values.get("rollout.prompts_per_step")
    rollouts = values.get("rollout.num_rollouts")
    notes = []
    if isinstance(prompts, int) and isinstance(rollouts, int):
        notes.append(
            f"matched sample budget: {prompts * rollouts} completions per step ({prompts} prompts "
            f"× {rollouts} rollouts) in every run, the shape of {ref.name}"
            + (" (it needs groups of rollouts)" if _needs_groups(ref.recipe.algorithm) else "")
            + f"; the same {values.get('data.size', '?')} prompts (task, held-out set, seed)"
        )
    shown = [
        format_override(k, v) if len(format_override(k, v)) <= 60 else f"{k} (as in {ref.name})"
        for k, v in values.items()
    ]
    return shown, notes


def matched_overrides(
    recipes: list[str], model: str | None = None, overrides: list[str] | None = None
) -> dict[str, list[str]]:
    """The overrides that match several recipes to each other (policy gradients: one rollout
    shape, the same prompts and step settings; other families: none), by recipe as given; the
    caller's ``overrides`` go after them. For launching matched runs without a plan (a sweep)."""
    arms = [_Arm(recipe=find_recipe(r), name=f"{i}") for i, r in enumerate(recipes)]
    _match_policy_gradients(arms, model, list(overrides or []))
    return {r: arm.matched for r, arm in zip(recipes, arms, strict=True)}


def _pending_changes(pending: list[str], config: dict[str, Any]) -> list[ConfigChange]:
    """The diff entries of overrides that wait for an upstream run (see :func:`_plan_run`)."""
    changes = []
    for item in pending:
        key, _, value = item.partition("=")
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        shipped = node if isinstance(node, str | int | float | bool) else None
        changes.append(ConfigChange(key=key, shipped=shipped, used=value))
    return changes


def _scorer_arms(recipes: list[Recipe], dated: str, preset: bool) -> tuple[list[_Arm], list[str]]:
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
    arms: list[_Arm] = []
    for rm in rms:
        matched = []
        if preset and rm.algorithm == "orm":  # score the task the prompts come from
            matched = ["data.dataset=builtin:reasoning-outcomes:chain_sum"]
        arms.append(_Arm(recipe=rm, name=rm.algorithm, matched=matched))
    for strategy in selected:
        for rm in rms:
            arms.append(
                _Arm(
                    recipe=strategy,
                    name=f"{strategy.algorithm}[{rm.algorithm}]",
                    matched=[f"scorer.name=run:{_placeholder(rm.algorithm)}"],
                    after=[rm.algorithm],
                )
            )
    for control in controls:
        arms.append(_Arm(recipe=control, name=control.algorithm))
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


def _placeholder(name: str) -> str:
    """How a run of this plan is named before it exists: ``<orm-run-id>``."""
    return f"<{name}-run-id>"


def _plan_runs(
    arms: list[_Arm],
    model: str | None,
    overrides: list[str],
    slug: str,
    dated: str,
    res: Resources,
    queue: bool,
) -> list[tuple[PlannedRun, list[str]]]:
    """Plan the arms in order; each planned run stands in for itself under its placeholder id
    (``run:<orm-run-id>``), so a later arm that takes its output is checked and sized as the
    model it will be (:func:`rlhf_lab.runs.lineage.pending_runs`)."""
    from rlhf_lab.runs.lineage import Upstream, base_model, pending_runs

    known: dict[str, Upstream] = {}
    out = []
    for arm in arms:
        with pending_runs(known):
            own = None if arm.starts_from_run else arm.model or model
            run, warnings = _plan_run(arm, own, overrides, slug, dated, res, queue)
            base = base_model(run.model) if run.model else None
        known[_placeholder(arm.name)] = Upstream(
            run_id=_placeholder(arm.name),
            family=run.family,
            algorithm=run.algorithm,
            state="queued",
            base_model=base,
        )
        out.append((run, warnings))
    return out


def _scorer_steps(runs: list[PlannedRun], dated: str) -> list[str]:
    rm = [r.name for r in runs if r.family == "reward_models"]
    dependent = [r.name for r in runs if r.after]
    free = [r.name for r in runs if not r.after and r.family != "reward_models"]
    ids = ", ".join(f"<{n}-run-id>" for n in rm)
    return [
        f"1. launch the reward models {', '.join(rm)} (and {', '.join(free)}, which needs no "
        "reward model) with their launch_command; note each run id launch prints",
        f"2. launch {', '.join(dependent)} with their launch_command, replacing {ids} with those "
        f"run ids: each is queued and starts once its reward model has succeeded (wait until "
        f"{' and '.join(rm)} have succeeded; a failed one cancels its dependents)",
        "3. record_results on every run, then compare the rejection-sampling runs together "
        "(compare_runs) and the reward models together",
    ]


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def _evaluation_steps(runs: list[PlannedRun], number: int) -> list[str]:
    """An evaluation after every training run, with its cost (rlhf_lab.evaluation.cost)."""
    from rlhf_lab.evaluation.cost import plan_evaluation_step

    step = plan_evaluation_step(runs, number)
    return [step] if step else []


def _plain_steps(runs: list[PlannedRun]) -> list[str]:
    names = ", ".join(r.name for r in runs)
    if len(runs) == 1:
        return [f"1. launch {names} with its launch_command, then poll its status until it ends"]
    return [
        f"1. launch {names} with their launch_command: each queues behind the jobs already on "
        "its device (one training job per device), so they run one after another",
        "2. record_results on every run, then compare_runs on them together",
    ]


def _criteria(runs: list[PlannedRun]) -> list[Criteria]:
    """Each algorithm's key metrics, acceptance and watch items, those its family shares in the
    plan listed once for all of them."""
    by_family: dict[str, list[str]] = {}
    for run in runs:
        algos = by_family.setdefault(run.family, [])
        if run.algorithm not in algos:
            algos.append(run.algorithm)
    out: list[Criteria] = []
    for family, algos in by_family.items():
        own = {
            a: Criteria(
                algorithms=[a],
                key_metrics=key_metrics_for(family, a),
                acceptance=acceptance_for(family, a),
                watch=watch_for(family, a),
            )
            for a in algos
        }
        first = own[algos[0]]
        shared = Criteria(
            algorithms=algos,
            **{
                field: [
                    x
                    for x in getattr(first, field)
                    if all(x in getattr(c, field) for c in own.values())
                ]
                for field in ("key_metrics", "acceptance", "watch")
            },
        )
        if len(algos) > 1 and shared:
            out.append(shared)
            for a, c in own.items():
                rest = Criteria(
                    algorithms=[a],
                    **{
                        field: [x for x in getattr(c, field) if x not in getattr(shared, field)]
                        for field in ("key_metrics", "acceptance", "watch")
                    },
                )
                if rest:
                    out.append(rest)
        else:
            out.extend(own.values())
    return out


def _merged_warnings(per_run: list[tuple[str, list[str]]]) -> list[str]:
    """Each warning once: as it is when every run has it, else prefixed with the runs it
    concerns."""
    seen: dict[str, list[str]] = {}
    for name, warnings in per_run:
        for w in warnings:
            seen.setdefault(w, []).append(name)
    return [
        text if len(per_run) == 1 or len(names) == len(per_run) else f"{', '.join(names)}: {text}"
        for text, names in seen.items()
    ]


def plan_experiment(
    request: str | None = None,
    algorithm: str | None = None,
    model: str | None = None,
    campaign: str | None = None,
    overrides: list[str] | None = None,
    calibrate: bool = True,
    calibration: CalibrationPolicy | None = None,
) -> Plan:
    """Plan a sanity run (or a matched comparison) from free text and/or explicit arguments.

    ``algorithm`` (a name, alias, recipe or YAML path) and ``model`` win over what the text
    says; ``campaign`` is the ledger slug (default ``<algo>-sanity``, ``<a>-vs-<b>`` for a
    comparison); ``overrides`` are extra dotted overrides applied to every run after the shrink
    rules and the matching. Before planning, the lab measures what it needs: runs that learn
    from their own samples are calibrated (:mod:`rlhf_lab.planning.calibration`: a probe of the
    base model picks the task and the generation limit), and the model's throughput on this
    machine is measured once for the time estimates (:mod:`rlhf_lab.planning.time`).
    ``calibrate=False`` measures nothing: no probe, and times only from a cached throughput
    calibration (else "time: not calibrated"). ``calibration`` replaces the default difficulty
    policy (its probe and cache).
    """
    from rlhf_lab.planning.throughput_cache import calibration_scope

    with using(calibration or default_policy(calibrate)):
        with calibration_scope(None if calibrate else "cached"):
            plan = _plan_experiment(request, algorithm, model, campaign, overrides)
    return plan.model_copy(update=plan_time_total(plan.runs, plan.notes))


def _plan_experiment(
    request: str | None,
    algorithm: str | None,
    model: str | None,
    campaign: str | None,
    overrides: list[str] | None,
) -> Plan:
    if not request and not algorithm:
        raise InvalidArgument(
            "say what to run: a request ('dpo sanity check') or an algorithm",
            next=NextStep("list_recipes", note="lists the algorithms that can be planned"),
        )
    parsed = (
        parse_request(request) if request else ParsedRequest(targets=[], model=None, compare=False)
    )
    if request and not algorithm:
        from rlhf_lab.runs.pipelines import match_pipeline

        wanted = match_pipeline(request)
        if wanted is not None:
            return _plan_pipeline(wanted, request, model or parsed.model, campaign, overrides)
    if algorithm:
        recipes = [_recipe_from_algorithm_arg(algorithm)]
        for target in parsed.targets:
            extra = _recipe_of(target)
            if extra.id not in {r.id for r in recipes} and parsed.compare:
                recipes.append(extra)
    else:
        if not parsed.targets:
            raise _no_algorithm_error(request or "")
        recipes = []
        for target in parsed.targets:
            r = _recipe_of(target)
            if r.id not in {x.id for x in recipes}:
                recipes.append(r)
    chosen_model = model or parsed.model
    user = list(overrides or [])
    families = {r.family for r in recipes}
    scorer_question = {"reward_models", "rejection_sampling"} <= families

    intent: Literal["sanity", "compare"] = "compare" if len(recipes) > 1 else "sanity"
    notes: list[str] = []
    if intent == "sanity" and recipes[0].algorithm in MATCHED_CONTROL:
        control = MATCHED_CONTROL[recipes[0].algorithm]
        try:
            recipes.append(recipe_for_algorithm(control))
            notes.append(
                f"{recipes[0].algorithm} is reported beside its matched random control "
                f"{control}: both are planned"
            )
        except LabError as err:
            notes.append(f"its matched random control {control} cannot be planned: {err}")

    if campaign is not None:  # "" is a bad slug, not "use the default"
        slug = check_slug(campaign)
    elif scorer_question:
        rms = "-vs-".join(r.algorithm for r in recipes if r.family == "reward_models")
        rs = next(r for r in recipes if r.family == "rejection_sampling")
        slug = f"{rs.algorithm.replace('_', '-')}-{rms.replace('_', '-')}"[:60].strip("-")
    elif intent == "compare":
        slug = "-vs-".join(r.algorithm.replace("_", "-") for r in recipes)
        if len(slug) > 60:
            slug = f"{recipes[0].family.replace('_', '-')}-comparison"
    else:
        slug = f"{recipes[0].algorithm.replace('_', '-')}-sanity"
    check_slug(slug)
    dated = campaign_name(slug)

    matched: list[str] = []
    if scorer_question:
        from trainers.core.tiny import PRESETS

        arms, scorer_notes = _scorer_arms(recipes, dated, chosen_model in PRESETS)
        notes += scorer_notes
    else:
        arms = [_Arm(recipe=r, name=r.algorithm) for r in recipes]
        names = [a.name for a in arms]
        for i, arm in enumerate(arms):  # the same algorithm twice (two YAML files): tell apart
            if names.count(arm.name) > 1:
                arm.name = f"{arm.name}#{i + 1}"
        matched, match_notes = _match_policy_gradients(arms, chosen_model, user)
        notes += match_notes

    res = check_resources()
    queue = len(arms) > 1  # one training job per device: the runs of a plan wait their turn
    planned = _plan_runs(arms, chosen_model, user, slug, dated, res, queue)
    runs = [run for run, _ in planned]
    warnings = _merged_warnings([(run.name, w) for run, w in planned])
    offline: list[str] = []
    if any("cannot be loaded here" in w or "cannot be resolved" in w for w in warnings):
        offline = list(OFFLINE_CHOICES)

    comparison = None
    run_families = {r.family for r in runs}
    if scorer_question:
        rs_runs = [r for r in runs if r.family == "rejection_sampling"]
        scored = [f"{r.name} (scored by the {r.after[0]} run)" for r in rs_runs if r.after]
        controls = [r.name for r in rs_runs if not r.after]
        comparison = (
            f"held-out exact match (eval/exact_match) of {', '.join(scored)} against the matched "
            f"random control {', '.join(controls)}: a scorer helps only by the gain over its "
            "control; the reward models' own held-out metrics say how well each scores. "
            + family_info("rejection_sampling").comparison
        )
    elif len(runs) > 1:
        if len(run_families) == 1:
            comparison = family_info(runs[0].family).comparison
        else:
            comparison = (
                "different families: judge each run against its own acceptance criteria; their "
                "metrics are not comparable"
            )
        comparison += "; keep the seed and the shrunk settings identical across runs"
    steps = _scorer_steps(runs, dated) if scorer_question else _plain_steps(runs)
    steps += _evaluation_steps(runs, len(steps) + 1)
    criteria = _criteria(runs)
    return Plan(
        request=request,
        intent=intent,
        campaign=slug,
        campaign_name=dated,
        runs=runs,
        steps=steps,
        matched=matched,
        comparison=comparison,
        criteria=criteria,
        warnings=warnings,
        offline_choices=offline,
        notes=notes + res.notes,
    )


# ---------------------------------------------------------------------------------------------
# Pipelines
# ---------------------------------------------------------------------------------------------


def _plan_pipeline(
    name: str,
    request: str | None,
    model: str | None,
    campaign: str | None,
    overrides: list[str] | None,
) -> Plan:
    """A request for a chain ("an RLHF pipeline", "train a reward model then run PPO against
    it", "r1-zero"): the pipeline's stages as planned runs, each after the stages whose output it
    takes (``run:<sft-run-id>`` in its command), the one command that queues them all, and what
    to check at each stage. An override without a stage name applies to every stage."""
    from rlhf_lab.runs.pipelines import find_pipeline, plan_stages, with_run_ids

    defn = find_pipeline(name)
    user = [
        o if o.split(".", 1)[0] in defn.stages or o.startswith("*.") else f"*.{o}"
        for o in overrides or []
    ]
    stages = plan_stages(defn, model, user)
    missing = []
    for stage in stages:
        try:
            find_recipe(stage.recipe)
        except LabError:
            missing.append(f"{stage.name}: {stage.recipe}")
    if missing:
        raise Unavailable(
            f"the {defn.name} pipeline needs recipes this checkout does not have ({', '.join(missing)})",
            next=NextStep("list_recipes", note="the recipes and pipelines available"),
        )
    slug = check_slug(campaign) if campaign is not None else f"{defn.name}-pipeline"
    dated = campaign_name(slug)
    ids = {s.name: _placeholder(s.name) for s in stages}
    arms = [
        _Arm(
            recipe=find_recipe(s.recipe),
            name=s.name,
            matched=with_run_ids(s.overrides, ids),
            after=s.after,
            model=s.model,
            starts_from_run="model.name" in s.refs,
        )
        for s in stages
    ]
    res = check_resources()
    planned = _plan_runs(arms, None, [], slug, dated, res, queue=True)
    runs = [run for run, _ in planned]
    argv = ["uv", "run", "rlhf-lab", "pipeline", defn.name]
    if model:
        argv += ["--model", model]
    for item in user:
        argv += ["--set", item]
    argv += ["--campaign", slug]
    chain = " → ".join(s.name for s in stages)
    steps = [
        f"1. queue every stage at once with pipeline_command (run_pipeline): {chain}; each stage "
        "starts when the stages whose final model it takes have succeeded, and a failed stage "
        "cancels the later ones (resume_run on it re-arms them); the launch_command of each run "
        "does the same one stage at a time",
    ]
    steps += [
        f"{i}. {s.name} ({s.recipe}): {' '.join(s.check.split())}"
        for i, s in enumerate([s for s in stages if s.check], start=2)
    ]
    steps.append(
        f"{len(steps) + 1}. each stage is recorded in the campaign ledger when it ends; its "
        "Setup section shows the stages and where each output went"
    )
    steps += _evaluation_steps(runs, len(steps) + 1)
    return Plan(
        request=request,
        intent="pipeline",
        pipeline=defn.name,
        pipeline_command=shlex.join(argv),
        campaign=slug,
        campaign_name=dated,
        runs=runs,
        steps=steps,
        comparison=None,
        criteria=_criteria(runs),
        warnings=_merged_warnings([(run.name, w) for run, w in planned]),
        notes=[" ".join(defn.description.split()), *res.notes],
    )
