"""The lab's one entry point: every operation the CLI or the MCP server offers is one typed
function here: typed arguments validated by pydantic (:func:`~rlhf_lab.api._operation.operation`:
a malformed argument is an ``InvalidArgument``) in, a pydantic model or a list of them out. Both
surfaces are adapters over this package; they import nothing else of the lab but
:mod:`rlhf_lab.errors` (tests/lab/test_api_layer.py, tests/lab/test_import_contract.py).
Torch-free.

Names are loaded lazily (PEP 562 ``__getattr__``): ``import rlhf_lab.api`` costs almost nothing,
and ``api.list_runs`` imports only the run modules, so a CLI reading command starts fast. What
lives where:

- :mod:`rlhf_lab.api.launching`: ``launch``, the one way to start a run, takes a
  :class:`~rlhf_lab.api.request.RunRequest` (built once by a surface); ``sweep`` (a
  ``SweepRequest``: one request per arm) and ``resume_run``; their result models in
  :mod:`rlhf_lab.api.results`; the device checks a launch makes are this module's (they
  read the machine from :mod:`rlhf_lab.runs.machine`), the config checks
  :mod:`rlhf_lab.planning.validation`'s;
- :mod:`rlhf_lab.api.operations`: the operation table, one row per operation a surface offers
  (name, description, argument model, result model, read-only / destructive flags); the MCP
  server registers a tool per row;
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
steps naming an operation: a row of the table (``NextStep("launch_run", {"queue": True})``) or
one the CLI alone offers (``create_campaign``, ``pull_model``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from rlhf_lab import __version__
from rlhf_lab._lazy import lazy_attributes
from rlhf_lab.api._operation import argument_errors_text as argument_errors_text
from rlhf_lab.api._operation import describe_schema as describe_schema
from rlhf_lab.api._operation import operation
from rlhf_lab.api._operation import raised_lab_error as raised_lab_error
from rlhf_lab.errors import Conflict, LabError, NextStep, Unavailable
from rlhf_lab.errors import InvalidArgument as InvalidArgument

LAB_VERSION: str = __version__

if TYPE_CHECKING:  # pragma: no cover - for readers and type checkers only
    from rlhf_lab.planning.trainer_config import TrainerConfig
    from rlhf_lab.runs import RunStatus

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
    "listening": "rlhf_lab.planning.notices",  # slow planning steps say they start
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
    "check_resources": "rlhf_lab.runs.machine",
    "ModelEntry": "rlhf_lab.planning.models",
    "list_models": "rlhf_lab.planning.models",
    "pull_model": "rlhf_lab.planning.models",
    "SkillsInstallResult": "rlhf_lab.skills",
    "install_skills": "rlhf_lab.skills",
    "run_demo": "rlhf_lab.demo",
    "experiments_dir": "rlhf_lab.paths",
    "campaign_name": "rlhf_lab.paths",
    # launching
    "RunRequest": "rlhf_lab.api.request",
    "Override": "rlhf_lab.api.request",
    "SweepRequest": "rlhf_lab.api.request",
    "launch": "rlhf_lab.api.launching",
    "resume_run": "rlhf_lab.api.launching",
    "sweep": "rlhf_lab.api.launching",
    "MAX_SWEEP_SEEDS": "rlhf_lab.api.launching",
    "LaunchRunResult": "rlhf_lab.api.results",
    "SweepResult": "rlhf_lab.api.results",
    "launch_run_result": "rlhf_lab.api.results",
    "StopRunResult": "rlhf_lab.api.results",
    "stop_run_result": "rlhf_lab.api.results",
    # evaluations
    "EvaluationLaunch": "rlhf_lab.api.evaluations",
    "evaluate_model": "rlhf_lab.api.evaluations",
    # the operation table
    "Operation": "rlhf_lab.api._operation",
    "OPERATIONS": "rlhf_lab.api.operations",
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


def _as_operation(name: str, value: Any) -> Any:
    """A function a surface calls gets its arguments validated
    (:func:`~rlhf_lab.api._operation.operation`)."""
    if name in _SURFACE_OPERATIONS and not getattr(value, "__lab_operation__", False):
        return operation(value)
    return value


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, wrap=_as_operation)


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
        "raised_lab_error",
        "device_busy_error",
        "visible_gpu_count",
    ]
)


# ------------------------------------------------------------------------------ device checks


def visible_gpu_count() -> int:
    """How many GPUs this process may use (CUDA_VISIBLE_DEVICES respected; 0 without NVML)."""
    from rlhf_lab.runs.machine import this_machine

    return this_machine().visible_gpu_count()


def _where(device: str) -> str:
    return "RAM" if device == "cpu" else f"memory of {device}"


def _estimate_gb(
    family: str, algorithm: str, config: TrainerConfig, device: str
) -> tuple[float | None, str]:
    """(peak GiB of this run on ``device`` or None, why there is none)."""
    from rlhf_lab.planning.memory import estimate_memory as estimate_config_memory

    try:
        kind = "cpu" if device == "cpu" else "cuda"
        return estimate_config_memory(family, algorithm, config, device=kind).total_gb, ""
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
    family: str, algorithm: str, config: TrainerConfig, device: str, *, queue: bool
) -> tuple[bool | None, list[str]]:
    """The launch's memory and busy-device rule, the same for the CPU (RAM) and a GPU; returns
    (``fits_together`` for :func:`rlhf_lab.runs.launcher.start_or_queue`, warnings).

    - queued: refused only when the estimate exceeds the device's *total* memory (it could never
      start); it waits for the device anyway;
    - the device is idle: refused when the estimate does not fit its free memory now;
    - a run already trains on it: started beside it when the estimate fits the free memory now
      (CPU runs then split the cores), refused otherwise (and when there is no estimate).
    ``force`` skips all of it (the caller does not call this)."""
    from rlhf_lab.planning.memory import fits
    from rlhf_lab.runs import active_runs
    from rlhf_lab.runs.machine import this_machine

    estimate, why = _estimate_gb(family, algorithm, config, device)
    warnings = [f"{why}: the memory fit was not checked"] if estimate is None else []
    if queue:
        total = this_machine().device_total_gb(device) if estimate is not None else None
        if estimate is not None and total is not None and not fits(estimate, total):
            raise Conflict(
                f"the memory estimate of this run (~{estimate:.2f} GiB) exceeds all the "
                f"{_where(device)} ({total:.2f} GiB on {device}): queued, it could never start",
                next=_memory_refusal(device, estimate, total).next_steps,
            )
        return None, warnings
    busy = active_runs(device)
    free = this_machine().device_free_gb(device) if estimate is not None or busy else None
    ok = None if estimate is None or free is None else fits(estimate, free)
    if busy:
        if ok:
            return True, warnings
        raise device_busy_error(device, busy, ok, estimate_gb=estimate, free_gb=free)
    if ok is False:
        assert estimate is not None and free is not None
        raise _memory_refusal(device, estimate, free)
    return None, warnings


def _check_gpu_present(device: str, config: TrainerConfig) -> None:
    """Refuse a GPU run on a machine that shows no such GPU before anything is written: the
    trainer would otherwise fail after start-up (model.device=cuda) or quietly train on the CPU
    under a cuda label (--device cuda with model.device=auto)."""
    if not (device.startswith("cuda") or config.get("model.device") == "cuda"):
        return
    index = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
    count = visible_gpu_count()
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
    from rlhf_lab.runs.launcher import busy_conflict

    ways_on = [
        NextStep("launch_run", {"queue": True}, note="starts after it ends"),
        NextStep("launch_run", {"force": True}, note="only when both runs fit in memory"),
    ]
    rule = f"a second job starts beside it only when its memory estimate fits ({why})"
    return busy_conflict(device, busy, rule, ways_on)
