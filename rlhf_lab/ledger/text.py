"""Small plain-text and YAML helpers of the ledger: one-line text, clipping, the first set value
of a run's config or of a row, and a tolerant YAML loader. Torch-free."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlhf_lab.errors import InvalidArgument
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = ["load_yaml"]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> dict:
    """A YAML mapping (libyaml's fast loader when present); LabError when unreadable."""
    try:
        data = yaml.load(path.read_text(errors="replace"), Loader=_YAML_LOADER)
    except (OSError, yaml.YAMLError) as err:
        raise InvalidArgument(
            f"{path.name} is not readable YAML ({type(err).__name__}: {err})"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path.name} does not hold a mapping")
    return data


def _first_set(get: Callable[[str], Any], keys: Sequence[str]) -> Any:
    """The first value ``get`` gives for ``keys`` that is set: not None, "" or []."""
    for key in keys:
        value = get(key)
        if value not in (None, "", []):
            return value
    return None


def _first(config: TrainerConfig | None, keys: Sequence[str]) -> Any:
    """The first value of dotted ``keys`` set in a run's config (None without a config)."""
    return _first_set(config.get, keys) if config is not None else None


def _first_in_row(row: dict[str, Any], keys: Sequence[str]) -> Any:
    """The first value of ``keys`` set in a row of a run's JSON lines (e.g. a sample)."""
    return _first_set(row.get, keys)


def _one_line(value: Any, limit: int = 400) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
