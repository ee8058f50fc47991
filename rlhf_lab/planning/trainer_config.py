"""A resolved trainer config as one read-only value: :class:`TrainerConfig`.

Built once where a config is resolved and validated (:func:`rlhf_lab.planning.configs.resolve_config`,
the shrink), or where a config the lab wrote after validating it is read back (a run's
``config.yaml``: :func:`read_run_config`), and handed to everything that reads it (memory, time,
steps, calibration, checks, the results) instead of a plain ``dict``: no lab function takes a
config as a mapping. It holds the family, the values (read by dotted key with :meth:`TrainerConfig.get`), the family's validated
pydantic model (:attr:`TrainerConfig.model`, validated on first use when the view was built from
data the lab validated before), and gives the plain data only to write it out
(:meth:`TrainerConfig.to_data`, :meth:`TrainerConfig.to_yaml`). Nothing reads or changes the
values it holds but through it (the view does not copy the data it is built on). Torch-free.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rlhf_lab.planning.catalog import get_dotted
from rlhf_lab.planning.config_models import dump, validate_data

__all__ = [
    "EVALUATION",
    "TrainerConfig",
    "config_leaf",
    "find_key",
    "read_run_config",
]

EVALUATION = "evaluation"
"""The "family" of an evaluation job's config (``trainers.evaluation.config.EvalConfig``)."""

_MISSING = object()


def find_key(data: Mapping[str, Any], leaf: str, prefix: str = "") -> str | None:
    """Dotted path of the first leaf named ``leaf`` (for families whose layout varies): this
    level first, then each section in order."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if key == leaf and not isinstance(value, dict):
            return dotted
    for key, value in data.items():
        if isinstance(value, dict):
            found = find_key(value, leaf, f"{prefix}{key}.")
            if found:
                return found
    return None


def _leaves(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(_leaves(value, f"{dotted}."))
        else:
            out.append((dotted, value))
    return out


def config_leaf(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """A value stored under ``key`` anywhere in the data (families whose layout varies): this
    level first, then each section depth-first; a null counts as absent."""
    if key in data and not isinstance(data[key], dict):
        return data[key] if data[key] is not None else default
    for value in data.values():
        if isinstance(value, dict):
            found = config_leaf(value, key, None)
            if found is not None:
                return found
    return default


class TrainerConfig:
    """A resolved, validated trainer config of one family, read-only."""

    __slots__ = ("_data", "_model", "family")

    def __init__(self, family: str, data: Mapping[str, Any], model: BaseModel | None = None):
        self.family = family
        # a view: the data is not copied (a run's whole config, read per run by the index);
        # whoever builds one hands the data over and reads it only through the view from then on
        self._data: dict[str, Any] = data if isinstance(data, dict) else dict(data)
        self._model = model

    @classmethod
    def validated(cls, family: str, model: BaseModel) -> TrainerConfig:
        """The view of a config the family's model has just validated (its JSON dump)."""
        return cls(family, dump(model), model)

    @property
    def model(self) -> BaseModel:
        """The family's validated pydantic config (validated now when the view was built from
        data: a LabError if it does not validate)."""
        if self._model is None:
            self._model = _validate(self.family, self._data)
        return self._model

    def get(self, key: str, default: Any = None) -> Any:
        """The value at dotted ``key`` (``train.learning_rate``), ``default`` when any part is
        missing; a list or a section comes back as a copy."""
        value = get_dotted(self._data, key, default)
        return copy.deepcopy(value) if isinstance(value, (dict, list)) else value

    def find_key(self, leaf: str) -> str | None:
        """The dotted key of the first value named ``leaf`` (:func:`find_key`)."""
        return find_key(self._data, leaf)

    def leaf(self, key: str, default: Any = None) -> Any:
        """A value named ``key`` anywhere in the config, ``default`` when absent or null
        (:func:`config_leaf`)."""
        value = config_leaf(self._data, key, default)
        return copy.deepcopy(value) if isinstance(value, (dict, list)) else value

    def leaves(self) -> list[tuple[str, Any]]:
        """(dotted key, value) of every value that is not a section, in order."""
        return _leaves(self._data)

    def has(self, key: str) -> bool:
        """Whether the config holds dotted ``key`` (its value may be None)."""
        return get_dotted(self._data, key, _MISSING) is not _MISSING

    def to_data(self) -> dict[str, Any]:
        """The plain data (a copy), for writing the config out or handing it to a trainer-side
        function that reads a mapping."""
        return copy.deepcopy(self._data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self._data, sort_keys=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TrainerConfig):
            return NotImplemented
        return self.family == other.family and self._data == other._data

    def __hash__(self) -> int:  # a value with mutable insides: equal, never hashed
        raise TypeError("TrainerConfig is not hashable")

    def __repr__(self) -> str:
        return f"TrainerConfig({self.family!r}, model={self.get('model.name')!r})"


def _validate(family: str, data: dict[str, Any]) -> BaseModel:
    if family != EVALUATION:
        return validate_data(family, data)
    from trainers.evaluation.config import EvalConfig

    return EvalConfig.model_validate(data)


def read_run_config(run_dir: Path, family: str | None = None) -> TrainerConfig | None:
    """A run folder's ``config.yaml`` as the view (the lab validated it before writing it: its
    model is validated again only on first use), None when it is missing, unreadable or not a
    mapping: the one reader of a run's config for the whole lab (libyaml's safe loader when
    present: the run index reads every run's config)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load((Path(run_dir) / "config.yaml").read_text(errors="replace"), Loader=loader)
    except (OSError, yaml.YAMLError):
        return None
    return TrainerConfig(family or "", data) if isinstance(data, dict) else None
