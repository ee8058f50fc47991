"""The lab's front door: typed functions returning pydantic models, shared by the CLI and the MCP
server (both are thin adapters over this module). Torch-free.

Most functions live in their own modules and are re-exported here; this module adds the few that
compose several of them (launch with campaign + memory check, status with alerts, sweeps).
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from rlhf_lab.catalog import Recipe, find_recipe, list_recipes
from rlhf_lab.compare import Comparison, compare_runs
from rlhf_lab.configs import ResolvedConfig, resolve_config
from rlhf_lab.ledger import (
    Campaign,
    CampaignView,
    RunRecord,
    create_campaign,
    list_campaigns,
    record_run,
    show_campaign,
)
from rlhf_lab.logs import Alert, LogChunk, MetricSeries, diagnose, read_metrics, tail_log
from rlhf_lab.memory import MemoryEstimate, estimate_memory, fits
from rlhf_lab.paths import LabError, campaign_name, experiments_dir
from rlhf_lab.plan import Plan, plan_experiment
from rlhf_lab.resources import Resources, check_resources
from rlhf_lab.runs import (
    LaunchResult,
    RunStatus,
    _visible_gpu_count,
    active_runs,
    list_runs,
    resolve_device,
    resume_run,
    run_state,
    stop_run,
)
from rlhf_lab.runs import launch as _launch
from rlhf_lab.shrink import ShrinkResult, shrink_config

__all__ = [
    "Alert",
    "Campaign",
    "CampaignView",
    "Comparison",
    "LabError",
    "LaunchResult",
    "LogChunk",
    "MemoryEstimate",
    "MetricSeries",
    "Plan",
    "Recipe",
    "ResolvedConfig",
    "Resources",
    "RunRecord",
    "RunStatus",
    "RunView",
    "ShrinkResult",
    "SweepResult",
    "check_resources",
    "compare_runs",
    "create_campaign",
    "diagnose",
    "estimate_memory",
    "experiments_dir",
    "find_recipe",
    "launch_experiment",
    "list_campaigns",
    "list_recipes",
    "list_runs",
    "plan_experiment",
    "read_metrics",
    "record_run",
    "resolve_config",
    "resume_run",
    "run_state",
    "run_status",
    "show_campaign",
    "shrink_config",
    "stop_run",
    "sweep",
    "tail_log",
]


class RunView(BaseModel):
    """A run's status plus the alerts its logs and metrics raise."""

    status: RunStatus
    alerts: list[Alert] = Field(default_factory=list)


class SweepResult(BaseModel):
    campaign: str
    launches: list[LaunchResult]


def run_status(run_id: str) -> RunView:
    status = run_state(run_id)
    return RunView(status=status, alerts=diagnose(run_id, status=status))


def _device_free_gb(device: str) -> float | None:
    res = check_resources(include_runs=False)
    if device == "cpu":
        return res.ram_available_gb
    for gpu in res.gpus:
        if device in (f"cuda:{gpu.index}", "cuda"):
            return gpu.free_gb
    return None


def _fits_beside_running(family, algorithm, data, device) -> bool | None:
    """None when nothing else holds the device; otherwise whether this run's memory estimate
    fits in what the device has free now."""
    if not active_runs(device):
        return None
    free = _device_free_gb(device)
    if free is None:
        return False
    try:
        kind = "cpu" if device == "cpu" else "cuda"
        estimate = estimate_memory(family, algorithm, data, device=kind)
    except LabError:
        return False
    return fits(estimate.total_gb, free)


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
    raise LabError(
        f"{asked} was asked for but this machine shows {count} GPU(s) (CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); launch with --device cpu and "
        "model.device=auto (or cpu), or on a machine with a GPU (`rlhf-lab gpu` lists them)"
    )


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
) -> LaunchResult:
    """Resolve (and optionally shrink) a recipe, make sure its campaign exists, check the device,
    and start the trainer in the background (or queue it). Returns at once with the run id."""
    overrides = list(overrides or [])
    if shrink or model:
        shrunk = shrink_config(recipe, overrides, model=model)
        family, data, applied = shrunk.family, shrunk.config, shrunk.overrides
        algorithm, source = shrunk.algorithm, shrunk.recipe.config_path
    else:
        resolved = resolve_config(recipe, overrides)
        family, data, applied = resolved.family, resolved.data, overrides
        algorithm, source = resolved.algorithm, resolved.recipe.config_path
    # campaign="" is a bad slug, not "use the default" (it would launch into another campaign)
    slug = campaign if campaign is not None else f"{algorithm.replace('_', '-')}-sanity"
    campaign_name(slug)  # validates the slug before anything is written
    dev = resolve_device(device, data)  # a bad device is refused before the campaign exists
    _check_gpu_present(dev, data)
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
    fits_together = None if force or queue else _fits_beside_running(family, algorithm, data, dev)
    return _launch(
        family,
        algorithm,
        data,
        slug,
        source,
        applied,
        device=dev,
        force=force,
        queue=queue,
        fits_together=fits_together,
    )


def sweep(
    recipes: list[str],
    overrides: list[str] | None = None,
    *,
    shrink: bool = True,
    model: str | None = None,
    campaign: str | None = None,
    device: str = "auto",
) -> SweepResult:
    """Queue matched runs (same overrides, same shrink) of several recipes in one campaign; the
    queue runs them one after another."""
    if not recipes:
        raise LabError("a sweep needs at least one recipe, e.g. dpo,ipo,simpo")
    names = [find_recipe(r).algorithm for r in recipes]
    slug = (
        campaign
        if campaign is not None
        else "-vs-".join(n.replace("_", "-") for n in names)[:60].strip("-")
    )
    launches = [
        launch_experiment(
            r,
            overrides,
            shrink=shrink,
            model=model,
            campaign=slug,
            question=f"How do {', '.join(names)} compare with matched settings?",
            device=device,
            queue=True,
        )
        for r in recipes
    ]
    return SweepResult(campaign=campaign_name(slug), launches=launches)
