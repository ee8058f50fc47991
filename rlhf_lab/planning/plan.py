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
  (random selection ignores the scores, so one control serves every scorer);
* a request that names a tool ("GRPO with a calculator", "with vs without a calculator",
  "no tools") plans each policy-gradient recipe once per environment (:func:`tool_arms`: the
  ``<name>_tools`` recipe for a tool, the plain one without), the tool arms first, so the runs
  without a tool take the tools recipe's task and settings.

Nothing is launched or written. Models are never downloaded: a hub model whose files are not in
the local Hugging Face cache is reported in ``warnings`` together with the offline choices. A
plan holds each fact once: the full shrunk config is shrink_config's, each component's
derivation estimate_memory's.
"""

from __future__ import annotations

import shlex
from typing import Any, Literal

from rlhf_lab.errors import InvalidArgument, NextStep, Unavailable
from rlhf_lab.paths import LabError, campaign_name, check_slug
from rlhf_lab.planning.advice import (
    criteria_for,
    evaluation_steps,
    merged_warnings,
    plain_steps,
    scorer_steps,
)
from rlhf_lab.planning.arms import (
    MATCHED_CONTROL,
    Arm,
    match_policy_gradients,
    matched_overrides,
    pending_changes,
    placeholder,
    scorer_arms,
    tool_arms,
    tool_arms_slug,
)
from rlhf_lab.planning.calibration_apply import (
    CalibrationPolicy,
    default_policy,
    render_table,
    shrink_calibrated,
    using,
)
from rlhf_lab.planning.catalog import (
    Recipe,
    family_info,
    find_recipe,
    recipe_for_algorithm,
)
from rlhf_lab.planning.memory import (
    OFFLINE_CHOICES,
    MemoryEstimate,
    estimate_memory,
    fits,
    model_facts,
)
from rlhf_lab.planning.overrides import Override, as_overrides, texts
from rlhf_lab.planning.plan_models import Criteria, DeviceFit, MemoryBrief, Plan, PlannedRun
from rlhf_lab.planning.request import (
    ParsedRequest,
    no_algorithm_error,
    parse_request,
    recipe_from_algorithm_arg,
    recipe_of,
)
from rlhf_lab.planning.shrink import shrink_config
from rlhf_lab.planning.time import plan_time_total, predict_planned_run
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.runs.machine import check_resources
from rlhf_lab.runs.resources import Resources

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

CPU_PARAM_LIMIT = 200_000_000  # above this, a CPU run is too slow to recommend


# ---------------------------------------------------------------------------------------------
# Parsing a request
# ---------------------------------------------------------------------------------------------


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
    res: Resources, memory: dict[str, MemoryEstimate], config: TrainerConfig
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
    wanted = str(config.get("model.device") or "auto")
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


def _plan_run(
    arm: Arm,
    model: str | None,
    overrides: list[Override],
    slug: str,
    dated: str,
    res: Resources,
    queue: bool = False,
) -> tuple[PlannedRun, list[str]]:
    """A planned run and its warnings (``queue``: its launch waits for the device's jobs)."""
    recipe = arm.recipe
    # ``run:<orm-run-id>`` names a run of this plan: it is checked as that run (lineage's
    # pending runs); any other value naming a run id still unknown is carried as written
    pending = [o for o in arm.matched if "-run-id>" in o.text and "=run:<" not in o.text]
    ready = [o for o in arm.matched if o not in pending]
    shrink, calibration = shrink_calibrated(shrink_config, recipe, ready + overrides, model)
    family, algorithm = shrink.family, shrink.algorithm
    facts, warnings, _ = _model_warnings(shrink.model)
    if calibration is not None:
        warnings.extend(calibration.warnings)

    config = shrink.trainer_config
    memory: dict[str, MemoryEstimate] = {}
    if facts is not None:
        for device in ("cuda", "cpu"):
            try:
                memory[device] = estimate_memory(
                    family, algorithm, config, facts.params, device=device
                )
            except LabError as err:
                warnings.append(f"memory estimate ({device}) failed: {err}")
    devices, choice, dev_warnings = _devices(res, memory, config)
    warnings.extend(dev_warnings)
    env: dict[str, str] = {}
    if choice and choice.startswith("cuda:"):
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": choice.split(":")[1]}

    launch = ["uv", "run", "rlhf-lab", "launch", _recipe_ref(recipe), "--shrink"]
    if shrink.model_swap and model:
        launch += ["--model", model]
    for item in texts([*ready, *overrides, *pending]):  # launch --shrink calibrates again (cached)
        launch += ["--set", item]
    if choice and choice.startswith("cuda:") and choice != "cuda:0":
        launch += ["--device", choice]  # the launcher's `auto` would take cuda:0
    launch += ["--campaign", slug]
    if queue:
        launch += ["--queue"]

    info = family_info(family)
    trainer = ["uv", "run", "python", "-m", info.trainer_module, "--config", recipe.config_path]
    trainer += ["--run-dir", f"experiments/{dated}/runs/<run-id>"]
    for item in [*shrink.overrides, *texts(pending)]:
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
        changes=[*shrink.diff, *pending_changes(pending, config)],
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


def _plan_runs(
    arms: list[Arm],
    model: str | None,
    overrides: list[Override],
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
        known[placeholder(arm.name)] = Upstream(
            run_id=placeholder(arm.name),
            family=run.family,
            algorithm=run.algorithm,
            state="queued",
            base_model=base,
        )
        out.append((run, warnings))
    return out


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


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
    recipes = _recipes_named(parsed, algorithm, request)
    chosen_model = model or parsed.model
    families = {r.family for r in recipes}
    scorer_question = {"reward_models", "rejection_sampling"} <= families
    # "with a calculator", "with vs without a calculator": an arm per recipe and environment
    tools, notes = tool_arms(recipes, parsed.envs) if parsed.envs else ([], [])

    intent: Literal["sanity", "compare"] = "compare" if len(tools or recipes) > 1 else "sanity"
    if intent == "sanity":
        notes += _add_matched_control(recipes)
    if tools and campaign is None:
        campaign = tool_arms_slug(tools)
    slug = _campaign_slug(campaign, recipes, intent, scorer_question)
    dated = campaign_name(slug)

    user = as_overrides(overrides)  # the user's key=value items, parsed once
    matched: list[str] = []
    if scorer_question:
        from trainers.core.tiny import PRESETS

        arms, scorer_notes = scorer_arms(recipes, dated, chosen_model in PRESETS)
        notes += scorer_notes
    else:
        arms = tools or [Arm(recipe=r, name=r.algorithm) for r in recipes]
        names = [a.name for a in arms]
        for i, arm in enumerate(arms):  # the same algorithm twice (two YAML files): tell apart
            if names.count(arm.name) > 1:
                arm.name = f"{arm.name}#{i + 1}"
        matched, match_notes = match_policy_gradients(arms, chosen_model, user)
        notes += match_notes

    res = check_resources()
    queue = len(arms) > 1  # one training job per device: the runs of a plan wait their turn
    planned = _plan_runs(arms, chosen_model, user, slug, dated, res, queue)
    runs = [run for run, _ in planned]
    warnings = merged_warnings([(run.name, w) for run, w in planned])
    offline: list[str] = []
    if any("cannot be loaded here" in w or "cannot be resolved" in w for w in warnings):
        offline = list(OFFLINE_CHOICES)

    comparison = _comparison_rule(runs, scorer_question)
    steps = scorer_steps(runs, dated) if scorer_question else plain_steps(runs)
    steps += evaluation_steps(runs, len(steps) + 1)
    criteria = criteria_for(runs)
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


def _recipes_named(
    parsed: ParsedRequest, algorithm: str | None, request: str | None
) -> list[Recipe]:
    """The recipes a request plans, in order, each once: ``algorithm`` first when given (the
    text's other targets join it only for a comparison), else every target of the text."""
    if algorithm:
        recipes = [recipe_from_algorithm_arg(algorithm)]
        for target in parsed.targets:
            extra = recipe_of(target)
            if extra.id not in {r.id for r in recipes} and parsed.compare:
                recipes.append(extra)
        return recipes
    if not parsed.targets:
        raise no_algorithm_error(request or "")
    recipes = []
    for target in parsed.targets:
        r = recipe_of(target)
        if r.id not in {x.id for x in recipes}:
            recipes.append(r)
    return recipes


def _add_matched_control(recipes: list[Recipe]) -> list[str]:
    """A lone reward-selected strategy is planned beside its matched random control (appended to
    ``recipes``); returns the note that says so."""
    control = MATCHED_CONTROL.get(recipes[0].algorithm)
    if control is None:
        return []
    try:
        recipes.append(recipe_for_algorithm(control))
    except LabError as err:
        return [f"its matched random control {control} cannot be planned: {err}"]
    return [
        f"{recipes[0].algorithm} is reported beside its matched random control {control}: both "
        "are planned"
    ]


def _campaign_slug(
    campaign: str | None, recipes: list[Recipe], intent: str, scorer_question: bool
) -> str:
    """The campaign's slug: the caller's, else one named after what the plan runs."""
    if campaign is not None:  # "" is a bad slug, not "use the default"
        return check_slug(campaign)
    if scorer_question:
        rms = "-vs-".join(r.algorithm for r in recipes if r.family == "reward_models")
        rs = next(r for r in recipes if r.family == "rejection_sampling")
        slug = f"{rs.algorithm.replace('_', '-')}-{rms.replace('_', '-')}"[:60].strip("-")
    elif intent == "compare":
        slug = "-vs-".join(r.algorithm.replace("_", "-") for r in recipes)
        if len(slug) > 60:
            slug = f"{recipes[0].family.replace('_', '-')}-comparison"
    else:
        slug = f"{recipes[0].algorithm.replace('_', '-')}-sanity"
    return check_slug(slug)


def _comparison_rule(runs: list[PlannedRun], scorer_question: bool) -> str | None:
    """How the plan's runs are compared (None for a single run)."""
    if scorer_question:
        rs_runs = [r for r in runs if r.family == "rejection_sampling"]
        scored = [f"{r.name} (scored by the {r.after[0]} run)" for r in rs_runs if r.after]
        controls = [r.name for r in rs_runs if not r.after]
        return (
            f"held-out exact match (eval/exact_match) of {', '.join(scored)} against the matched "
            f"random control {', '.join(controls)}: a scorer helps only by the gain over its "
            "control; the reward models' own held-out metrics say how well each scores. "
            + family_info("rejection_sampling").comparison
        )
    if len(runs) < 2:
        return None
    if len({r.family for r in runs}) == 1:
        comparison = family_info(runs[0].family).comparison
    else:
        comparison = (
            "different families: judge each run against its own acceptance criteria; their "
            "metrics are not comparable"
        )
    return comparison + "; keep the seed and the shrunk settings identical across runs"


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
    ids = {s.name: placeholder(s.name) for s in stages}
    arms = [
        Arm(
            recipe=find_recipe(s.recipe),
            name=s.name,
            matched=as_overrides(with_run_ids(s.overrides, ids)),
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
    steps += evaluation_steps(runs, len(steps) + 1)
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
        criteria=criteria_for(runs),
        warnings=merged_warnings([(run.name, w) for run, w in planned]),
        notes=[" ".join(defn.description.split()), *res.notes],
    )
