"""Launching, the lab API's one way to start a run: :func:`launch` takes a
:class:`~rlhf_lab.api.request.RunRequest`, resolves it into the config the trainer runs, checks
everything before anything is written, and hands one
:class:`~rlhf_lab.runs.launcher.NewRun` to :func:`rlhf_lab.runs.launcher.start_or_queue` (or
submits it to Slurm). :func:`sweep` builds one request per arm; :func:`resume_run` continues a
run. Torch-free.

The device checks (free memory, a busy device, a GPU that is not there) are
:mod:`rlhf_lab.api`'s; what the machine has they read from :mod:`rlhf_lab.runs.machine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from rlhf_lab.api._operation import operation
from rlhf_lab.api.request import FIX_OVERRIDES, Override, RunRequest, SweepRequest
from rlhf_lab.errors import InvalidArgument, LabError, NextStep

if TYPE_CHECKING:  # pragma: no cover
    from rlhf_lab.api.results import SweepResult
    from rlhf_lab.planning.trainer_config import TrainerConfig
    from rlhf_lab.runs import LaunchResult
    from rlhf_lab.runs.devices import Placement
    from rlhf_lab.runs.launcher import NewRun

__all__ = ["MAX_SWEEP_SEEDS", "launch", "resume_run", "sweep", "with_predicted_time"]

MAX_SWEEP_SEEDS = 16


def _api() -> Any:
    import rlhf_lab.api as api

    return api


class Resolved(NamedTuple):
    """A request's recipe resolved (and shrunk, calibrated) into the trainer's config."""

    family: str
    algorithm: str
    config: TrainerConfig
    applied: list[str]  # the overrides applied, as written (the shrink's own included)
    source: str
    calibration: Any  # rlhf_lab.planning.calibration's result, or None


def _resolve(request: RunRequest) -> Resolved:
    """The request's recipe, shrunk (and calibrated: rlhf_lab.planning.calibration) or not; an
    unknown recipe points at the recipe list, a bad override at shrink_config."""
    from rlhf_lab.api.recipes import find_known_recipe
    from rlhf_lab.planning.calibration_apply import default_policy, shrink_calibrated
    from rlhf_lab.planning.configs import resolve_config
    from rlhf_lab.planning.shrink import shrink_config as shrink_rules

    find_known_recipe(request.recipe)
    overrides = request.override_pairs()
    try:
        if request.shrink or request.model:
            policy = None if request.calibrate else default_policy(False)  # None: the current
            shrunk, cal = shrink_calibrated(
                shrink_rules, request.recipe, overrides, request.model, policy
            )
            source = shrunk.recipe.config_path
            config = shrunk.trainer_config
            return Resolved(shrunk.family, shrunk.algorithm, config, shrunk.overrides, source, cal)
        resolved = resolve_config(request.recipe, overrides)
        source = resolved.recipe.config_path
        applied = request.override_texts()
        config = resolved.config
        return Resolved(resolved.family, resolved.algorithm, config, applied, source, None)
    except LabError as err:
        raise err.with_next(FIX_OVERRIDES) from None


def with_predicted_time(run: NewRun) -> NewRun:
    """``run`` with its wall-time prediction from the cached throughput calibration (kept in
    run.json; none when nothing is cached)."""
    from rlhf_lab.planning.time import launch_prediction

    device = str(run.device or "cpu")
    predicted = launch_prediction(run.family, run.algorithm, run.config, device)
    return run.model_copy(update={"predicted_time": predicted})


def _keep_calibration(run_dir: str, calibration: Any) -> list[str]:
    """Write the run's calibration into its folder (before its ledger row); its warnings."""
    if calibration is None:
        return []
    from rlhf_lab.planning.calibration_apply import write_calibration

    write_calibration(run_dir, calibration)
    return list(calibration.warnings)


