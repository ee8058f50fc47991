"""Opening a dataset named in a config: a local data file, a local folder, or a Hugging Face hub
id, with one clear error when a path is missing or the hub cannot be reached (the families add a
hint naming their offline built-in data).

Two readers: :func:`open_split` gives a ``datasets.Dataset`` (flat schemas: preference pairs,
demonstrations); :func:`read_rows` gives plain dicts and reads local JSON/JSONL with ``json``
(nested, ragged schemas such as PRM800K's, which the ``datasets`` JSON loader cannot cast).

``datasets`` is imported only when something is opened, so configs validate without it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "DATA_EXTENSIONS",
    "DatasetNotFoundError",
    "hub_dataset_error",
    "is_hub_error",
    "looks_like_path",
    "open_split",
    "read_json_rows",
    "read_rows",
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


def missing_path_error(dataset: str, path: Path, hint: str) -> DatasetNotFoundError:
    """The error for a local dataset path that does not exist (``hint`` says what to use)."""
    return DatasetNotFoundError(
        f"dataset path {dataset!r} does not exist (resolved to {str(path.absolute())!r}). " + hint
    )


def unsupported_file_error(path: Path) -> ValueError:
    """The error for a data file whose suffix no reader handles."""
    return ValueError(
        f"unsupported data file {str(path)!r}: expected one of {sorted(DATA_EXTENSIONS)}"
    )


def open_split(dataset: str, split: str, hint: str) -> Any:
    """``dataset`` as a ``datasets.Dataset``: a data file (its only split), a folder's or a hub
    dataset's ``split``. A missing path or an unreachable hub raises DatasetNotFoundError ending
    with ``hint``; an unsupported file type raises ValueError."""
    import datasets

    path = Path(dataset).expanduser()
    if path.is_file():
        builder = DATA_EXTENSIONS.get(path.suffix.lower())
        if builder is None:
            raise unsupported_file_error(path)
        return datasets.load_dataset(builder, data_files={"train": str(path)}, split="train")
    if path.is_dir():
        return datasets.load_dataset(str(path), split=split)
    if looks_like_path(dataset):
        raise missing_path_error(dataset, path, hint)
    return load_hub_split(dataset, split, hint)


def load_hub_split(dataset: str, split: str, hint: str) -> Any:
    """``datasets.load_dataset(dataset, split=split)`` for a hub id; a hub or connection failure
    becomes :class:`DatasetNotFoundError` ending with ``hint``, any other error passes through."""
    import datasets

    try:
        return datasets.load_dataset(dataset, split=split)
    except Exception as err:  # only hub / connection failures become ours
        if is_hub_error(err):
            raise hub_dataset_error(dataset, err, hint) from err
        raise


def _json_lines(path: Path, text: str) -> list[Any]:
    """One JSON value per non-blank line; a bad line raises ValueError naming its number."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err})") from None
    return rows


def read_json_rows(path: Path) -> list[dict]:
    """Rows of a ``.jsonl`` file, or of a ``.json`` file holding a list (a ``.json`` file that is
    not a list is read as JSON lines). Every row must be a JSON object."""
    text = path.read_text()
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = _json_lines(path, text)
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every row must be a JSON object")
    return rows


def read_rows(dataset: str, split: str, hint: str) -> list[dict]:
    """Every row of a local file or folder, or of a hub dataset's ``split``, as dicts.

    JSON and JSONL files are read with :func:`read_json_rows`; parquet/csv files, folders and
    hub ids with ``datasets``. Errors are those of :func:`open_split`.
    """
    path = Path(dataset).expanduser()
    if path.is_file() and path.suffix.lower() in (".json", ".jsonl"):
        return read_json_rows(path)
    return list(open_split(dataset, split, hint))
