"""The lab's one entry point: every operation the CLI or the MCP server offers is one typed
function here: typed arguments validated by pydantic (:func:`~rlhf_lab.api._operation.operation`:
a malformed argument is an ``InvalidArgument``) in, a pydantic model or a list of them out. Both
surfaces are adapters over this package; they import nothing else of the lab but
:mod:`rlhf_lab.errors` (tests/lab/test_api_layer.py, tests/lab/test_import_contract.py).
Torch-free.

Names are loaded lazily (PEP 562 ``__getattr__``): ``import rlhf_lab.api`` costs almost nothing,
and ``api.list_runs`` imports only the run modules, so a CLI reading command starts fast. What
lives where:

- launching (this module, whose private hooks tests replace): :func:`launch_experiment`
  (LaunchResult), :func:`launch_run` (the same shaped for an agent), :func:`sweep`,
  :func:`resume_run` and :func:`resume_run_detached`; their result models in
  :mod:`rlhf_lab.api.results`; the checks before a launch in :mod:`rlhf_lab.planning.validation`;
- :mod:`rlhf_lab.api.recipes`: ``list_recipes``, ``estimate_memory`` (the fit check),
  ``device_free_gb``, ``acceptance_text``;
- :mod:`rlhf_lab.api.watching`: ``run_status`` (alerts + advice), ``active_run_views``,
  ``run_list``, ``tail_logs``, ``follow_log``, ``get_metrics``, ``wait_and_stream``;
- :mod:`rlhf_lab.api.records`: ``record_results``, ``list_campaigns``, ledger markdown;
- :mod:`rlhf_lab.api.evaluations`: ``evaluate_model`` (evaluation jobs, launched like runs);
- :mod:`rlhf_lab.api.pipelines`: ``run_pipeline`` (a chain of runs in one campaign) and
  ``list_pipelines``;
- re-exported as they are: plan/shrink/config, runs, logs, ledger, compare, resources, models,
  skills and the demo.

Expected failures are :class:`~rlhf_lab.errors.LabError` subclasses carrying a kind and next
steps named by the functions of this package (``NextStep("launch_run", {"queue": True})``).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from rlhf_lab import __version__
from rlhf_lab.api._operation import argument_errors_text as argument_errors_text
from rlhf_lab.api._operation import describe_schema as describe_schema
from rlhf_lab.api._operation import operation
from rlhf_lab.errors import Conflict, InvalidArgument, LabError, NextStep, Unavailable

LAB_VERSION: str = __version__

if TYPE_CHECKING:  # pragma: no cover - for readers and type checkers only
    from rlhf_lab.api.results import LaunchRunResult, SweepResult
    from rlhf_lab.runs import LaunchResult, RunStatus

# name -> module it is loaded from on first use
_LAZY: dict[str, str] = {
    # recipes, plans, configs, memory
    "Recipe": "rlhf_lab.planning.catalog",
    "find_recipe": "rlhf_lab.planning.catalog",
    "ResolvedConfig": "rlhf_lab.planning.configs",
    "resolve_config": "rlhf_lab.planning.configs",
    "Plan": "rlhf_lab.planning.plan",
    "plan_experiment": "rlhf_lab.planning.plan",
    "ShrinkResult": "rlhf_lab.planning.shrink",
    "shrink_config": "rlhf_lab.api.recipes",
    "MemoryEstimate": "rlhf_lab.planning.memory",
    "FamilyBrief": "rlhf_lab.api.recipes",
    "RecipeList": "rlhf_lab.api.recipes",
    "MemoryCheck": "rlhf_lab.api.recipes",
    "list_recipes": "rlhf_lab.api.recipes",
    "estimate_memory": "rlhf_lab.api.recipes",
    "device_free_gb": "rlhf_lab.api.recipes",
    "slurm_job_preview": "rlhf_lab.api.placement",
    "acceptance_text": "rlhf_lab.api.recipes",
    "find_known_recipe": "rlhf_lab.api.recipes",
    # runs
    "RunInfo": "rlhf_lab.runs",
    "RunStatus": "rlhf_lab.runs",
    "StopResult": "rlhf_lab.runs",
    "LaunchResult": "rlhf_lab.runs",
    "active_runs": "rlhf_lab.runs",
    "list_runs": "rlhf_lab.runs",
    "run_state": "rlhf_lab.runs",
    "stop_run": "rlhf_lab.runs",
    "unfinished_runs": "rlhf_lab.runs",
    "wait_for_end": "rlhf_lab.runs",
    # watching
    "Alert": "rlhf_lab.results.diagnosis",
    "LogChunk": "rlhf_lab.results.diagnosis",
    "MetricSeries": "rlhf_lab.results.diagnosis",
    "diagnose": "rlhf_lab.results.diagnosis",
    "read_metrics": "rlhf_lab.results.diagnosis",
    "tail_log": "rlhf_lab.results.diagnosis",
    "RunView": "rlhf_lab.api.watching",
    "RunStatusResult": "rlhf_lab.api.watching",
    "LogTail": "rlhf_lab.api.watching",
    "MetricsResult": "rlhf_lab.api.watching",
    "RunList": "rlhf_lab.api.watching",
    "RunRow": "rlhf_lab.api.watching",
    "advice_for": "rlhf_lab.api.watching",
    "run_status": "rlhf_lab.api.watching",
    "active_run_views": "rlhf_lab.api.watching",
    "run_list": "rlhf_lab.api.watching",
    "tail_logs": "rlhf_lab.api.watching",
    "follow_log": "rlhf_lab.api.watching",
    "get_metrics": "rlhf_lab.api.watching",
    "wait_and_stream": "rlhf_lab.api.watching",
    # ledger and comparisons
    "Campaign": "rlhf_lab.ledger",
    "CampaignView": "rlhf_lab.ledger",
    "RunRecord": "rlhf_lab.ledger",
    "create_campaign": "rlhf_lab.ledger",
    "record_run": "rlhf_lab.ledger",
    "show_campaign": "rlhf_lab.ledger",
    "RecordResult": "rlhf_lab.api.records",
    "RecordSummary": "rlhf_lab.api.records",
    "CampaignList": "rlhf_lab.api.records",
    "record_results": "rlhf_lab.api.records",
    "list_campaigns": "rlhf_lab.api.records",
    "ledger_index_markdown": "rlhf_lab.api.records",
    "campaign_markdown": "rlhf_lab.api.records",
    "Comparison": "rlhf_lab.results.compare",
    "compare_runs": "rlhf_lab.api.records",
    # the machine, models, skills, demo, paths
    "Resources": "rlhf_lab.runs.resources",
    "check_resources": "rlhf_lab.runs.resources",
    "ModelEntry": "rlhf_lab.planning.models",
    "list_models": "rlhf_lab.planning.models",
    "pull_model": "rlhf_lab.planning.models",
    "SkillsInstallResult": "rlhf_lab.skills",
    "install_skills": "rlhf_lab.skills",
    "run_demo": "rlhf_lab.demo",
    "experiments_dir": "rlhf_lab.paths",
    "campaign_name": "rlhf_lab.paths",
    "LaunchRunResult": "rlhf_lab.api.results",
    "SweepResult": "rlhf_lab.api.results",
    "launch_run_result": "rlhf_lab.api.results",
    "StopRunResult": "rlhf_lab.api.results",
    "stop_run_result": "rlhf_lab.api.results",
    # evaluations
    "EvaluationLaunch": "rlhf_lab.api.evaluations",
    "evaluate_model": "rlhf_lab.api.evaluations",
    # the run index
    "QueryResult": "rlhf_lab.api.queries",
    "QueryRow": "rlhf_lab.api.queries",
    "IndexRebuild": "rlhf_lab.api.queries",
    "query_runs": "rlhf_lab.api.queries",
    "rebuild_run_index": "rlhf_lab.api.queries",
    # pipelines
    "PipelineResult": "rlhf_lab.api.pipelines",
    "PipelineList": "rlhf_lab.api.pipelines",
    "run_pipeline": "rlhf_lab.api.pipelines",
    "list_pipelines": "rlhf_lab.api.pipelines",
}


# re-exported functions a surface calls: their arguments are validated like this module's own
_SURFACE_OPERATIONS = frozenset(
    {
        "plan_experiment",
        "stop_run",
        "list_runs",
        "record_run",
        "create_campaign",
        "show_campaign",
        "check_resources",
        "list_models",
        "pull_model",
        "run_demo",
        "install_skills",
        "tail_log",
        "read_metrics",
    }
)


def __getattr__(name: str) -> Any:
    """Load a re-exported name from its module on first use (and keep it here); a function a
    surface calls gets its arguments validated (:func:`~rlhf_lab.api._operation.operation`)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rlhf_lab.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if name in _SURFACE_OPERATIONS and not getattr(value, "__lab_operation__", False):
        value = operation(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(
    [
        *_LAZY,
        "Conflict",
        "InvalidArgument",
        "LAB_VERSION",
        "LabError",
        "NextStep",
        "Unavailable",
        "argument_errors_text",
        "describe_schema",
        "device_busy_error",
        "launch_experiment",
        "launch_run",
        "resume_run",
        "resume_run_detached",
        "sweep",
        "visible_gpu_count",
    ]
)


# ------------------------------------------------------------------------------ device checks


def visible_gpu_count() -> int:
    """How many GPUs this process may use (CUDA_VISIBLE_DEVICES respected; 0 without NVML)."""
    from rlhf_lab.runs import _visible_gpu_count as count

    return count()


_visible_gpu_count = visible_gpu_count  # the hook launch checks use (tests replace it)


def _device_free_gb(device: str) -> float | None:
    """Memory free now on ``device`` (the hook launch checks use; tests replace it)."""
    from rlhf_lab.api.recipes import device_free_gb

    return device_free_gb(device)


def _device_total_gb(device: str) -> float | None:
    """All the memory of ``device`` (the hook the queued-launch check uses; tests replace it)."""
    from rlhf_lab.api.recipes import device_total_gb

    return device_total_gb(device)


def _device_memory():
    """The memory hooks as they are now (tests replace ``_device_free_gb``/``_total_gb``)."""
    from rlhf_lab.api.placement import DeviceMemory

    return DeviceMemory(_device_free_gb, _device_total_gb, device_busy_error)


def _where(device: str) -> str:
    return "RAM" if device == "cpu" else f"memory of {device}"


def _estimate_gb(family: str, algorithm: str, data: dict, device: str) -> tuple[float | None, str]:
    """(peak GiB of this run on ``device`` or None, why there is none)."""
    from rlhf_lab.planning.memory import estimate_memory as estimate_config_memory

    try:
        kind = "cpu" if device == "cpu" else "cuda"
        return estimate_config_memory(family, algorithm, data, device=kind).total_gb, ""
    except LabError as err:
        return None, f"no memory estimate ({err.message})"


def _memory_refusal(device: str, estimate: float, free: float) -> Conflict:
    """The refusal of a run whose estimate does not fit the device's free memory."""
    return Conflict(
        f"the memory estimate of this run (~{estimate:.2f} GiB) does not fit the free "
        f"{_where(device)} ({free:.2f} GiB free on {device}, 10% margin kept); it would likely "
        "run out of memory",
        next=[
            NextStep(
                "shrink_config",
                note="lower train.batch_size or data.max_length, model.gradient_checkpointing="
                "true, or a smaller model (model='tiny')",
            ),
            NextStep("launch_run", {"force": True}, note="start anyway, at the risk of an OOM"),
        ],
    )


def _check_memory(
    family: str, algorithm: str, data: dict, device: str, *, queue: bool
) -> tuple[bool | None, list[str]]:
    """The launch's memory and busy-device rule, the same for the CPU (RAM) and a GPU; returns
    (``fits_together`` for :func:`rlhf_lab.runs.launcher`, warnings).

    - queued: refused only when the estimate exceeds the device's *total* memory (it could never
      start); it waits for the device anyway;
    - the device is idle: refused when the estimate does not fit its free memory now;
    - a run already trains on it: started beside it when the estimate fits the free memory now
      (CPU runs then split the cores), refused otherwise (and when there is no estimate).
    ``force`` skips all of it (the caller does not call this)."""
    from rlhf_lab.planning.memory import fits
    from rlhf_lab.runs import active_runs

    estimate, why = _estimate_gb(family, algorithm, data, device)
    warnings = [f"{why}: the memory fit was not checked"] if estimate is None else []
    if queue:
        total = _device_total_gb(device) if estimate is not None else None
        if estimate is not None and total is not None and not fits(estimate, total):
            raise Conflict(
                f"the memory estimate of this run (~{estimate:.2f} GiB) exceeds all the "
                f"{_where(device)} ({total:.2f} GiB on {device}): queued, it could never start",
                next=_memory_refusal(device, estimate, total).next_steps,
            )
        return None, warnings
    busy = active_runs(device)
    free = _device_free_gb(device) if estimate is not None or busy else None
    ok = None if estimate is None or free is None else fits(estimate, free)
    if busy:
        if ok:
            return True, warnings
        raise device_busy_error(device, busy, ok, estimate_gb=estimate, free_gb=free)
    if ok is False:
        assert estimate is not None and free is not None
        raise _memory_refusal(device, estimate, free)
    return None, warnings


def _check_gpu_present(device: str, data: dict) -> None:
    """Refuse a GPU run on a machine that shows no such GPU before anything is written: the
    trainer would otherwise fail after start-up (model.device=cuda) or quietly train on the CPU
    under a cuda label (--device cuda with model.device=auto)."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    if not (device.startswith("cuda") or model.get("device") == "cuda"):
        return
    index = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    count = _visible_gpu_count()
    if index < count:
        return
    asked = device if device.startswith("cuda") else "model.device=cuda"
    raise Unavailable(
        f"{asked} was asked for but this machine shows {count} GPU(s) (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); train on the CPU with "
        "model.device=auto (or cpu), or on a machine with a GPU",
        next=[
            NextStep("launch_run", {"device": "cpu"}, note="with model.device=auto or cpu"),
            NextStep("check_resources", note="lists the GPUs this machine shows"),
        ],
    )


def _describe_run(status: RunStatus) -> str:
    """``<id> (pid P, step s/t, ETA e, campaign c)``: enough to recognise a run holding a device."""
    step = "?" if status.step is None else status.step
    total = "?" if status.total_steps is None else status.total_steps
    eta = "" if status.eta_s is None else f", ETA {status.eta_s:.0f}s"
    return f"{status.id} (pid {status.pid}, step {step}/{total}{eta}, campaign {status.campaign})"


def device_busy_error(
    device: str,
    busy: list[RunStatus],
    fits_together: bool | None,
    *,
    estimate_gb: float | None = None,
    free_gb: float | None = None,
) -> Conflict:
    """The typed refusal of a second job on a device: names the run holding it, the estimate and
    the free memory, and the ways on (wait for it, queue behind it, or force)."""
    if fits_together is False:
        why = "the memory check said both do not fit"
    else:
        why = "no memory check said both fit"
    if estimate_gb is not None and free_gb is not None:
        why += f": ~{estimate_gb:.2f} GiB needed, {free_gb:.2f} GiB {_where(device)} free"
    more = f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""
    steps = [
        NextStep("run_status", {"run_id": busy[0].id}, note="wait until it ends"),
        NextStep("launch_run", {"queue": True}, note="starts after it ends"),
        NextStep("launch_run", {"force": True}, note="only when both runs fit in memory"),
    ]
    return Conflict(
        f"device {device} is busy: run {_describe_run(busy[0])} is training on it{more}; a "
        f"second job starts beside it only when its memory estimate fits ({why})",
        next=steps,
    )


# ---------------------------------------------------------------------------------- launching


def _launch(*args: Any, **kwargs: Any) -> LaunchResult:
    """runs.launch (the hook the launch path calls; tests wrap it), with the run's predicted
    wall time from the cached throughput calibration (``family, algorithm, config`` first)."""
    from rlhf_lab.planning.time import launch_prediction
    from rlhf_lab.runs import launch

    if len(args) >= 3 and "predicted_time" not in kwargs:
        device = str(kwargs.get("device") or "cpu")
        kwargs["predicted_time"] = launch_prediction(args[0], args[1], args[2], device)
    return launch(*args, **kwargs)


def _resolve_recipe(
    recipe: str, overrides: list[str], shrink: bool, model: str | None, calibrate: bool = True
) -> tuple[str, str, dict, list[str], str, Any]:
    """(family, algorithm, config, applied overrides, config source, calibration or None) of a
    recipe, shrunk (and calibrated: rlhf_lab.planning.calibration) or not; an unknown recipe
    points at the recipe list, a bad override at shrink_config."""
    from rlhf_lab.api.recipes import FIX_OVERRIDES, find_known_recipe
    from rlhf_lab.planning.calibration_apply import default_policy, shrink_calibrated
    from rlhf_lab.planning.configs import resolve_config
    from rlhf_lab.planning.shrink import shrink_config as shrink_rules

    find_known_recipe(recipe)
    try:
        if shrink or model:
            policy = None if calibrate else default_policy(False)  # None: the current one
            shrunk, cal = shrink_calibrated(shrink_rules, recipe, overrides, model, policy)
            return (
                shrunk.family,
                shrunk.algorithm,
                shrunk.config,
                shrunk.overrides,
                shrunk.recipe.config_path,
                cal,
            )
        resolved = resolve_config(recipe, overrides)
        return (
            resolved.family,
            resolved.algorithm,
            resolved.data,
            overrides,
            resolved.recipe.config_path,
            None,
        )
    except LabError as err:
        raise err.with_next(FIX_OVERRIDES) from None


def _keep_calibration(run_dir: str, calibration: Any) -> list[str]:
    """Write the run's calibration into its folder (before its ledger row); its warnings."""
    if calibration is None:
        return []
    from rlhf_lab.planning.calibration_apply import write_calibration

    write_calibration(run_dir, calibration)
    return list(calibration.warnings)


def _record_now(run_id: str) -> list[str]:
    """The run's row in its campaign ledger, written at launch (queued or started); a ledger
    failure never undoes a launch: it becomes a warning."""
    from rlhf_lab.ledger import record_run

    try:
        record_run(run_id, plot=False)
    except Exception as err:  # noqa: BLE001 - the run is launched; say what was not written
        return [f"the ledger row of {run_id} was not written ({type(err).__name__}: {err})"]
    return []


def _record_when_ended(run_id: str) -> list[str]:
    """Start the recorder that writes the run's final row when it ends (what the queue worker
    does for the runs it starts)."""
    from rlhf_lab.runs import record_when_ended

    try:
        record_when_ended(run_id)
    except Exception as err:  # noqa: BLE001
        return [f"{run_id} will not be recorded when it ends ({err}): call record_results then"]
    return []


@operation
def launch_experiment(
    recipe: str,
    overrides: list[str] | None = None,
    *,
    shrink: bool = False,
    model: str | None = None,
    campaign: str | None = None,
    question: str | None = None,
    device: str = "auto",
    force: bool = False,
    queue: bool = False,
    after: list[str] | None = None,
    pipeline: str | None = None,
    stage: str | None = None,
    gpus: str | int | None = None,
    nproc: int | None = None,
    slurm: dict[str, Any] | None = None,
    calibrate: bool = True,
) -> LaunchResult:
    """Resolve (and optionally shrink) a recipe, check it, make sure its campaign exists, and
    start the trainer in the background (or queue it). Returns at once with the run id.

    A shrunk run that learns from its own samples is calibrated first unless ``calibrate`` is
    False (:mod:`rlhf_lab.planning.calibration`: the task and generation limit from a probe of
    the base model, cached; your overrides win); the run folder keeps it (calibration.json).

    ``gpus`` (ids ``"0,1"`` or a count ``4``) or ``nproc`` (CPU ranks) run the trainer under
    torchrun, one rank per device; the run holds each device, the memory estimate is per rank
    and checked on each device, and the world size must split the config's batches.
    ``slurm`` (:class:`rlhf_lab.runs.slurm.SlurmOptions` as a mapping: nodes, gpus_per_node,
    partition, time, account ...) submits the run as a Slurm job instead (:mod:`rlhf_lab.runs.slurm`).

    ``after``: run ids this run waits for: it stays queued until each has succeeded and is
    cancelled if one ends otherwise. A ``run:<id>`` value (``model.name=run:<sft>``,
    ``reward.model=run:<rm>``, ``scorer.name=run:<rm>``) names that run's final model, is checked
    like a model (:mod:`rlhf_lab.runs.lineage`), implies ``after`` it, and reaches config.yaml as the
    run's ``final_model`` path (run.json keeps the id); a queued upstream that would not save its
    final model is made to. An upstream that already failed is refused (resume it first).
    ``pipeline`` / ``stage``: set by :func:`run_pipeline` for the runs it creates.

    Every check comes before anything is written (campaign, run folder, queue entry, ledger
    row): the config validates; every model it names resolves and, for a hub id, can be loaded
    here; no length exceeds the model's context (:func:`rlhf_lab.planning.validation.check_config`); the
    device exists; and the memory estimate fits (:func:`_check_memory`: the free memory of an
    idle device, beside the runs of a busy one, the total memory for a queued run) unless
    ``force``. An implausible learning rate is a warning in the result. The launched run gets
    its ledger row at once and again when it ends (queued runs by the queue worker, others by
    a recorder process)."""
    from rlhf_lab.api.placement import check_placement, pick_devices
    from rlhf_lab.api.recipes import FIX_OVERRIDES
    from rlhf_lab.ledger import create_campaign
    from rlhf_lab.paths import campaign_name
    from rlhf_lab.planning.validation import check_config
    from rlhf_lab.runs import resolve_device, resolve_placement
    from rlhf_lab.runs.deps import check_after, ensure_final_model
    from rlhf_lab.runs.identical import check_not_identical
    from rlhf_lab.runs.lineage import find_refs, resolve_refs
    from rlhf_lab.runs.world import check_world_size

    upstream = check_after(after)  # unknown or failed upstream runs: refused first
    family, algorithm, data, applied, source, calibration = _resolve_recipe(
        recipe, list(overrides or []), shrink, model, calibrate
    )
    # campaign="" is a bad slug, not "use the default" (it would launch into another campaign)
    slug = campaign if campaign is not None else f"{algorithm.replace('_', '-')}-sanity"
    campaign_name(slug)  # validates the slug before anything is written
    if slurm is not None:  # a cluster job: Slurm queues and places it
        _check_slurm_request(device, gpus, queue)
        return _launch_slurm(family, algorithm, data, slug, question, source, applied, slurm, after)
    # a bad device, GPU id or world size is refused before the campaign exists
    placement = resolve_placement(device, gpus, nproc, data)
    check_world_size(family, data, placement.nproc)
    dev = placement.device if placement.devices else resolve_device(device, data)
    try:
        warnings = list(check_config(family, data, launching=True).warnings)
    except LabError as err:
        raise err.with_next(FIX_OVERRIDES) from None
    _check_gpu_present(dev, data)
    refs = find_refs(data)  # checked by check_config; each one is also an upstream run
    check_not_identical(family, resolve_refs(data, refs), force=force)  # same config and seed
    upstream = check_after([*upstream, *refs.values()])
    forced = [
        run_id for run_id in dict.fromkeys(refs.values()) if ensure_final_model(run_id, write=False)
    ]
    fits_together = None
    waits = bool(upstream) and any(s != "succeeded" for s in _states(upstream))
    if not (queue or waits):  # the freest GPU(s) no run holds, picked now
        placement = pick_devices(placement)
        dev = placement.device if placement.devices else dev
    if not force and (placement.distributed or not placement.devices):
        fits_together, memory_warnings = check_placement(
            family, algorithm, data, placement, queue=queue or waits, memory=_device_memory()
        )
        warnings += memory_warnings
    elif not force:  # refused before the campaign is written; runs.launch re-checks the device
        fits_together, memory_warnings = _check_memory(
            family, algorithm, data, dev, queue=queue or waits
        )
        warnings += memory_warnings
    model_name = (data.get("model") or {}).get("name")
    dataset = (data.get("data") or {}).get("dataset")
    create_campaign(
        slug,
        question or f"Does {algorithm} pass a short sanity run?",
        family=family,
        model=model_name,
        dataset=dataset if isinstance(dataset, str) else None,
        seeds=[data["seed"]] if isinstance(data.get("seed"), int) else None,
    )
    for run_id in forced:  # a queued upstream that would not save its final model now does
        ensure_final_model(run_id, write=True)
        warnings.append(
            f"upstream run {run_id} will save its final model (checkpoint.save_final_model=true)"
        )
    result = _launch(
        family,
        algorithm,
        resolve_refs(data, refs),
        slug,
        source,
        applied,
        device=dev,
        force=force,
        queue=queue,
        fits_together=fits_together,
        after=upstream,
        references=refs,
        pipeline=pipeline,
        stage=stage,
        placement=placement,
    )
    warnings += _keep_calibration(result.run.run_dir, calibration)
    warnings += _record_now(result.run.id)
    if not result.queued:
        warnings += _record_when_ended(result.run.id)
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]})


