"""What data a config names, and whether this machine has it: a built-in offline set
(``builtin...``), a local file or folder, a hub dataset in the local Hugging Face cache, or a hub
dataset that only a download could provide. Torch-free, nothing is downloaded or opened.

Two rules use it:

* :func:`check_data_files` (plan, shrink and launch, ``--queue`` included, through
  :func:`rlhf_lab.planning.validation.check_config`): a local data file that does not exist is refused
  before anything is written, instead of failing when the run's turn comes;
* :func:`offline_data_rules` (the shrink of a pretrained model): a hub dataset that is not in the
  local cache is replaced by the family's built-in set, said in a note, or refused with the exact
  override to use when the family has no built-in equivalent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from rlhf_lab.errors import InvalidArgument, NextStep, NotFound
from rlhf_lab.planning.catalog import family_info
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "DATA_KEYS",
    "builtin_equivalent",
    "check_data_files",
    "dataset_kind",
    "hub_dataset_cached",
    "offline_data_rules",
]

DATA_KEYS: tuple[str, ...] = ("data.dataset", "data.test_dataset")
"""Config keys that name a data set (a hub id, a local file or folder, or a built-in set)."""

BUILTIN_PROMPTS = "builtin"
"""The offline prompts of the built-in preference pairs (``data.source=preference`` of the
policy-gradient and distillation trainers)."""

DatasetKind = Literal["builtin", "local", "hub", "run"]


def dataset_kind(value: Any) -> DatasetKind | None:
    """How a dataset value is read: ``builtin`` (offline, generated), ``local`` (a path: a data
    file or a folder), ``hub`` (a Hugging Face id), ``run`` (``run:<id>``); None for no value."""
    from rlhf_lab.runs.lineage import is_ref
    from trainers.core.datasets import looks_like_path

    if not isinstance(value, str) or not value.strip():
        return None
    if value == BUILTIN_PROMPTS or value.startswith("builtin:"):
        return "builtin"
    if is_ref(value):
        return "run"
    if looks_like_path(value) or Path(value).expanduser().exists():
        return "local"
    return "hub"


def _hf_home() -> Path:
    home = os.environ.get("HF_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface"


def _datasets_cache() -> Path:
    cache = os.environ.get("HF_DATASETS_CACHE")
    return Path(cache).expanduser() if cache else _hf_home() / "datasets"


def _hub_cache() -> Path:
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(cache).expanduser() if cache else _hf_home() / "hub"


def _non_empty(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def hub_dataset_cached(hub_id: str) -> bool:
    """Whether the local Hugging Face caches hold ``hub_id`` (``datasets``' prepared copy,
    ``<org>___<name>``, or the hub's snapshot, ``datasets--<org>--<name>/snapshots``). Read from
    the environment at each call (``HF_HOME``, ``HF_DATASETS_CACHE``, ``HF_HUB_CACHE``)."""
    prepared = _datasets_cache() / hub_id.replace("/", "___")
    snapshot = _hub_cache() / f"datasets--{hub_id.replace('/', '--')}" / "snapshots"
    return _non_empty(prepared) or _non_empty(snapshot)


def builtin_equivalent(config: TrainerConfig, algorithm: str, key: str) -> Any:
    """The offline value to use for ``key`` instead of an uncached hub dataset: the family's
    built-in set (per algorithm where it has several), ``builtin`` for preference prompts, null
    for a separate held-out file (fresh built-in questions); ``""`` when there is none."""
    if key == "data.test_dataset":
        return None
    table = family_info(config.family).builtin_datasets
    found = table.get(algorithm) or table.get("*")
    if found:
        return found
    if config.get("data.source") == "preference":
        return BUILTIN_PROMPTS
    return ""


def _no_equivalent(config: TrainerConfig, algorithm: str, key: str, value: str):
    """The refusal of an uncached hub dataset the family has no offline set for, naming the
    override to use instead."""
    family = config.family
    if config.get("data.source") is not None:  # a family that also reads reasoning-gym
        override = ["data.source=reasoning_gym", f"{key}=null"]
        what = "reasoning-gym questions generated offline"
    else:
        override = [f"{key}=/path/to/data.jsonl"]
        what = "a local data file in the recipe's schema"
    return InvalidArgument(
        f"{key}={value!r} is a hub dataset that is not in the local Hugging Face cache, and "
        f"{family} ({algorithm}) has no built-in offline equivalent: use "
        f"the override{'s' if len(override) > 1 else ''} {' '.join(override)} ({what}), or copy the dataset's cache here",
        next=NextStep("shrink_config", {"overrides": override}, note=what),
    )


def offline_data_rules(
    rules: Any, family: str, algorithm: str, user_keys: set[str], notes: list[str]
) -> None:
    """The shrink's offline-data rule on ``rules`` (``rlhf_lab.planning.shrink._Rules``): each hub dataset
    that is not cached becomes the family's built-in set, said in ``notes``; refused (a
    :class:`~rlhf_lab.errors.LabError`) where there is no built-in one. A key the user set
    (``user_keys``) is kept as given, with a note when the run would have to download it."""
    for key in DATA_KEYS:
        value = rules.get(key)
        if dataset_kind(value) != "hub" or hub_dataset_cached(value):
            continue
        if key in user_keys:
            notes.append(
                f"{key}={value} (yours) is not in the local Hugging Face cache: the run "
                "downloads it, and fails where the hub cannot be reached"
            )
            continue
        offline = builtin_equivalent(rules.base, algorithm, key)
        if offline == "":
            raise _no_equivalent(rules.base, algorithm, key, value)
        rules.set(key, offline)
        shown = "null (fresh built-in questions)" if offline is None else offline
        notes.append(
            f"{key}: {value} is not in the local Hugging Face cache, so the shrink uses the "
            f"built-in offline set {shown}; the override {key}={value} keeps the hub dataset (it "
            "needs the hub or a cached copy)"
        )


def _missing_path(value: str) -> Path | None:
    """The resolved path of a local dataset value that does not exist (None when it does)."""
    path = Path(value).expanduser()
    return None if path.exists() else path


def check_data_files(config: TrainerConfig) -> None:
    """Refuse (NotFound) a config whose local data file or folder does not exist, naming the key,
    the path as resolved and the offline set to use instead. Built-in sets, hub ids and
    ``run:<id>`` values are not checked here."""
    for key in DATA_KEYS:
        value = config.get(key)
        if dataset_kind(value) != "local":
            continue
        missing = _missing_path(value)
        if missing is None:
            continue
        offline = builtin_equivalent(config, _algorithm_of(config), key)
        instead = f"{key}={'null' if offline is None else offline}" if offline != "" else None
        hint = f", or the built-in offline set: the override {instead}" if instead else ""
        raise NotFound(
            f"{key}={value!r}: no such file or folder (resolved to {missing.absolute()}). Pass "
            f"an existing .jsonl/.json/.parquet/.csv file or folder{hint}",
            next=NextStep(
                "shrink_config",
                {"overrides": [instead] if instead else []},
                note="the built-in offline data" if instead else "with an existing data file",
            ),
        )


def _algorithm_of(config: TrainerConfig) -> str:
    """The algorithm a validated config names where its family's spec's algorithm field is a
    plain value (reward models' ``kind``); "" otherwise (the family's ``*`` set applies)."""
    from trainers.core.spec import FAMILY_NAMES, family_spec

    if config.family not in FAMILY_NAMES:
        return ""
    field_name = family_spec(config.family).algorithm_field
    value = config.get(field_name) if field_name else None
    return value if isinstance(value, str) else ""