def start_or_queue(run: NewRun, **how: Any) -> LaunchResult:
    """Hand a new run to the runs layer the supervisor's way
    (:func:`rlhf_lab.runs.launcher.start_or_queue` unless replaced)."""
    import rlhf_lab.runs.launcher as runs_launch
    from rlhf_lab.runs.supervisor import supervisor

    return (supervisor().start_or_queue or runs_launch.start_or_queue)(run, **how)


def record_now(run_id: str) -> list[str]:
    """The run's row in its campaign ledger, written at launch (queued or started); a ledger
    failure never undoes a launch: it becomes a warning."""
    from rlhf_lab.ledger import record_run

    try:
        record_run(run_id, plot=False)
    except Exception as err:  # noqa: BLE001 - the run is launched; say what was not written
        return [f"the ledger row of {run_id} was not written ({type(err).__name__}: {err})"]
    return []


def record_when_ended(run_id: str) -> list[str]:
    """Start the recorder that writes the run's final row when it ends (what the queue worker
    does for the runs it starts)."""
    from rlhf_lab.runs.queue import record_when_ended as recorder
    from rlhf_lab.runs.supervisor import supervisor

    try:
        (supervisor().record_when_ended or recorder)(run_id)
    except Exception as err:  # noqa: BLE001
        return [f"{run_id} will not be recorded when it ends ({err}): call record_results then"]
    return []


def _open_campaign(request: RunRequest, resolved: Resolved, slug: str, *, full: bool) -> None:
    """Create the run's campaign ledger (kept when it exists); ``full``: with the dataset and
    seed of a local run."""
    from rlhf_lab.ledger import create_campaign

    config = resolved.config
    model = config.get("model.name")
    extra: dict[str, Any] = {}
    if full:
        dataset = config.get("data.dataset")
        seed = config.get("seed")
        extra["dataset"] = dataset if isinstance(dataset, str) else None
        extra["seeds"] = [seed] if isinstance(seed, int) else None
    question = request.question or f"Does {resolved.algorithm} pass a short sanity run?"
    create_campaign(slug, question, family=resolved.family, model=model, **extra)


# ------------------------------------------------------------------------------------- Slurm


def _check_slurm_request(request: RunRequest) -> None:
    """Refuse what only applies to this machine in a Slurm launch (one clear error each)."""
    from rlhf_lab.runs.slurm import refuse_local_only

    if request.gpus is not None:
        raise InvalidArgument(
            "gpus names this machine's GPUs; a Slurm job asks for gpus_per_node in slurm"
        )
    if request.device not in ("auto", None):
        raise refuse_local_only(f"device {request.device}")
    if request.queue:
        raise refuse_local_only("queue")


def _submit_to_slurm(request: RunRequest, resolved: Resolved, slug: str) -> LaunchResult:
    """Submit a checked run as a Slurm job: every check (config, world size, Slurm present)
    comes before the campaign or run folder is written."""
    from rlhf_lab.api.placement import slurm_options
    from rlhf_lab.planning.validation import check_config
    from rlhf_lab.runs.launcher import NewRun
    from rlhf_lab.runs.slurm import check_slurm_available, refuse_local_only
    from rlhf_lab.runs.slurm_runs import submit_slurm_run
    from rlhf_lab.runs.world import check_world_size

    assert request.slurm is not None
    options = slurm_options(request.slurm)
    if request.after:
        raise refuse_local_only("waiting for other runs (after)")
    check_world_size(resolved.family, resolved.config, options.world_size)
    warnings = list(check_config(resolved.family, resolved.config, launching=True).warnings)
    check_slurm_available()
    _open_campaign(request, resolved, slug, full=False)
    run = NewRun(
        family=resolved.family,
        algorithm=resolved.algorithm,
        config=resolved.config,
        campaign=slug,
        source=resolved.source,
        overrides=resolved.applied,
    )
    result = submit_slurm_run(run, options)
    warnings += _keep_calibration(result.run.run_dir, resolved.calibration)
    warnings += record_now(result.run.id)
    warnings += record_when_ended(result.run.id)
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]})


