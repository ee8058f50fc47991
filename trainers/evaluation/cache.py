"""Reusing one model's evaluation: the cache of per-model results (reasoning and math).

In the answer suites a model's numbers depend on that model alone (its weights), the settings
(seed, sampling, prompts, bootstrap ...) and the prompt set, so they can be reused: a sweep of
runs trained from one starting model evaluates that model once. The key hashes the three
(:func:`cache_key`); ``cache_dir`` (set by the lab to ``experiments/.lab/eval-cache``) holds one
JSON file per key with the per-prompt values, so a later evaluation still pairs its target with
the cached model prompt by prompt. Torch-free.

What is not in the key, on purpose: ``target``/``baseline`` (the model enters through its
fingerprint) and ``cache_dir`` itself. Caveat: a local model's fingerprint is its config and the
size and mtime of its weight files; rewriting the weights in place with the same size within the
same second would not be noticed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from trainers.evaluation.config import EvalConfig

# 2: proportions carry Wilson intervals (format 1 held bootstrap points such as [0, 0])
CACHE_FORMAT = 2
NOT_IN_SETTINGS = frozenset({"target", "baseline", "cache_dir"})


def settings_of(cfg: EvalConfig) -> dict[str, Any]:
    """What the numbers depend on besides the models: the config without the models and the
    cache folder."""
    return cfg.model_dump(mode="json", exclude=set(NOT_IN_SETTINGS))


def cache_key(fingerprint: str, settings: dict[str, Any], prompt_set: str | None) -> str:
    blob = json.dumps(
        {"model": fingerprint, "settings": settings, "prompts": prompt_set}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def model_key(cfg: EvalConfig, fingerprint: str, prompt_set: str | None) -> str:
    """The key of one model's result in an answer suite (no judge enters it)."""
    return cache_key(fingerprint, {**settings_of(cfg), "judge": None}, prompt_set)


def _path(cache_dir: str, key: str) -> Path:
    return Path(cache_dir).expanduser() / f"{key}.json"


def load(cache_dir: str | None, key: str | None) -> dict[str, Any] | None:
    """The cached entry under ``key``, or None (no cache, no entry, or an unreadable one)."""
    if not cache_dir or not key:
        return None
    try:
        entry = json.loads(_path(cache_dir, key).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT:
        return None
    return entry


def store(cache_dir: str | None, key: str | None, entry: dict[str, Any]) -> None:
    """Write ``entry`` under ``key`` atomically (a reader never sees half a file)."""
    if not cache_dir or not key:
        return
    path = _path(cache_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({**entry, "format": CACHE_FORMAT, "key": key}))
    os.replace(tmp, path)
