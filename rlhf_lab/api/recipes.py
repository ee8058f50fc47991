"""Recipes and their cost before anything runs: the recipe list with each family's brief, and the
memory estimate of a recipe against the memory free now on the device a launch would use.
Lab API functions behind the CLI's ``recipes`` and the MCP tools ``list_recipes`` and
``estimate_memory``. Torch-free.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from rlhf_lab.api._operation import operation
from rlhf_lab.api.request import FIX_OVERRIDES
from rlhf_lab.errors import LabError, NextStep
from rlhf_lab.planning.catalog import (
    Recipe,
    acceptance_for,
    family_info,
    find_recipe,
    key_metrics_for,
)
from rlhf_lab.planning.catalog import list_recipes as catalog_recipes
from rlhf_lab.planning.memory import MemoryEstimate, fits
from rlhf_lab.planning.memory import estimate_memory as estimate_config_memory
from rlhf_lab.planning.overrides import Override, as_overrides
from rlhf_lab.planning.shrink import ShrinkResult
from rlhf_lab.planning.trainer_config import TrainerConfig
from rlhf_lab.planning.validation import check_config
from rlhf_lab.runs import active_runs, resolve_device
from rlhf_lab.runs.machine import this_machine

LIST_RECIPES = NextStep("list_recipes")
OFFLINE_MODEL = NextStep(
    "estimate_memory", {"model": "tiny"}, note="builds offline; or pass a local model folder"
)


class FamilyBrief(BaseModel):
    name: str
    algorithms: list[str]
    key_metrics: list[str] = Field(
        description="the metrics that show progress (docs/algorithms.md)"
    )
    acceptance: list[str] = Field(description="what a good sanity run shows")
    comparison: str = Field(description="how runs of this family are compared")


class RecipeList(BaseModel):
    recipes: list[Recipe]
    families: list[FamilyBrief] = Field(description="the families of the listed recipes")
    pipelines: list[str] = Field(
        default_factory=list, description="run_pipeline names: '<name>: <stage>: <recipe> -> ...'"
    )


class MemoryCheck(BaseModel):
    recipe: str = Field(description="<family>/<name> of the recipe")
    family: str
    algorithm: str
    model: str | None
    shrunk: bool
    device: str = Field(description="where launch_run would put it: cpu or cuda:N")
    estimate: MemoryEstimate
    free_gb: float | None = Field(description="free memory on that device now (GiB)")
    fits: bool | None = Field(description="estimate plus a 10% margin fits in free_gb")
    verdict: str


def family_brief(name: str) -> FamilyBrief:
    """A family's algorithms, key metrics, acceptance criteria and comparison rule."""
    info = family_info(name)
    return FamilyBrief(
        name=name,
        algorithms=info.algorithms,
        key_metrics=info.key_metrics,
        acceptance=info.acceptance,
        comparison=info.comparison,
    )


@operation
def list_recipes(family: str | None = None) -> RecipeList:
    """The shipped recipes (optionally of one family) and a brief of each family listed."""
    recipes = catalog_recipes(family)
    names = list(dict.fromkeys(r.family for r in recipes))
    return RecipeList(
        recipes=recipes, families=[family_brief(n) for n in names], pipelines=_pipelines()
    )


def _pipelines() -> list[str]:
    """The pipelines in one line each (their stages in launch order)."""
    from rlhf_lab.runs.pipelines import list_pipeline_defs, plan_stages

    out = []
    for defn in list_pipeline_defs():
        chain = " -> ".join(f"{s.name}: {s.recipe}" for s in plan_stages(defn))
        out.append(f"{defn.name}: {chain}")
    return out


def find_known_recipe(recipe: str) -> Recipe:
    """find_recipe, with "list the recipes" as the next step when the name is unknown."""
    try:
        return find_recipe(recipe)
    except LabError as err:
        raise err.with_next(LIST_RECIPES) from None


@operation
def shrink_config(
    recipe: str, overrides: list[str] | None = None, model: str | None = None
) -> ShrinkResult:
    """A recipe shrunk into a quick sanity run and validated by the trainer's config model;
    an unknown recipe points at the recipe list, a bad override at fixing it."""
    from rlhf_lab.planning.shrink import shrink_config as shrink

    find_known_recipe(recipe)
    try:
        return shrink(recipe, [Override.parse(o) for o in overrides or []], model=model)
    except LabError as err:
        raise err.with_next(FIX_OVERRIDES) from None


def acceptance_text(algorithm: str) -> str:
    """What to watch and what a good sanity run of ``algorithm`` shows, as a few lines."""
    try:
        recipe = find_recipe(algorithm)
    except LabError:
        return "(unknown recipe: start with list_recipes to find the right name)"
    items = acceptance_for(recipe.family, recipe.algorithm)
    metrics = ", ".join(key_metrics_for(recipe.family, recipe.algorithm))
    return f"{recipe.id} ({recipe.family}). Watch: {metrics}.\nAcceptance:\n" + "\n".join(
        f"- {a}" for a in items
    )