# -------------------------------------------------------------------------------- this machine


class _Checked(NamedTuple):
    """What the checks before a local launch found: the run to create and how to start it."""

    run: NewRun
    fits_together: bool | None
    warnings: list[str]
    forced: list[str]  # queued upstream runs that must now save their final model


def _states(run_ids: list[str]) -> list[str]:
    from rlhf_lab.runs import run_state

    return [run_state(r).state for r in run_ids]


def _config_warnings(resolved: Resolved, device: str) -> list[str]:
    """The config's launch checks (models, lengths, learning rate) and a GPU that is not here."""
    from rlhf_lab.planning.validation import check_config

    try:
        warnings = list(check_config(resolved.family, resolved.config, launching=True).warnings)
    except LabError as err:
        raise err.with_next(FIX_OVERRIDES) from None
    _api()._check_gpu_present(device, resolved.config)
    return warnings


def _memory_fit(
    resolved: Resolved, placement: Placement, device: str, *, queue: bool
) -> tuple[bool | None, list[str]]:
    """(``fits_together``, warnings) of the memory and busy-device rule on the run's devices."""
    from rlhf_lab.api.placement import check_placement

    family, algorithm, config = resolved.family, resolved.algorithm, resolved.config
    if placement.distributed or not placement.devices:
        return check_placement(
            family, algorithm, config, placement, queue=queue, busy_error=_api().device_busy_error
        )
    # refused before the campaign is written; start_or_queue re-checks the device
    return _api()._check_memory(family, algorithm, config, device, queue=queue)


def _check_local(
    request: RunRequest, resolved: Resolved, upstream: list[str], slug: str
) -> _Checked:
    """Every check of a launch on this machine, before anything is written: devices and world
    size, the config, identical runs, upstream runs, and (unless forced) the memory fit."""
    from rlhf_lab.api.placement import pick_devices
    from rlhf_lab.runs import resolve_device, resolve_placement
    from rlhf_lab.runs.deps import check_after, ensure_final_model
    from rlhf_lab.runs.identical import check_not_identical
    from rlhf_lab.runs.launcher import NewRun
    from rlhf_lab.runs.lineage import find_refs, resolve_refs
    from rlhf_lab.runs.world import check_world_size

    config = resolved.config
    # a bad device, GPU id or world size is refused before the campaign exists
    placement = resolve_placement(request.device, request.gpus, request.nproc, config)
    check_world_size(resolved.family, config, placement.nproc)
    dev = placement.device if placement.devices else resolve_device(request.device, config)
    warnings = _config_warnings(resolved, dev)
    refs = find_refs(config)  # checked by check_config; each one is also an upstream run
    run_config = resolve_refs(config, refs)  # each run:<id> as that run's final_model path
    check_not_identical(resolved.family, run_config, force=request.force)  # same config and seed
    upstream = check_after([*upstream, *refs.values()])
    forced = [r for r in dict.fromkeys(refs.values()) if ensure_final_model(r, write=False)]
    waits = bool(upstream) and any(s != "succeeded" for s in _states(upstream))
    if not (request.queue or waits):  # the freest GPU(s) no run holds, picked now
        placement = pick_devices(placement)
        dev = placement.device if placement.devices else dev
    fits_together = None
    if not request.force:
        queue = request.queue or waits
        fits_together, memory_warnings = _memory_fit(resolved, placement, dev, queue=queue)
        warnings += memory_warnings
    run = NewRun(
        family=resolved.family,
        algorithm=resolved.algorithm,
        config=run_config,
        campaign=slug,
        source=resolved.source,
        overrides=resolved.applied,
        device=dev,
        placement=placement,
        after=upstream,
        references=refs,
        pipeline=request.pipeline,
        stage=request.stage,
    )
    return _Checked(run, fits_together, warnings, forced)


