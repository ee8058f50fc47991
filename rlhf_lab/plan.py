"""Plan an experiment from a request such as "small SimPO sanity check", "compare dpo and ipo" or
"grpo on tiny": the recipe, the shrunk config and its diff, the memory estimate beside the free
memory of every device, the exact launch and trainer commands, what to watch, the acceptance
criteria and the ledger campaign.

Nothing is launched or written. Models are never downloaded: a hub model whose files are not in
the local Hugging Face cache is reported in ``warnings`` together with the offline choices.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from rlhf_lab.catalog import (
    ALGORITHM_ALIASES,
    Recipe,
    acceptance_for,
    all_algorithms,
    close_algorithm_matches,
    family_info,
    find_recipe,
    key_metrics_for,
    list_recipes,
    matched_controls,
    normalize_algorithm,
    recipe_for_algorithm,
    watch_for,
)
from rlhf_lab.errors import InvalidArgument, NextStep, NotFound
from rlhf_lab.memory import OFFLINE_CHOICES, MemoryEstimate, estimate_memory, fits, model_facts
from rlhf_lab.paths import LabError, campaign_name, check_slug
from rlhf_lab.resources import Resources, check_resources
from rlhf_lab.shrink import ShrinkResult, shrink_config

__all__ = ["DeviceFit", "Plan", "PlannedRun", "parse_request", "plan_experiment"]

# Matched random controls of the reward-selected rejection-sampling strategies (from the specs).
MATCHED_CONTROL: dict[str, str] = matched_controls()
CPU_PARAM_LIMIT = 200_000_000  # above this, a CPU run is too slow to recommend
_COMPARE_WORDS = re.compile(r"\b(compare|comparison|vs\.?|versus|against)\b")


class DeviceFit(BaseModel):
    device: str = Field(description="cuda:<index> or cpu")
    name: str
    total_gb: float
    free_gb: float
    estimate_gb: float | None
    fits: bool | None = Field(description="estimate plus a 10% margin fits in the free memory")
    held_by: list[str] = Field(default_factory=list, description="lab runs using this device")


class PlannedRun(BaseModel):
    recipe: Recipe
    family: str
    algorithm: str
    model: str | None
    shrink: ShrinkResult
    memory: dict[str, MemoryEstimate] = Field(
        default_factory=dict, description="estimate per device kind (cuda: bf16, cpu: fp32)"
    )
    devices: list[DeviceFit] = Field(default_factory=list)
    recommended_device: str | None = None
    env: dict[str, str] = Field(default_factory=dict, description="environment for the trainer")
    launch_argv: list[str]
    launch_command: str
    trainer_argv: list[str]
    trainer_command: str
    expected_optimizer_steps: int | None
    key_metrics: list[str]
    acceptance: list[str]
    watch: list[str]
    warnings: list[str] = Field(default_factory=list)


class Plan(BaseModel):
    request: str | None
    intent: Literal["sanity", "compare"]
    campaign: str = Field(description="ledger slug")
    campaign_name: str = Field(description="YYYY-MM-DD-<slug>: the ledger file and folder")
    runs: list[PlannedRun]
    comparison: str | None = None
    resources: Resources
    warnings: list[str] = Field(default_factory=list)
    offline_choices: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @computed_field
    @property
    def recipe(self) -> str:
        """The first run's recipe id."""
        return self.runs[0].recipe.id

    @computed_field
    @property
    def launch_commands(self) -> list[str]:
        return [r.launch_command for r in self.runs]


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
    from trainers.core.models import PULL_HINT, hub_offline, hub_reachable

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
                f"local Hugging Face cache (no download was attempted). Offline choices: plan "
                f"with model='tiny', or `{PULL_HINT}`."
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
                "(--set train.batch_size=..., data.max_length=...) or use --model tiny"
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
                "would be very slow: use --model tiny for a CPU sanity run"
            )
        elif cpu_e is not None:
            warnings.append(
                f"does not fit in the available RAM ({res.ram_available_gb:.1f} GiB free, "
                f"{cpu_e:.1f} GiB needed on CPU)"
            )
    return out, choice, warnings


