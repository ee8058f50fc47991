"""A campaign's summary read from its ``ledger.json`` with the standard library alone: the same
``Campaign`` JSON that :func:`rlhf_lab.ledger.list_campaigns` builds with pydantic, for the fast
path of `campaign list` when the run index does not hold that summary yet (a fresh clone, a
ledger written by hand or by another checkout, a campaign changed within the racy window).
Without it, one such campaign sent the whole listing down the typer path, which imports typer,
pydantic and the ledger package (about a second of a cold process on a busy machine).

It declines (returns None, and the ledger's own reader answers) whenever it is not sure to give
what pydantic gives: no ``ledger.json`` (a campaign known only by its markdown), a file that is
not valid JSON, a setting or a run field of an unexpected type. The run rows are not validated,
as the ledger's light reader does not validate them either: only their state, family, model,
dataset and seed are read. tests/lab/test_campaign_summary.py compares both readers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlhf_lab.paths import experiments_dir

__all__ = ["ACTIVE_STATES", "FRONT_RE", "MANUAL_STATUSES", "plain_summary"]

# rlhf_lab.ledger.schema.MANUAL_STATUSES, trainers.core.runfolder.ACTIVE_STATES and the front
# matter pattern of rlhf_lab.ledger.render, spelled out because those modules cost pydantic
# (tests/lab/test_campaign_summary.py keeps them equal)
MANUAL_STATUSES = frozenset({"concluded", "abandoned", "archived", "paused"})
ACTIVE_STATES = frozenset({"queued", "starting", "running"})
FRONT_RE = re.compile(r"---\r?\n(.*?\r?\n)?---(?:\r?\n|\Z)", re.S)
_HEAD_CHARS = 16384  # how much of the markdown holds its front matter (as the ledger reads it)
_REQUIRED = ("id", "slug", "date", "question")
_OPTIONAL = ("family", "model", "dataset")


def _settings(raw: Any) -> dict[str, Any] | None:
    """The campaign's settings when pydantic would take them unchanged, else None."""
    if not isinstance(raw, dict):
        return None
    if not all(isinstance(raw.get(k), str) for k in _REQUIRED):
        return None
    if not all(raw.get(k) is None or isinstance(raw[k], str) for k in _OPTIONAL):
        return None
    seeds = raw.get("seeds")
    if seeds is not None and not (isinstance(seeds, list) and all(type(s) is int for s in seeds)):
        return None
    if not isinstance(raw.get("created_at", ""), str):
        return None
    return raw


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _briefs(rows: Any) -> list[tuple[str, Any, Any, Any, int | None]] | None:
    """(state, family, model, dataset, seed) of each run row; None when a field is not what the
    summary can hold (pydantic would refuse it)."""
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        texts = (row.get("family"), row.get("model"), row.get("dataset"))
        if not all(v is None or isinstance(v, str) for v in texts):
            return None
        out.append((str(row.get("state", "unknown")), *texts, _int_or_none(row.get("seed"))))
    return out


def _distinct(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(v for v in values if v not in (None, "")))


def _scalar_or_list(explicit: Any, derived: list[Any]) -> Any:
    if explicit not in (None, "", []):
        return explicit
    if not derived:
        return None
    return derived[0] if len(derived) == 1 else derived


def _run_status(states: Iterable[str]) -> str:
    if not states:
        return "planned"
    if any(s in ACTIVE_STATES for s in states):
        return "running"
    if any(s == "succeeded" for s in states):
        return "completed"
    return "failed"


def manual_status(md_path: Path) -> str | None:
    """The status set by hand in the markdown's front matter (concluded, paused, ...), if any.
    YAML is parsed only when the front matter could hold one: it names one of those words, or
    has a backslash (a double-quoted escape could spell one)."""
    try:
        with open(md_path, errors="replace") as fh:
            head = fh.read(_HEAD_CHARS)
    except OSError:
        return None
    match = FRONT_RE.match(head)
    if not match:
        return None
    front = match.group(1) or ""
    if "\\" not in front and not any(word in front for word in MANUAL_STATUSES):
        return None
    import yaml

    try:
        data = yaml.load(front, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        data = {}
    status = str((data if isinstance(data, dict) else {}).get("status", ""))
    return status if status in MANUAL_STATUSES else None


def _summary(meta: dict[str, Any], briefs: list[tuple], status: str | None) -> dict[str, Any]:
    root = experiments_dir()
    columns = list(zip(*briefs, strict=True)) if briefs else [()] * 5
    states, families, models, datasets, seeds = columns
    return {
        "id": meta["id"],
        "slug": meta["slug"],
        "date": meta["date"],
        "status": status or _run_status(states),
        "question": meta["question"],
        "family": _scalar_or_list(meta.get("family"), _distinct(families)),
        "model": _scalar_or_list(meta.get("model"), _distinct(models)),
        "dataset": _scalar_or_list(meta.get("dataset"), _distinct(datasets)),
        "seeds": [int(s) for s in _distinct(seeds) or meta.get("seeds") or []],
        "path": str(root / f"{meta['id']}.md"),
        "asset_dir": str(root / meta["id"]),
        "runs": len(briefs),
        "created": False,
        "warnings": [],
    }


def plain_summary(name: str) -> str | None:
    """Campaign ``name``'s summary as pydantic's compact JSON, or None when only the ledger's
    own reader can be sure of it."""
    root = experiments_dir()
    try:
        raw = json.loads((root / name / "ledger.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    meta, briefs = _settings(raw.get("campaign")), _briefs(raw.get("runs", []))
    if meta is None or briefs is None:
        return None
    summary = _summary(meta, briefs, manual_status(root / f"{name}.md"))
    text = json.dumps(summary, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: pydantic's own error, not ours to guess
        return None
    return text