def _save_final_models(run_ids: list[str]) -> list[str]:
    """Make queued upstream runs save their final model (a dependent takes it); the warnings."""
    from rlhf_lab.runs.deps import ensure_final_model

    warnings = []
    for run_id in run_ids:
        ensure_final_model(run_id, write=True)
        warnings.append(
            f"upstream run {run_id} will save its final model (checkpoint.save_final_model=true)"
        )
    return warnings


@operation
def launch(request: RunRequest) -> LaunchResult:
    """Resolve (and optionally shrink) the request's recipe, check it, make sure its campaign
    exists, and start the trainer in the background (or queue it). Returns at once with the run
    id.

    A shrunk run that learns from its own samples is calibrated first unless
    ``request.calibrate`` is False (:mod:`rlhf_lab.planning.calibration`: the task and
    generation limit from a probe of the base model, cached; your overrides win); the run folder
    keeps it (calibration.json).

    ``gpus`` (ids ``"0,1"`` or a count ``4``) or ``nproc`` (CPU ranks) run the trainer under
    torchrun, one rank per device; the run holds each device, the memory estimate is per rank
    and checked on each device, and the world size must split the config's batches. ``slurm``
    (:class:`rlhf_lab.runs.slurm.SlurmOptions` as a mapping: nodes, gpus_per_node, partition,
    time, account ...) submits the run as a Slurm job instead (:mod:`rlhf_lab.runs.slurm`).

    ``after``: run ids this run waits for: it stays queued until each has succeeded and is
    cancelled if one ends otherwise. A ``run:<id>`` value (``model.name=run:<sft>``,
    ``reward.model=run:<rm>``, ``scorer.name=run:<rm>``) names that run's final model, is checked
    like a model (:mod:`rlhf_lab.runs.lineage`), implies ``after`` it, and reaches config.yaml as
    the run's ``final_model`` path (run.json keeps the id); a queued upstream that would not save
    its final model is made to. An upstream that already failed is refused (resume it first).
    ``pipeline`` / ``stage``: set by :func:`run_pipeline` for the runs it creates.

    Every check comes before anything is written (campaign, run folder, queue entry, ledger
    row): the config validates; every model it names resolves and, for a hub id, can be loaded
    here; no length exceeds the model's context
    (:func:`rlhf_lab.planning.validation.check_config`); the device exists; and the memory
    estimate fits (``_check_memory`` of :mod:`rlhf_lab.api`: the free memory of an idle device,
    beside the runs of a busy one, the total memory for a queued run) unless ``force``. An
    implausible learning rate is a warning in the result. The launched run gets its ledger row
    at once and again when it ends (queued runs by the queue worker, others by a recorder
    process)."""
    from rlhf_lab.paths import campaign_name
    from rlhf_lab.runs.deps import check_after

    upstream = check_after(request.after)  # unknown or failed upstream runs: refused first
    resolved = _resolve(request)
    # campaign="" is a bad slug, not "use the default" (it would launch into another campaign)
    default = f"{resolved.algorithm.replace('_', '-')}-sanity"
    slug = request.campaign if request.campaign is not None else default
    campaign_name(slug)  # validates the slug before anything is written
    if request.slurm is not None:  # a cluster job: Slurm queues and places it
        _check_slurm_request(request)
        return _submit_to_slurm(request, resolved, slug)
    checked = _check_local(request, resolved, upstream, slug)
    _open_campaign(request, resolved, slug, full=True)
    warnings = checked.warnings + _save_final_models(checked.forced)
    run = with_predicted_time(checked.run)
    result = start_or_queue(
        run, force=request.force, queue=request.queue, fits_together=checked.fits_together
    )
    warnings += _keep_calibration(result.run.run_dir, resolved.calibration)
    warnings += record_now(result.run.id)
    if not result.queued:
        warnings += record_when_ended(result.run.id)
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]})


# ----------------------------------------------------------------------------- resume, sweep