def _check_slurm_request(device: str, gpus: str | int | None, queue: bool) -> None:
    """Refuse what only applies to this machine in a Slurm launch (one clear error each)."""
    from rlhf_lab.runs.slurm import refuse_local_only

    if gpus is not None:
        raise InvalidArgument(
            "gpus names this machine's GPUs; a Slurm job asks for gpus_per_node in slurm"
        )
    if device not in ("auto", None):
        raise refuse_local_only(f"device {device}")
    if queue:
        raise refuse_local_only("queue")


def _launch_slurm(
    family: str,
    algorithm: str,
    data: dict,
    slug: str,
    question: str | None,
    source: str,
    applied: list[str],
    slurm: dict[str, Any],
    after: list[str] | None,
) -> LaunchResult:
    """Submit a checked run as a Slurm job: every check (config, world size, Slurm present)
    comes before the campaign or run folder is written."""
    from rlhf_lab.api.placement import slurm_options
    from rlhf_lab.ledger import create_campaign
    from rlhf_lab.planning.validation import check_config
    from rlhf_lab.runs.slurm import check_slurm_available
    from rlhf_lab.runs.slurm_runs import launch_slurm
    from rlhf_lab.runs.world import check_world_size

    options = slurm_options(slurm)
    if after:
        from rlhf_lab.runs.slurm import refuse_local_only

        raise refuse_local_only("waiting for other runs (after)")
    check_world_size(family, data, options.world_size)
    warnings = list(check_config(family, data, launching=True).warnings)
    check_slurm_available()
    create_campaign(
        slug,
        question or f"Does {algorithm} pass a short sanity run?",
        family=family,
        model=(data.get("model") or {}).get("name"),
    )
    result = launch_slurm(family, algorithm, data, slug, source, applied, options)
    warnings += _record_now(result.run.id)
    warnings += _record_when_ended(result.run.id)
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]})


