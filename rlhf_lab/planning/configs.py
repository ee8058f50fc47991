"""Resolve a config the way a trainer will see it: YAML + dotted overrides, validated by the
family's pydantic model, and compared with the shipped default.

The family's config module (``trainers/<family>/config.py``) is imported lazily, on first use,
and is torch-free by contract. A family whose module does not exist yet gives a clear
:class:`LabError` instead of an ImportError; an invalid config gives a :class:`LabError` carrying
the trainer's own :class:`ConfigError` message (the same text the trainer would print).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.paths import LabError
from rlhf_lab.planning.catalog import (
    Recipe,
    family_info,
    find_recipe,
    get_dotted,
    list_recipes,
)
from rlhf_lab.planning.config_models import config_model, dump, families_accepting, validate_data
from rlhf_lab.planning.overrides import Override, format_override, texts
from rlhf_lab.planning.trainer_config import TrainerConfig
from trainers.core.config import (
    ConfigError,
    apply_overrides,
    config_diff,
    read_yaml,
)

__all__ = [
    "ConfigChange",
    "ConfigValue",
    "ResolvedConfig",
    "config_model",
    "diff_configs",
    "families_accepting",
    "format_override",
    "resolve_config",
    "shipped_default",
    "validate_data",
]


ConfigValue = str | int | float | bool | list[Any] | dict[str, Any] | None
"""A config leaf as YAML/JSON holds it: a scalar, a list or a mapping."""


class ConfigChange(BaseModel):
    """One config value that differs from the shipped recipe: the same shape wherever a diff is
    shown (a shrink, a plan, a ledger row)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")  # inf survives ledger.json

    key: str = Field(description="dotted key, e.g. train.learning_rate")
    shipped: ConfigValue = Field(default=None, description="the shipped recipe's value")
    used: ConfigValue = Field(default=None, description="the value this config uses")


class ResolvedConfig(BaseModel):
    family: str
    algorithm: str
    recipe: Recipe
    source: str = Field(description="the YAML file the config starts from")
    overrides: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(description="the validated config, as the trainer will dump it")
    default: dict[str, Any] = Field(description="the shipped default it is compared with")
    default_source: str = Field(description="where `default` comes from")
    diff: list[ConfigChange] = Field(default_factory=list)
    _validated: BaseModel | None = PrivateAttr(default=None)

    @property
    def config(self) -> TrainerConfig:
        """The config as the read-only view the lab's planning functions take."""
        return TrainerConfig(self.family, self.data, self._validated)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.data, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Resolving
# ---------------------------------------------------------------------------------------------


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        return read_yaml(path)
    except ConfigError as err:
        raise InvalidArgument(str(err)) from None


def shipped_default(recipe: Recipe) -> tuple[dict[str, Any], str]:
    """(validated data, source) of the shipped config a config is compared with: the recipe
    itself when shipped; for a user file, the shipped recipe of the same algorithm, else the
    config model's defaults."""
    if recipe.shipped:
        data = _load_yaml(recipe.path())
        return dump(validate_data(recipe.family, data, recipe.config_path)), recipe.config_path
    same = [r for r in list_recipes(recipe.family) if r.algorithm == recipe.algorithm]
    if same:
        same.sort(key=lambda r: (r.name != recipe.algorithm, len(r.name), r.name))
        return shipped_default(same[0])
    info = family_info(recipe.family)
    seed: dict[str, Any] = {}
    if info.algorithm_field:
        seed = apply_overrides({}, [f"{info.algorithm_field}={recipe.algorithm}"])
    try:
        return dump(validate_data(recipe.family, seed)), f"{info.config_class} defaults"
    except LabError:
        return {}, "none (the config model has required fields)"


def diff_configs(default: dict[str, Any], data: dict[str, Any]) -> list[ConfigChange]:
    return [
        ConfigChange(key=key, shipped=old, used=new)
        for key, (old, new) in config_diff(default, data).items()
    ]


def apply(data: dict[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """A copy of ``data`` with ``overrides`` applied in order (a key under a value is refused
    with the trainer's message)."""
    try:
        return apply_overrides(data, texts(overrides))
    except ConfigError as err:
        raise InvalidArgument(str(err)) from None


def resolve_config(
    recipe_or_file: str | Path | Recipe, overrides: Sequence[Override] = ()
) -> ResolvedConfig:
    """Load a recipe (name, ``family/name``, algorithm or YAML path), apply the ``overrides``
    (pairs: a surface parses its ``key=value`` strings with
    :func:`~rlhf_lab.planning.overrides.as_overrides`), validate with the family's model and
    diff against the shipped default."""
    recipe = find_recipe(recipe_or_file)
    pairs = list(overrides)
    written = texts(pairs)
    raw = apply(_load_yaml(recipe.path()), pairs)
    source = recipe.config_path
    if written:
        source += " with overrides " + ", ".join(written)
    validated = validate_data(recipe.family, raw, source)
    data = dump(validated)
    default, default_source = shipped_default(recipe)
    info = family_info(recipe.family)
    algorithm = recipe.algorithm
    if info.algorithm_field:
        value = get_dotted(data, info.algorithm_field)
        if isinstance(value, str):
            algorithm = value
    resolved = ResolvedConfig(
        family=recipe.family,
        algorithm=algorithm,
        recipe=recipe,
        source=recipe.config_path,
        overrides=written,
        data=data,
        default=default,
        default_source=default_source,
        diff=diff_configs(default, data),
    )
    resolved._validated = validated
    return resolved