@operation
def resume_run(run_id: str, device: str | None = None, force: bool = False) -> LaunchResult:
    """:func:`rlhf_lab.runs.resume_run`, recorded like a launch: the run's ledger row is
    refreshed when the resumed attempt ends (a recorder process)."""
    from rlhf_lab.runs import resume_run as resume
    from rlhf_lab.runs.slurm_runs import resume_if_slurm

    result = resume_if_slurm(run_id) or resume(run_id, device=device, force=force)
    warnings = [] if result.queued else record_when_ended(result.run.id)
    for rearmed in [*result.rearmed, *([run_id] if result.queued else [])]:
        warnings += record_now(rearmed)  # the ledger shows them queued again
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]})


def _sweep_base_seed(recipe: str, seeds: list[Override], base_seed: int | None) -> int:
    """The first seed of a sweep: ``base_seed``, else a ``seed=`` override, else the first
    recipe's configured seed (0 when it has none)."""
    if base_seed is not None:
        return base_seed
    from rlhf_lab.planning.configs import resolve_config

    try:
        config = resolve_config(recipe, seeds).config
    except LabError as err:
        raise err.with_next(NextStep("list_recipes")) from None
    seed = config.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


def _check_sweep(request: SweepRequest) -> None:
    if not request.recipes:
        raise InvalidArgument(
            "a sweep needs at least one recipe, e.g. dpo,ipo,simpo", next=NextStep("list_recipes")
        )
    seeds, base_seed = request.seeds, request.base_seed
    if isinstance(seeds, bool) or not 1 <= seeds <= MAX_SWEEP_SEEDS:
        raise InvalidArgument(
            f"seeds must be between 1 and {MAX_SWEEP_SEEDS} (runs per recipe), got {seeds!r}"
        )
    if base_seed is not None and (isinstance(base_seed, bool) or base_seed < 0):
        raise InvalidArgument(f"base_seed must be a non-negative integer, got {base_seed!r}")


@operation
def sweep(request: SweepRequest) -> SweepResult:
    """Queue matched runs (same overrides, same shrink) of several recipes in one campaign; the
    queue runs them one after another. ``request.seeds``: K runs per recipe with the seeds base,
    base+1, ... (``base_seed``, else a ``seed=`` override, else the first recipe's configured
    seed); every arm gets the same seed list, whatever seed its recipe ships (reward-model
    recipes differ). Runs are queued seed by seed, so matched pairs finish together."""
    from rlhf_lab.api.recipes import find_known_recipe
    from rlhf_lab.api.results import SweepResult
    from rlhf_lab.paths import campaign_name
    from rlhf_lab.planning.plan import matched_overrides

    _check_sweep(request)
    recipes, model = request.recipes, request.model
    names = [find_known_recipe(r).algorithm for r in recipes]
    default = "-vs-".join(n.replace("_", "-") for n in names)[:60].strip("-")
    slug = request.campaign if request.campaign is not None else default
    campaign_name(slug)  # a bad slug is refused before anything is queued
    given = [o for o in request.overrides if o.key == "seed"]
    first = _sweep_base_seed(recipes[0], given, request.base_seed)
    seed_list = [first + i for i in range(request.seeds)]
    rest = [o for o in request.overrides if o.key != "seed"]
    seeds_text = f"seed {first}" if len(seed_list) == 1 else f"seeds {first}-{seed_list[-1]}"
    question = f"How do {', '.join(names)} compare with matched settings ({seeds_text})?"
    # policy-gradient arms get one rollout shape and the same prompts (the plan's rule)
    matched = matched_overrides(recipes, model, rest)
    launches = [
        launch(
            RunRequest(
                recipe=r,
                overrides=[*matched[r], *rest],
                seed=seed,
                shrink=request.shrink,
                model=model,
                campaign=slug,
                question=question,
                device=request.device,
                queue=True,
            )
        )
        for seed in seed_list
        for r in recipes
    ]
    return SweepResult(campaign=campaign_name(slug), launches=launches, seeds=seed_list)


__all__ += ["Override", "RunRequest", "record_now", "record_when_ended"]
