"""The families' pydantic config models, imported lazily from their torch-free modules.

Which module and class hold a family's config model is read from :data:`rlhf_lab.planning.families.FAMILIES`
(built from the specs). This module sits below both :mod:`rlhf_lab.planning.catalog` (which
uses :func:`families_accepting` to tell the family of a file that names no algorithm) and
:mod:`rlhf_lab.planning.configs` (which resolves configs), so neither imports the other's way round.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

from pydantic import BaseModel

from rlhf_lab.errors import InvalidArgument, LabError, Unavailable
from rlhf_lab.planning.families import FAMILIES, FamilyInfo, family_info
from trainers.core.config import ConfigError, validate_config

__all__ = [
    "config_model",
    "dump",
    "families_accepting",
    "validate_data",
]


def _module_missing(err: ModuleNotFoundError, module: str) -> bool:
    name = err.name or ""
    return bool(name) and (module == name or module.startswith(name + "."))


def _pick_class(module: ModuleType, spec: FamilyInfo) -> type[BaseModel] | None:
    """The config model of a module whose class is not named as the spec says: the top-level
    pydantic model defined there (the one no other model uses as a section)."""
    models = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, BaseModel) and obj.__module__ == module.__name__
    ]
    if spec.algorithm_field:
        top_key = spec.algorithm_field.split(".")[0]
        with_field = [m for m in models if top_key in m.model_fields]
        if with_field:
            models = with_field
    used = {
        field.annotation
        for m in models
        for field in m.model_fields.values()
        if isinstance(field.annotation, type)
    }
    top = [m for m in models if m not in used and "model" in m.model_fields]
    return top[0] if len(top) == 1 else None


def config_model(family: str) -> type[BaseModel]:
    """The family's pydantic config class (imported on first use)."""
    spec = family_info(family)
    try:
        module = importlib.import_module(spec.config_module)
    except ModuleNotFoundError as err:
        if _module_missing(err, spec.config_module):
            raise Unavailable(
                f"family {family} has no config model yet: {spec.config_module} does not exist "
                "in this checkout, so its configs cannot be validated or shrunk."
            ) from None
        raise Unavailable(f"cannot import {spec.config_module}: {err}") from None
    except Exception as err:  # a broken module must not take the lab down
        raise Unavailable(
            f"cannot import {spec.config_module}: {type(err).__name__}: {err}"
        ) from None
    cls = getattr(module, spec.config_class, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        cls = _pick_class(module, spec)
    if cls is None:
        raise Unavailable(
            f"{spec.config_module} defines no config model named {spec.config_class} (and no "
            "single top-level pydantic model to use instead)"
        )
    return cls


def validate_data(family: str, data: dict[str, Any], source: str = "config") -> BaseModel:
    """Validate ``data`` with the family's model; a bad config raises LabError (same message
    as the trainer's ConfigError)."""
    model = config_model(family)
    try:
        return validate_config(data, model, source=source)
    except ConfigError as err:
        raise InvalidArgument(str(err)) from None


def dump(cfg: BaseModel) -> dict[str, Any]:
    """The validated config as JSON-able data (what the trainer writes to config.yaml)."""
    return cfg.model_dump(mode="json")


def families_accepting(data: dict[str, Any]) -> list[str]:
    """Families whose config model (when importable) validates ``data``."""
    out = []
    for family in FAMILIES:
        try:
            validate_data(family, data)
        except LabError:
            continue
        out.append(family)
    return out