def _states(run_ids: list[str]) -> list[str]:
    from rlhf_lab.runs import run_state

    return [run_state(r).state for r in run_ids]


@operation
def launch_run(
    recipe: str,
    overrides: list[str] | None = None,
    *,
    shrink: bool = True,
    model: str | None = None,
    campaign: str | None = None,
    question: str | None = None,
    device: str = "auto",
    queue: bool = False,
    force: bool = False,
    after: list[str] | None = None,
    gpus: str | int | None = None,
    nproc: int | None = None,
    slurm: dict[str, Any] | None = None,
    calibrate: bool = True,
) -> LaunchRunResult:
    """:func:`launch_experiment` (shrunk by default) with the result shaped for an agent."""
    result = launch_experiment(
        recipe,
        overrides,
        shrink=shrink,
        model=model,
        campaign=campaign,
        question=question,
        device=device,
        force=force,
        queue=queue,
        after=after,
        gpus=gpus,
        nproc=nproc,
        slurm=slurm,
        calibrate=calibrate,
    )
    from rlhf_lab.api.results import launch_run_result

    return launch_run_result(result)


@operation
def resume_run(run_id: str, device: str | None = None, force: bool = False) -> LaunchResult:
    """:func:`rlhf_lab.runs.resume_run`, recorded like a launch: the run's ledger row is
    refreshed when the resumed attempt ends (a recorder process)."""
    from rlhf_lab.runs import resume_run as resume
    from rlhf_lab.runs.slurm_runs import resume_if_slurm

    result = resume_if_slurm(run_id) or resume(run_id, device=device, force=force)
    warnings = [] if result.queued else _record_when_ended(result.run.id)
    for rearmed in [*result.rearmed, *([run_id] if result.queued else [])]:
        warnings += _record_now(rearmed)  # the ledger shows them queued again
    return result.model_copy(update={"warnings": [*result.warnings, *warnings]})


