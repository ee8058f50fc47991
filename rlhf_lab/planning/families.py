"""The lab's view of the algorithm families: :data:`FAMILIES`, built from the trainers' specs.

Each :class:`FamilyInfo` is derived from ``trainers/<family>/spec.py`` (torch-free); the lab
holds no family table of its own. This module sits at the bottom of the lab's imports
(:mod:`rlhf_lab.planning.config_models`, :mod:`rlhf_lab.planning.catalog` and everything above read it), so no
import cycle can form through it.
"""

from __future__ import annotations

import difflib

from pydantic import BaseModel, Field

from rlhf_lab.errors import NextStep, NotFound
from trainers.core.spec import FamilySpec, family_specs

__all__ = ["FAMILIES", "FamilyInfo", "family_info", "info_from_spec"]


class FamilyInfo(BaseModel):
    """One algorithm family of ``trainers/`` (a JSON-able view of its spec)."""

    name: str
    config_module: str = Field(description="torch-free module holding the pydantic config model")
    config_class: str = Field(description="class name of the config model in that module")
    algorithm_field: str | None = Field(
        description="dotted config key naming the algorithm (None: the family has one algorithm)"
    )
    default_algorithm: str
    algorithms: list[str]
    trainer_module: str = Field(description="run as `python -m <trainer_module> --config ...`")
    configs_dir: str = Field(description="shipped recipes, relative to the source root")
    key_metrics: list[str] = Field(
        description="the metrics that show progress (docs/algorithms.md)"
    )
    headline_metric: str | None = Field(
        default=None, description="the held-out metric that says whether a run worked"
    )
    acceptance: list[str] = Field(description="what a good sanity run shows")
    watch: list[str] = Field(description="what to look at while it runs")
    comparison: str = Field(description="how runs of this family are compared")
    builtin_datasets: dict[str, str] = Field(
        default_factory=dict,
        description="offline data set per algorithm ('*' for all) used with a tiny preset",
    )


def info_from_spec(spec: FamilySpec) -> FamilyInfo:
    """The lab's record of a family, read off its spec."""
    return FamilyInfo(
        name=spec.name,
        config_module=spec.config_module,
        config_class=spec.config_class,
        algorithm_field=spec.algorithm_field,
        default_algorithm=spec.default_algorithm,
        algorithms=list(spec.algorithm_names),
        trainer_module=spec.trainer_module,
        configs_dir=spec.configs_dir,
        key_metrics=list(spec.key_metric_names()),
        headline_metric=spec.headline_metric,
        acceptance=list(spec.acceptance),
        watch=list(spec.watch),
        comparison=spec.comparison,
        builtin_datasets=dict(spec.builtin_datasets),
    )


FAMILIES: dict[str, FamilyInfo] = {spec.name: info_from_spec(spec) for spec in family_specs()}
"""Family name -> :class:`FamilyInfo`, in the specs' order (tests may add a fake family)."""


def family_info(family: str) -> FamilyInfo:
    """The family's record; a :class:`NotFound` lab error with close matches otherwise."""
    try:
        return FAMILIES[family]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(family), list(FAMILIES), n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise NotFound(
            f"unknown family {family!r}.{hint} Families: {', '.join(FAMILIES)}",
            next=NextStep("list_recipes", note="lists the families and their recipes"),
        ) from None
