"""Opening a dataset named in a config: a local data file, a local folder, or a Hugging Face hub
id, with one clear error when a path is missing or the hub cannot be reached (the families add a
hint naming their offline built-in data).

``datasets`` is imported only when something is opened, so configs validate without it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "DATA_EXTENSIONS",
    "DatasetNotFoundError",
    "hub_dataset_error",
    "is_hub_error",
    "looks_like_path",
    "open_split",
]

DATA_EXTENSIONS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
"""Data-file suffix -> the ``datasets`` builder that reads it."""


class DatasetNotFoundError(ValueError):
    """A local dataset path does not exist, or a hub dataset cannot be reached."""


def looks_like_path(name: str) -> bool:
    """True for strings meant as local paths rather than hub ids (``org/name``).

    A hub id has at most one ``/`` and no data-file extension; anything starting with ``/``, ``.``
    or ``~``, containing a backslash or several ``/``, or ending in a data extension is a path.
    """
    if Path(name).suffix.lower() in DATA_EXTENSIONS:
        return True
    if name.startswith(("/", ".", "~")) or "\\" in name:
        return True
    return name.count("/") > 1


def is_hub_error(err: BaseException) -> bool:
    """Whether ``err`` means the hub (or its cache) could not provide the dataset: connection
    and offline-mode errors, the hub's not-found error, or any OSError on the way."""
    if isinstance(err, ConnectionError | TimeoutError | OSError):
        return True
    try:
        from datasets.exceptions import DatasetNotFoundError as HubDatasetNotFound
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    except ImportError:  # pragma: no cover - other library versions
        return False
    return isinstance(err, HubDatasetNotFound | HfHubHTTPError | OfflineModeIsEnabled)


def hub_dataset_error(dataset: str, err: BaseException, hint: str) -> DatasetNotFoundError:
    """The error for a hub dataset that could not be loaded, saying whether offline mode is on."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
    why = "HF_HUB_OFFLINE is set" if offline else "the hub is unreachable or has no such dataset"
    return DatasetNotFoundError(
        f"could not load dataset {dataset!r} from the Hugging Face Hub or its local cache "
        f"({why}; {type(err).__name__}: {err}). If you meant a local path, it does not exist. "
        + hint
    )


def open_split(dataset: str, split: str, hint: str):
    """``dataset`` as a ``datasets.Dataset``: a data file (its only split), a folder's or a hub
    dataset's ``split``. A missing path or an unreachable hub raises DatasetNotFoundError ending
    with ``hint``; an unsupported file type raises ValueError."""
    import datasets

    path = Path(dataset).expanduser()
    if path.is_file():
        builder = DATA_EXTENSIONS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"unsupported data file {str(path)!r}: expected one of {sorted(DATA_EXTENSIONS)}"
            )
        return datasets.load_dataset(builder, data_files={"train": str(path)}, split="train")
    if path.is_dir():
        return datasets.load_dataset(str(path), split=split)
    if looks_like_path(dataset):
        raise DatasetNotFoundError(
            f"dataset path {dataset!r} does not exist (resolved to {str(path.absolute())!r}). "
            + hint
        )
    try:
        return datasets.load_dataset(dataset, split=split)
    except Exception as err:  # only hub / connection failures become ours
        if is_hub_error(err):
            raise hub_dataset_error(dataset, err, hint) from err
        raise