@operation
def resume_run_detached(run_id: str, force: bool = False) -> LaunchRunResult:
    """:func:`resume_run` with the result shaped for an agent (like :func:`launch_run`)."""
    from rlhf_lab.api.results import launch_run_result

    return launch_run_result(resume_run(run_id, force=force))


MAX_SWEEP_SEEDS = 16


def _is_seed_override(item: str) -> bool:
    return str(item).split("=", 1)[0].strip() == "seed"


def _sweep_base_seed(recipe: str, overrides: list[str], base_seed: int | None) -> int:
    """The first seed of a sweep: ``base_seed``, else a ``seed=`` override, else the first
    recipe's configured seed (0 when it has none)."""
    if base_seed is not None:
        return base_seed
    from rlhf_lab.planning.configs import resolve_config

    given = [o for o in overrides if _is_seed_override(o)]
    try:
        data = resolve_config(recipe, given).data
    except LabError as err:
        raise err.with_next(NextStep("list_recipes")) from None
    seed = data.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


@operation
def sweep(
    recipes: list[str],
    overrides: list[str] | None = None,
    *,
    shrink: bool = True,
    model: str | None = None,
    campaign: str | None = None,
    device: str = "auto",
    seeds: int = 1,
    base_seed: int | None = None,
) -> SweepResult:
    """Queue matched runs (same overrides, same shrink) of several recipes in one campaign; the
    queue runs them one after another. ``seeds``: K runs per recipe with the seeds base, base+1,
    ... (``base_seed``, else a ``seed=`` override, else the first recipe's configured seed); every
    arm gets the same seed list, whatever seed its recipe ships (reward-model recipes differ).
    Runs are queued seed by seed, so matched pairs finish together."""
    from rlhf_lab.api.recipes import find_known_recipe
    from rlhf_lab.api.results import SweepResult
    from rlhf_lab.paths import campaign_name

    if not recipes:
        raise InvalidArgument(
            "a sweep needs at least one recipe, e.g. dpo,ipo,simpo", next=NextStep("list_recipes")
        )
    if isinstance(seeds, bool) or not 1 <= seeds <= MAX_SWEEP_SEEDS:
        raise InvalidArgument(
            f"seeds must be between 1 and {MAX_SWEEP_SEEDS} (runs per recipe), got {seeds!r}"
        )
    if base_seed is not None and (isinstance(base_seed, bool) or base_seed < 0):
        raise InvalidArgument(f"base_seed must be a non-negative integer, got {base_seed!r}")
    names = [find_known_recipe(r).algorithm for r in recipes]
    slug = (
        campaign
        if campaign is not None
        else "-vs-".join(n.replace("_", "-") for n in names)[:60].strip("-")
    )
    campaign_name(slug)  # a bad slug is refused before anything is queued
    given = list(overrides or [])
    first = _sweep_base_seed(recipes[0], given, base_seed)
    seed_list = [first + i for i in range(seeds)]
    rest = [o for o in given if not _is_seed_override(o)]
    seeds_text = f"seed {seed_list[0]}" if seeds == 1 else f"seeds {seed_list[0]}-{seed_list[-1]}"
    from rlhf_lab.planning.plan import matched_overrides

    # policy-gradient arms get one rollout shape and the same prompts (the plan's rule)
    matched = matched_overrides(recipes, model, rest)
    launches = [
        launch_experiment(
            r,
            [*matched[r], *rest, f"seed={seed}"],
            shrink=shrink,
            model=model,
            campaign=slug,
            question=f"How do {', '.join(names)} compare with matched settings ({seeds_text})?",
            device=device,
            queue=True,
        )
        for seed in seed_list
        for r in recipes
    ]
    return SweepResult(campaign=campaign_name(slug), launches=launches, seeds=seed_list)