def _plan_run(
    recipe: Recipe,
    model: str | None,
    overrides: list[str],
    slug: str,
    dated: str,
    res: Resources,
) -> PlannedRun:
    shrink = shrink_config(recipe, overrides, model=model)
    family, algorithm = shrink.family, shrink.algorithm
    facts, warnings, _ = _model_warnings(shrink.model)

    memory: dict[str, MemoryEstimate] = {}
    if facts is not None:
        for device in ("cuda", "cpu"):
            try:
                memory[device] = estimate_memory(
                    family, algorithm, shrink.config, facts.params, device=device
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
    for item in shrink.user_overrides:
        launch += ["--set", item]
    if choice and choice.startswith("cuda:") and choice != "cuda:0":
        launch += ["--device", choice]  # the launcher's `auto` would take cuda:0
    launch += ["--campaign", slug]

    info = family_info(family)
    trainer = ["uv", "run", "python", "-m", info.trainer_module, "--config", recipe.config_path]
    trainer += ["--run-dir", f"experiments/{dated}/runs/<run-id>"]
    for item in shrink.overrides:
        trainer += ["--set", item]
    env_prefix = " ".join(f"{k}={v}" for k, v in env.items())
    trainer_command = (env_prefix + " " if env_prefix else "") + shlex.join(trainer)

    return PlannedRun(
        recipe=recipe,
        family=family,
        algorithm=algorithm,
        model=shrink.model,
        shrink=shrink,
        memory=memory,
        devices=devices,
        recommended_device=choice,
        env=env,
        launch_argv=launch,
        launch_command=shlex.join(launch),
        trainer_argv=trainer,
        trainer_command=trainer_command,
        expected_optimizer_steps=shrink.expected_optimizer_steps,
        key_metrics=key_metrics_for(family, algorithm),
        acceptance=acceptance_for(family, algorithm),
        watch=watch_for(family, algorithm),
        warnings=list(dict.fromkeys(warnings + shrink.notes)),
    )


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


def plan_experiment(
    request: str | None = None,
    algorithm: str | None = None,
    model: str | None = None,
    campaign: str | None = None,
    overrides: list[str] | None = None,
) -> Plan:
    """Plan a sanity run (or a comparison) from free text and/or explicit arguments.

    ``algorithm`` (a name, alias, recipe or YAML path) and ``model`` win over what the text
    says; ``campaign`` is the ledger slug (default ``<algo>-sanity``, or ``<a>-vs-<b>`` for a
    comparison); ``overrides`` are extra ``--set`` items applied after the shrink rules.
    """
    if not request and not algorithm:
        raise InvalidArgument(
            "say what to run: a request ('dpo sanity check') or an algorithm",
            next=NextStep("list_recipes", note="lists the algorithms that can be planned"),
        )
    parsed = (
        parse_request(request) if request else ParsedRequest(targets=[], model=None, compare=False)
    )
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
    elif intent == "compare":
        slug = "-vs-".join(r.algorithm.replace("_", "-") for r in recipes)
        if len(slug) > 60:
            slug = f"{recipes[0].family.replace('_', '-')}-comparison"
    else:
        slug = f"{recipes[0].algorithm.replace('_', '-')}-sanity"
    check_slug(slug)
    dated = campaign_name(slug)

    res = check_resources()
    runs = [_plan_run(r, chosen_model, list(overrides or []), slug, dated, res) for r in recipes]

    warnings: list[str] = []
    for run in runs:
        warnings.extend(run.warnings)
    warnings = list(dict.fromkeys(warnings))
    offline: list[str] = []
    if any("cannot be loaded here" in w or "cannot be resolved" in w for w in warnings):
        offline = list(OFFLINE_CHOICES)

    comparison = None
    families = {r.family for r in runs}
    if len(runs) > 1:
        if len(families) == 1:
            comparison = family_info(runs[0].family).comparison
        else:
            comparison = (
                "different families: judge each run against its own acceptance criteria; their "
                "metrics are not comparable"
            )
        comparison += "; keep the seed and the shrunk settings identical across runs"
    return Plan(
        request=request,
        intent=intent,
        campaign=slug,
        campaign_name=dated,
        runs=runs,
        comparison=comparison,
        resources=res,
        warnings=warnings,
        offline_choices=offline,
        notes=notes + res.notes,
    )