def device_free_gb(device: str) -> float | None:
    """Memory free now on ``device`` (GiB): available RAM for ``cpu``, free GPU memory for
    ``cuda``/``cuda:N``; None for a GPU this machine does not show."""
    return this_machine().device_free_gb(device)


def _verdict(need: str, target: str, free: float | None, ok: bool | None) -> str:
    """One sentence on whether the estimate fits what ``target`` has free."""
    if ok is None:
        return f"needs {need}; {target} is not visible here, so the fit is unknown"
    if ok:
        return f"fits: needs {need}, {free:.2f} GiB free on {target} (10% margin kept)"
    return (
        f"does NOT fit: needs {need}, {free:.2f} GiB free on {target}. Shrink further "
        "(model='tiny' or a smaller model, lower train.batch_size or data.max_length, "
        "model.gradient_checkpointing=true) or wait for the device to free up"
    )


def _resolved(
    recipe: str, model: str | None, overrides: list[str], shrink: bool
) -> tuple[str, str, dict, str]:
    """(family, algorithm, config, recipe id) of a recipe, shrunk or as shipped."""
    from rlhf_lab.planning.configs import resolve_config

    if shrink:
        shrunk = shrink_config(recipe, overrides, model=model)
        return shrunk.family, shrunk.algorithm, shrunk.config, shrunk.recipe.id
    extra = [f"model.name={model}"] if model else []
    resolved = resolve_config(recipe, as_overrides(overrides + extra))
    check_config(resolved.family, resolved.config)  # the checks shrink_config makes
    return resolved.family, resolved.algorithm, resolved.data, resolved.recipe.id


@operation
def estimate_memory(
    recipe: str,
    model: str | None = None,
    overrides: list[str] | None = None,
    shrink: bool = True,
    device: str = "auto",
    gpus: str | int | None = None,
    nproc: int | None = None,
) -> MemoryCheck:
    """The peak training memory of a recipe (shrunk by default) against what the device a launch
    would use has free now, with a verdict naming the runs already on it. ``gpus`` / ``nproc``
    as for a launch (torchrun, FSDP2): the estimate is one rank's, checked against each GPU (on
    the CPU, all ranks share the RAM); ``device`` is then the device with the least free."""
    family, algorithm, config, rid = _resolved(recipe, model, list(overrides or []), shrink)
    world, targets = 1, [resolve_device(device, config)]
    if gpus is not None or nproc is not None:
        world, targets = _world_targets(family, config, device, gpus, nproc)
    kind: Literal["cuda", "cpu"] = "cpu" if targets[0] == "cpu" else "cuda"
    try:
        view = TrainerConfig(family, config)
        est = estimate_config_memory(family, algorithm, view, device=kind, world_size=world)
    except LabError as err:
        raise err.with_next(OFFLINE_MODEL) from None
    ranks_here = world if kind == "cpu" else 1  # CPU ranks share one RAM
    frees = {t: device_free_gb(t) for t in targets}
    target = min(targets, key=lambda t: -1.0 if frees[t] is None else frees[t])
    free = frees[target]
    need_gb = est.total_gb * ranks_here
    ok = None if free is None else fits(need_gb, free)
    need = f"~{need_gb:.2f} GiB ({est.peak_phase} phase)"
    if world > 1:
        need = f"~{est.total_gb:.2f} GiB per rank × {world} ranks ({est.peak_phase} phase)"
        if kind == "cuda":
            need = f"~{est.total_gb:.2f} GiB on each of {len(targets)} GPUs ({est.peak_phase})"
    verdict = _verdict(need, target, free, ok)
    busy = [s.id for t in targets for s in active_runs(t)]
    if busy:
        verdict += f". Running on {', '.join(targets)} now: {', '.join(dict.fromkeys(busy))}"
    return MemoryCheck(
        recipe=rid,
        family=family,
        algorithm=algorithm,
        model=est.model,
        shrunk=shrink,
        device=target,
        estimate=est,
        free_gb=free,
        fits=ok,
        verdict=verdict,
    )


def _world_targets(
    family: str, config: dict, device: str, gpus: str | int | None, nproc: int | None
) -> tuple[int, list[str]]:
    """(world size, the devices the ranks would use) of a launch with ``gpus`` / ``nproc``:
    refused as the launch refuses them (a GPU this machine does not show, more ranks than the
    batch allows); GPUs a launch would pick are the freest ones now."""
    from rlhf_lab.runs import resolve_placement
    from rlhf_lab.runs.devices import freest_gpus
    from rlhf_lab.runs.launcher import _held_devices
    from rlhf_lab.runs.world import check_world_size

    placement = resolve_placement(device, gpus, nproc, config)
    world = placement.nproc if placement.distributed else 1
    check_world_size(family, config, world)
    devices = list(dict.fromkeys(placement.devices))
    if not devices:  # as a launch picks: the freest GPUs no run holds, else the freest
        wanted = placement.gpus_wanted or 1
        devices = freest_gpus(wanted, _held_devices()) or freest_gpus(wanted, set()) or []
    return world, devices or [resolve_device(device, config)]
