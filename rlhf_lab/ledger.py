"""Campaign ledgers: dated markdown files that record what each run did (DESIGN.md §4).

A campaign is one question. It owns ``experiments/YYYY-MM-DD-<slug>.md`` (the ledger a person
reads) and ``experiments/YYYY-MM-DD-<slug>/`` (``runs/``, ``plots/``, ``ledger.json``, helper
scripts). ``ledger.json`` holds the campaign's data (its settings, one record per run, recorded
comparisons); the markdown is rendered from it.

Ownership of the markdown: the YAML front matter and the blocks between
``<!-- rlhf-lab:begin NAME -->`` and ``<!-- rlhf-lab:end NAME -->`` (NAME = setup, runs, plots,
comparison, observations-auto) belong to the lab and are regenerated on every write; every byte
outside them (the Goal text, notes, the Next section) is kept as it is. Keys a person adds to the
front matter are kept, and so is a status set by hand to one of ``MANUAL_STATUSES``.

Writers hold a file lock (``.YYYY-MM-DD-<slug>.md.lock`` beside the markdown) while they read,
update and replace ``ledger.json`` and the markdown; both are replaced atomically, so readers never
see half a file. ``experiments/README.md`` is the index of campaigns, regenerated the same way.

Everything here is torch-free; every public function returns pydantic models.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import math
import os
import re
import shlex
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from filelock import FileLock
from filelock import Timeout as LockTimeout
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlhf_lab.catalog import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.paths import (
    LabError,
    check_run_id,
    check_slug,
    experiments_dir,
    find_run,
    repo_root,
    today,
)
from rlhf_lab.plots import EVAL_PREFIX, as_float, plot_run_metrics
from trainers.core.config import config_diff
from trainers.core.rundir import atomic_write_text

__all__ = [
    "BLOCKS",
    "MANUAL_STATUSES",
    "FAMILIES",
    "FAMILY_METRICS",
    "Campaign",
    "CampaignView",
    "ComparisonEntry",
    "ConfigChange",
    "MetricSummary",
    "RunRecord",
    "SampleExcerpt",
    "check_campaign_slug",
    "check_run_id",
    "create_campaign",
    "find_run",
    "inspect_run",
    "list_campaigns",
    "load_yaml",
    "metric_direction",
    "read_metric_rows",
    "record_comparison",
    "record_run",
    "regenerate_index",
    "render_campaign",
    "resolve_campaign",
    "show_campaign",
    "summarize_metrics",
    "summarize_performance",
]

FAMILIES: tuple[str, ...] = tuple(CATALOG_FAMILIES)

# Key metrics per family (ALGORITHMS.md). A bare name covers the training metric and its held-out
# `eval/` twin; a name given with the prefix is held-out only.
FAMILY_METRICS: dict[str, tuple[str, ...]] = {
    "policy_gradients": (
        "avg_correctness",
        "avg_format",
        "avg_binary",
        "loss",
        "frac_reward_zero_std",
    ),
    "direct_alignment": ("accuracy", "margins", "chosen_rewards", "rejected_rewards"),
    "reward_models": (
        "accuracy",
        "reward_margin",
        "eval/auroc",
        "eval/ranking_accuracy",
        "eval/step_accuracy",
        "eval/majority_baseline",
    ),
    "sft": ("loss", "mean_token_accuracy"),
    "rejection_sampling": (
        "loss",
        "sft/loss",
        "eval/exact_match",
        "eval/accuracy",
        "test_accuracy",
    ),
}

# The config model of each family (torch-free module trainers/<family>/config.py).
_CONFIG_CLASSES: dict[str, str] = {
    "direct_alignment": "DirectAlignmentConfig",
    "policy_gradients": "PolicyGradientConfig",
    "reward_models": "RewardModelConfig",
    "sft": "SFTConfig",
}

BLOCKS: tuple[str, ...] = ("setup", "runs", "plots", "comparison", "observations-auto")
_BLOCK_HEADINGS = {
    "setup": "Setup",
    "runs": "Runs",
    "plots": "Plots",
    "comparison": "Comparison",
    "observations-auto": "Observations",
}
ACTIVE_STATES = frozenset({"queued", "starting", "running"})
TERMINAL_STATES = frozenset({"succeeded", "failed", "stopped", "died"})
MANUAL_STATUSES = frozenset({"concluded", "abandoned", "archived", "paused"})

_CAMPAIGN_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z0-9]+(?:-[a-z0-9]+)*)$")
_FAMILY_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
LOCK_TIMEOUT_S = 120.0
_SAMPLES_SHOWN = 2
_PROMPT_CHARS = 300
_COMPLETION_CHARS = 600
_HIGHER_BETTER = frozenset(
    {
        "accuracy",
        "margins",
        "chosen_rewards",
        "avg_correctness",
        "avg_format",
        "avg_binary",
        "avg_total",
        "reward_margin",
        "auroc",
        "ranking_accuracy",
        "step_accuracy",
        "mean_token_accuracy",
        "exact_match",
    }
)
_LOWER_BETTER = frozenset({"loss", "frac_reward_zero_std"})

# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


class _Model(BaseModel):
    """Base of the ledger's models: NaN/inf survive a JSON round trip (as "NaN"/"Infinity")."""

    model_config = ConfigDict(ser_json_inf_nan="strings")


class MetricSummary(_Model):
    """Final and best value of one metric over a run (best only where a direction is clear)."""

    name: str
    final: float | None = None
    final_step: int | None = None
    best: float | None = None
    best_step: int | None = None
    direction: Literal["max", "min"] | None = None


class ConfigChange(_Model):
    """A config value that differs from the shipped default YAML (dotted key)."""

    key: str
    shipped: Any = None
    used: Any = None


class SampleExcerpt(_Model):
    step: int | None = None
    prompt: str = ""
    completion: str = ""
    scores: dict[str, float] = Field(default_factory=dict)


class RunRecord(_Model):
    """One run's row in a campaign ledger, built from its run folder."""

    run_id: str
    campaign: str
    family: str | None = None
    algorithm: str | None = None
    state: str = "unknown"
    outcome: str | None = Field(default=None, description="summary.json outcome")
    failure: str | None = Field(default=None, description="failure mode (error, signal, ...)")
    command: str | None = Field(default=None, description="exact command (shlex-joined argv)")
    argv: list[str] = Field(default_factory=list)
    overrides: list[str] = Field(default_factory=list)
    model: str | None = None
    dataset: str | None = None
    seed: int | None = None
    config_source: str | None = Field(default=None, description="the shipped YAML it started from")
    config_file: str | None = Field(default=None, description="the run's resolved config.yaml")
    changes: list[ConfigChange] = Field(default_factory=list)
    metrics: list[MetricSummary] = Field(default_factory=list)
    performance: dict[str, float] = Field(
        default_factory=dict,
        description="median throughput/tokens_per_s, max memory/peak_gb, median timing/* (s)",
    )
    steps: int | None = None
    total_steps: int | None = None
    wall_time_s: float | None = None
    wandb_url: str | None = None
    note: str | None = None
    samples: list[SampleExcerpt] = Field(default_factory=list)
    plot: str | None = Field(default=None, description="PNG path relative to experiments/")
    diagnostics: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    run_dir: str = ""
    recorded_at: str = ""

    def metric(self, name: str) -> MetricSummary | None:
        return next((m for m in self.metrics if m.name == name), None)


class ComparisonEntry(_Model):
    """A comparison table recorded into a campaign's Comparison section."""

    key: str = Field(description="identifies the compared set; recording it again replaces it")
    title: str
    family: str
    run_ids: list[str]
    markdown: str
    recorded_at: str = ""


class Campaign(_Model):
    id: str = Field(description="YYYY-MM-DD-<slug>, the markdown file's stem")
    slug: str
    date: str
    status: str
    question: str
    family: str | list[str] | None = None
    model: str | list[str] | None = None
    dataset: str | list[str] | None = None
    seeds: list[int] = Field(default_factory=list)
    path: str = Field(description="the markdown ledger")
    asset_dir: str = Field(description="runs/, plots/, ledger.json")
    runs: int = 0
    created: bool = Field(default=False, description="True when this call created it")
    warnings: list[str] = Field(default_factory=list)


class CampaignView(_Model):
    campaign: Campaign
    markdown: str
    runs: list[RunRecord]
    comparisons: list[ComparisonEntry] = Field(default_factory=list)


class _CampaignMeta(_Model):
    id: str
    slug: str
    date: str
    question: str
    family: str | None = None
    model: str | None = None
    dataset: str | None = None
    seeds: list[int] | None = None
    created_at: str = ""


class _LedgerData(_Model):
    version: int = 1
    campaign: _CampaignMeta
    runs: list[RunRecord] = Field(default_factory=list)
    comparisons: list[ComparisonEntry] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Names and paths
# ---------------------------------------------------------------------------------------------


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_campaign_slug(slug: str) -> str:
    """paths.check_slug, plus a whole-string match (its pattern lets a trailing newline through)."""
    return check_slug(slug)


def _check_campaign_name(name: str) -> tuple[str, str]:
    m = _CAMPAIGN_RE.fullmatch(name) if isinstance(name, str) else None
    if not m:
        raise LabError(f"bad campaign name {name!r}: expected YYYY-MM-DD-<slug>")
    return m.group(1), m.group(2)


def _md_path(name: str) -> Path:
    return experiments_dir() / f"{name}.md"


def _asset_dir(name: str) -> Path:
    return experiments_dir() / name


def _data_path(name: str) -> Path:
    return _asset_dir(name) / "ledger.json"


def _lock(name: str) -> FileLock:
    return FileLock(str(experiments_dir() / f".{name}.md.lock"), timeout=LOCK_TIMEOUT_S)


def _exists(name: str) -> bool:
    return _md_path(name).is_file() or _data_path(name).is_file()


def resolve_campaign(slug: str) -> str:
    """The campaign name for ``slug``: 'YYYY-MM-DD-<slug>' as given, today's campaign with that
    slug, else the most recent one. Raises LabError when there is none."""
    check_campaign_slug(slug)
    if _CAMPAIGN_RE.fullmatch(slug):
        if _exists(slug):
            return slug
        raise LabError(
            f"no campaign {slug!r} under {experiments_dir()}; see `rlhf-lab campaign list`"
        )
    name = f"{today()}-{slug}"
    if _exists(name):
        return name
    found = sorted(
        {p.stem for p in experiments_dir().glob(f"*-{slug}.md")}
        | {p.parent.name for p in experiments_dir().glob(f"*-{slug}/ledger.json")}
    )
    found = [n for n in found if (m := _CAMPAIGN_RE.fullmatch(n)) and m.group(2) == slug]
    if not found:
        raise LabError(
            f"no campaign with slug {slug!r} under {experiments_dir()}; create it with "
            f"`rlhf-lab campaign new {slug} --question ...` or see `rlhf-lab campaign list`"
        )
    return found[-1]


# ---------------------------------------------------------------------------------------------
# Reading a run folder (tolerant: problems become warnings)
# ---------------------------------------------------------------------------------------------


def _read_json_file(path: Path, label: str, warnings: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError) as err:
        warnings.append(
            f"{label} is unreadable ({type(err).__name__}: {err}); its fields are left out"
        )
        return None
    if not isinstance(data, dict):
        warnings.append(f"{label} does not hold a JSON object; its fields are left out")
        return None
    return data


def _read_jsonl_file(path: Path, label: str, warnings: list[str]) -> list[dict]:
    if not path.exists():
        return []
    rows: list[dict] = []
    bad = 0
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(obj, dict):
                    rows.append(obj)
                else:
                    bad += 1
    except OSError as err:
        warnings.append(f"{label} is unreadable ({err}); left out")
        return []
    if bad:
        warnings.append(f"{label}: {bad} unreadable line(s) skipped (truncated or corrupt write)")
    return rows


def _tail_text(path: Path, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _last_error_line(log: str) -> str | None:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|error:|Killed|Traceback)", ln):
            return ln[:300]
    return lines[-1][:300] if lines else None


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> dict:
    """A YAML mapping (libyaml's fast loader when present); LabError when unreadable."""
    try:
        data = yaml.load(path.read_text(errors="replace"), Loader=_YAML_LOADER)
    except (OSError, yaml.YAMLError) as err:
        raise LabError(f"{path.name} is not readable YAML ({type(err).__name__}: {err})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LabError(f"{path.name} does not hold a mapping")
    return data


def _dig(data: dict | None, dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _first(data: dict | None, keys: Sequence[str]) -> Any:
    for key in keys:
        value = _dig(data, key)
        if value not in (None, "", []):
            return value
    return None


def _one_line(value: Any, limit: int = 400) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _dataset_of(cfg: dict | None) -> str | None:
    specs = _dig(cfg, "data.specs")
    if isinstance(specs, list) and specs:
        names = [str(s.get("name")) for s in specs if isinstance(s, dict) and s.get("name")]
        if names:
            return ", ".join(names)
    value = _first(cfg, ("data.dataset", "data.name", "data.task", "dataset", "task"))
    return None if value is None else _one_line(value, 200)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _metric_keys(family: str | None) -> tuple[str, ...]:
    if family in FAMILY_METRICS:
        return FAMILY_METRICS[family]
    merged: dict[str, None] = {}
    for keys in FAMILY_METRICS.values():
        merged.update(dict.fromkeys(keys))
    return tuple(merged)


def _expand_metric_names(keys: Iterable[str]) -> list[str]:
    out: dict[str, None] = {}
    for key in keys:
        if key.startswith(EVAL_PREFIX):
            out[key] = None
        else:
            out[key] = None
            out[EVAL_PREFIX + key] = None
    return list(out)


def metric_direction(name: str, family: str | None = None) -> Literal["max", "min"] | None:
    """Which way is better for ``name`` (None: no clear direction, e.g. rejected rewards, or a
    policy-gradient loss, which hovers near 0 whatever the policy does)."""
    base = name[len(EVAL_PREFIX) :] if name.startswith(EVAL_PREFIX) else name
    if family == "policy_gradients" and base == "loss":
        return None
    if base in _HIGHER_BETTER:
        return "max"
    if base in _LOWER_BETTER or base.endswith("loss"):
        return "min"
    return None


def summarize_metrics(
    rows: Sequence[dict],
    names: Sequence[str],
    summary: dict | None = None,
    family: str | None = None,
) -> list[MetricSummary]:
    """Final and best value of each metric in ``names`` over metrics.jsonl rows; a metric absent
    from the rows falls back to summary.json (final_metrics / final_eval / best_metrics)."""
    summary = summary or {}
    finals = {}
    for section in ("final_metrics", "final_eval"):
        if isinstance(summary.get(section), dict):
            finals.update(summary[section])
    bests = summary.get("best_metrics") if isinstance(summary.get("best_metrics"), dict) else {}
    out: list[MetricSummary] = []
    for name in names:
        is_eval = name.startswith(EVAL_PREFIX)
        points: list[tuple[int | None, float]] = []
        for row in rows:
            if name not in row:
                continue
            if not is_eval and row.get("phase") == "eval":
                continue
            value = as_float(row[name])
            if value is None:
                continue
            points.append((_int_or_none(row.get("step")), value))
        direction = metric_direction(name, family)
        if points:
            final_step, final = points[-1]
            best = best_step = None
            finite = [p for p in points if math.isfinite(p[1])]
            if direction and finite:
                pick = max if direction == "max" else min
                best_step, best = pick(finite, key=lambda p: p[1])
            if name in bests and as_float(bests[name]) is not None:
                best = as_float(bests[name]) if best is None else best
            out.append(
                MetricSummary(
                    name=name,
                    final=final,
                    final_step=final_step,
                    best=best,
                    best_step=best_step,
                    direction=direction,
                )
            )
        elif as_float(finals.get(name)) is not None or as_float(bests.get(name)) is not None:
            out.append(
                MetricSummary(
                    name=name,
                    final=as_float(finals.get(name)),
                    best=as_float(bests.get(name)),
                    direction=direction,
                )
            )
    return out


def summarize_performance(rows: Sequence[dict]) -> dict[str, float]:
    """Speed and memory of a run from its train rows: the median ``throughput/tokens_per_s``,
    the highest ``memory/peak_gb`` and the median seconds of each ``timing/*`` phase per step.
    The first train row is left out of the medians when there are others (it carries warm-up)."""
    train = [r for r in rows if r.get("phase", "train") == "train"]
    steady = train[1:] if len(train) > 1 else train
    out: dict[str, float] = {}

    def values(key: str, of: Sequence[dict]) -> list[float]:
        return [v for r in of if (v := as_float(r.get(key))) is not None and math.isfinite(v)]

    tokens = values("throughput/tokens_per_s", steady)
    if tokens:
        out["throughput/tokens_per_s"] = statistics.median(tokens)
    peaks = values("memory/peak_gb", train)
    if peaks:
        out["memory/peak_gb"] = max(peaks)
    phases = sorted({k for r in steady for k in r if k.startswith("timing/")})
    for key in phases:
        if found := values(key, steady):
            out[key] = statistics.median(found)
    return out


def _performance_text(perf: dict[str, float]) -> str | None:
    parts = []
    if "throughput/tokens_per_s" in perf:
        parts.append(f"{perf['throughput/tokens_per_s']:.0f} tokens/s (median)")
    if "memory/peak_gb" in perf:
        parts.append(f"peak memory {perf['memory/peak_gb']:.2f} GB")
    timing = [(k.removeprefix("timing/"), v) for k, v in perf.items() if k.startswith("timing/")]
    if timing:
        parts.append("per step: " + ", ".join(f"{name} {v:.3g} s" for name, v in timing))
    return "; ".join(parts) or None


def _resolve_source(source: str, cwd: str | None) -> Path | None:
    path = Path(source)
    candidates = [path] if path.is_absolute() else []
    if not path.is_absolute():
        if cwd:
            candidates.append(Path(cwd) / path)
        candidates += [repo_root() / path, Path(__file__).resolve().parent.parent / path]
    return next((c for c in candidates if c.is_file()), None)


def _config_model(family: str | None) -> type[BaseModel] | None:
    """The family's pydantic config class, imported lazily; None when unavailable."""
    if not family or not _FAMILY_RE.fullmatch(family):
        return None
    try:
        module = importlib.import_module(f"trainers.{family}.config")
    except Exception:  # a family still being written, or none at all
        return None
    name = _CONFIG_CLASSES.get(family)
    cls = getattr(module, name, None) if name else None
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return cls
    found = [
        obj
        for obj_name, obj in vars(module).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ == module.__name__
        and obj_name.endswith("Config")
    ]
    return found[0] if len(found) == 1 else None


def _config_changes(
    family: str | None, source: str | None, cwd: str | None, used: dict | None, warnings: list[str]
) -> list[ConfigChange]:
    if used is None or not source:
        return []
    path = _resolve_source(source, cwd)
    if path is None:
        warnings.append(f"shipped config {source} not found; changed values not computed")
        return []
    try:
        shipped = load_yaml(path)
    except LabError as err:
        warnings.append(f"shipped config unreadable: {err}")
        return []
    model = _config_model(family)
    if model is not None:
        try:
            shipped = model.model_validate(shipped).model_dump(mode="json")
        except ValidationError:
            warnings.append(
                f"shipped config {source} does not validate as {model.__name__}; "
                "changed values compare the raw YAML"
            )
    diff = config_diff(shipped, used)
    return [ConfigChange(key=k, shipped=a, used=b) for k, (a, b) in diff.items()]


def _sample_excerpts(rows: list[dict]) -> list[SampleExcerpt]:
    if not rows:
        return []
    last_step = rows[-1].get("step")
    picked = [r for r in rows if r.get("step") == last_step][:_SAMPLES_SHOWN]
    out = []
    for row in picked:
        prompt = row.get("prompt", "")
        if isinstance(prompt, list) and prompt:  # chat messages
            last = prompt[-1]
            prompt = last.get("content", "") if isinstance(last, dict) else last
        completion = _first(row, ("completion", "response", "text", "output")) or ""
        scores = {}
        for key, value in row.items():
            if key in ("step", "prompt", "completion") or isinstance(value, bool):
                continue
            number = as_float(value) if isinstance(value, int | float) else None
            if number is not None and len(scores) < 4:
                scores[key] = number
        out.append(
            SampleExcerpt(
                step=_int_or_none(row.get("step")),
                prompt=_one_line(prompt, _PROMPT_CHARS),
                completion=_clip(str(completion), _COMPLETION_CHARS),
                scores=scores,
            )
        )
    return out


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _diagnose(
    family: str | None, state: str, rows: list[dict], metrics: list[MetricSummary]
) -> list[str]:
    notes: list[str] = []
    for m in metrics:
        bad = [
            r.get("step")
            for r in rows
            if m.name in r and (v := as_float(r[m.name])) is not None and not math.isfinite(v)
        ]
        if bad:
            notes.append(f"{m.name} was not finite (nan/inf) from step {bad[0]} on")
    if state in TERMINAL_STATES and not rows:
        notes.append("no metrics were logged")
    zero = next((m for m in metrics if m.name == "frac_reward_zero_std"), None)
    if family == "policy_gradients" and zero and zero.final is not None and zero.final >= 0.99:
        notes.append(
            "no reward contrast at the end (frac_reward_zero_std ≈ 1): every group scored the "
            "same, so the policy gradient is zero; warm-start the model (SFT) or ease the task"
        )
    acc = next((m for m in metrics if m.name == "eval/accuracy"), None)
    if family == "direct_alignment" and acc and acc.final is not None and state == "succeeded":
        if acc.final <= 0.5:
            notes.append("held-out accuracy ended at or below chance (0.5)")
    return notes


def inspect_run(run_id: str) -> RunRecord:
    """Build a run's record from its folder without writing anything (no plot)."""
    return _build_record(find_run(run_id), run_id)


def _build_record(path: Path, run_id: str) -> RunRecord:
    warnings: list[str] = []
    campaign = path.parent.parent.name
    meta = _read_json_file(path / "run.json", "run.json", warnings)
    if meta is None and not (path / "run.json").exists():
        warnings.append("run.json is missing (the run was not started by the lab?)")
    meta = meta or {}
    summary = _read_json_file(path / "summary.json", "summary.json", warnings)
    progress = _read_json_file(path / "progress.json", "progress.json", warnings) or {}
    cfg: dict | None = None
    if (path / "config.yaml").exists():
        try:
            cfg = load_yaml(path / "config.yaml")
        except LabError as err:
            warnings.append(f"config.yaml unreadable: {err}")
    else:
        warnings.append("config.yaml is missing")
    rows = _read_jsonl_file(path / "metrics.jsonl", "metrics.jsonl", warnings)
    sample_rows = _read_jsonl_file(path / "samples.jsonl", "samples.jsonl", warnings)

    if meta.get("id") not in (None, run_id):
        warnings.append(f"run.json id {meta.get('id')!r} differs from the folder name")
    if meta.get("campaign") not in (None, campaign):
        warnings.append(f"run.json campaign {meta.get('campaign')!r} differs from the folder's")

    family = meta.get("family") if isinstance(meta.get("family"), str) else None
    algorithm = meta.get("algorithm") or _first(
        cfg, ("algorithm", "loss", "kind", "selection.strategy", "strategy")
    )
    if algorithm is not None and not isinstance(algorithm, str):
        algorithm = str(algorithm)

    outcome = summary.get("outcome") if summary else None
    if outcome is not None and not isinstance(outcome, str):
        warnings.append(f"summary.json outcome {outcome!r} is not a string; ignored")
        outcome = None
    state = meta.get("state") if isinstance(meta.get("state"), str) else None
    if outcome in TERMINAL_STATES and (state is None or state in ACTIVE_STATES):
        state = outcome
    state = state or "unknown"
    if outcome in TERMINAL_STATES and state in TERMINAL_STATES and outcome != state:
        warnings.append(f"run.json says {state} but summary.json says {outcome}")
    if summary is None and state in TERMINAL_STATES | {"unknown"}:
        warnings.append("no summary.json (the run may have died before writing one)")

    failure = None
    if state in ("failed", "died", "stopped") or outcome in ("failed", "stopped"):
        parts: list[str] = []
        if summary and summary.get("error"):
            parts.append(_one_line(summary["error"], 300))
        elif summary and outcome == "stopped" and summary.get("detail"):
            parts.append(_one_line(summary["detail"], 300))
        if isinstance(meta.get("error"), str) and meta["error"]:
            parts.append(_one_line(meta["error"], 300))
        elif state == "died":
            parts.append("the process ended without an exit status (SIGKILL, OOM killer or reboot)")
        if meta.get("signal") not in (None, "", 0):
            parts.append(f"signal {meta.get('signal')}")
        if meta.get("exit_code") not in (None, 0):
            parts.append(f"exit code {meta.get('exit_code')}")
        if state in ("failed", "died") and not (summary and summary.get("error")):
            line = _last_error_line(_tail_text(path / "train.log"))
            if line:
                parts.append(f"last log line: {line}")
        failure = "; ".join(parts) or state

    argv = meta.get("argv")
    command = None
    if isinstance(argv, list) and argv:
        argv = [str(a) for a in argv]
        command = shlex.join(argv)
    else:
        argv = []
    overrides = meta.get("overrides") if isinstance(meta.get("overrides"), list) else []
    source = meta.get("config_source") if isinstance(meta.get("config_source"), str) else None
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
    changes = _config_changes(family, source, cwd, cfg, warnings)

    names = _expand_metric_names(_metric_keys(family))
    metrics = summarize_metrics(rows, names, summary, family)
    steps = _int_or_none((summary or {}).get("steps"))
    if steps is None:
        steps = _int_or_none(progress.get("step"))
    if steps is None and rows:
        steps = max(
            (s for r in rows if (s := _int_or_none(r.get("step"))) is not None), default=None
        )
    total = _int_or_none((summary or {}).get("total_steps")) or _int_or_none(
        progress.get("total_steps")
    )
    wandb = meta.get("wandb_url") or (summary or {}).get("wandb_url")
    model = _first(cfg, ("model.name", "model_name"))
    root = repo_root()
    return RunRecord(
        run_id=run_id,
        campaign=campaign,
        family=family,
        algorithm=algorithm,
        state=state,
        outcome=outcome,
        failure=failure,
        command=command,
        argv=argv,
        overrides=[str(o) for o in overrides],
        model=None if model is None else _one_line(model, 200),
        dataset=_dataset_of(cfg),
        seed=_int_or_none(_first(cfg, ("seed", "train.seed"))),
        config_source=source,
        config_file=os.path.relpath(path / "config.yaml", root) if cfg is not None else None,
        changes=changes,
        metrics=metrics,
        performance=summarize_performance(rows),
        steps=steps,
        total_steps=total,
        wall_time_s=as_float((summary or {}).get("wall_time_s")),
        wandb_url=str(wandb) if wandb else None,
        samples=_sample_excerpts(sample_rows),
        diagnostics=_diagnose(family, state, rows, metrics),
        warnings=warnings,
        run_dir=os.path.relpath(path, root),
        recorded_at=_now(),
    )


def read_metric_rows(run_id: str) -> list[dict]:
    """metrics.jsonl rows of a run (unreadable lines skipped)."""
    return _read_jsonl_file(find_run(run_id) / "metrics.jsonl", "metrics.jsonl", [])


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

_ENV: Environment | None = None


def _fmt_num(value: Any) -> str:
    number = as_float(value)
    if number is None:
        return "—" if value in (None, "") else _cell(value)
    if math.isnan(number):
        return "nan"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"{number:.4g}"


def _cell(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "—"
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    return _md_text(value).replace("|", "\\|")


def _md_text(value: Any, limit: int = 400) -> str:
    """One line of plain text for markdown: whitespace collapsed, '<' escaped so that text such
    as <think> shows instead of being taken for HTML."""
    return _one_line(value, limit).replace("<", "\\<")


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _code(value: Any) -> str:
    text = " ".join(str(value).split())
    if "`" not in text:
        return f"`{text}`"
    return f"`` {text} ``"


def _fence(text: Any) -> str:
    text = str(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}\n{text}\n{ticks}"


def _scores(scores: dict[str, float]) -> str:
    if not scores:
        return ""
    return " — " + ", ".join(f"{k} {_fmt_num(v)}" for k, v in scores.items())


def _env() -> Environment:
    global _ENV
    if _ENV is None:
        env = Environment(
            loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
            autoescape=False,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        env.filters.update(
            num=_fmt_num,
            scores=_scores,
            cell=_cell,
            value=_value,
            code=_code,
            fence=_fence,
            oneline=_md_text,
        )
        _ENV = env
    return _ENV


def _render(template: str, **context: Any) -> str:
    text = _env().get_template(template).render(**context).strip("\n")
    # Data (a completion, a note) must never forge a marker comment.
    return text.replace("rlhf-lab:begin", "rlhf-lab: begin").replace(
        "rlhf-lab:end", "rlhf-lab: end"
    )


def _begin(name: str) -> str:
    return f"<!-- rlhf-lab:begin {name} -->"


def _end(name: str) -> str:
    return f"<!-- rlhf-lab:end {name} -->"


def _block_spans(text: str, names: Sequence[str], where: str) -> dict[str, tuple[int, int]]:
    """{name: (start of content, end of content)} for the blocks present; LabError when a block's
    markers are duplicated, unbalanced, out of order or overlap another block."""
    spans: dict[str, tuple[int, int]] = {}
    for name in names:
        nb, ne = text.count(_begin(name)), text.count(_end(name))
        if nb == 0 and ne == 0:
            continue
        b, e = text.find(_begin(name)), text.find(_end(name))
        if nb != 1 or ne != 1 or e < b:
            raise LabError(
                f"{where}: the '{name}' block markers are broken ({nb} begin, {ne} end marker(s)); "
                f"leave exactly one `{_begin(name)}` followed by one `{_end(name)}` (or delete "
                f"both to have the block re-added), then run `rlhf-lab campaign show` again. "
                "The campaign data is safe in ledger.json."
            )
        spans[name] = (b + len(_begin(name)), e)
    ordered = sorted(spans.items(), key=lambda kv: kv[1][0])
    for (n1, (_, e1)), (n2, (b2, _)) in zip(ordered, ordered[1:], strict=False):
        if b2 - len(_begin(n2)) < e1 + len(_end(n1)):
            raise LabError(f"{where}: the '{n1}' and '{n2}' blocks overlap; fix their markers")
    return spans


def replace_blocks(
    text: str, contents: dict[str, str], headings: dict[str, str], where: str
) -> str:
    """Replace the content between each block's markers; bytes outside markers are kept. A block
    whose markers are both gone is re-added right under its heading (or at the end)."""
    spans = _block_spans(text, list(contents), where)
    # Replace from the end so earlier offsets stay valid.
    for name, (start, stop) in sorted(spans.items(), key=lambda kv: -kv[1][0]):
        text = text[:start] + "\n" + contents[name] + "\n" + text[stop:]
    for name, content in contents.items():
        if name in spans:
            continue
        block = f"{_begin(name)}\n{content}\n{_end(name)}"
        heading = headings.get(name)
        match = re.search(rf"^## {re.escape(heading)}[ \t]*$", text, re.M) if heading else None
        if match:
            at = match.end()
            text = text[:at] + "\n\n" + block + text[at:]
        else:
            sep = "" if text.endswith("\n") or not text else "\n"
            title = f"## {heading}\n\n" if heading else ""
            text = f"{text}{sep}\n{title}{block}\n"
    return text


_FRONT_RE = re.compile(r"---\r?\n(.*?\r?\n)?---(?:\r?\n|\Z)", re.S)


def _split_front_matter(text: str) -> tuple[dict | None, str]:
    """(front matter mapping or None, the rest of the text byte-for-byte)."""
    match = _FRONT_RE.match(text)
    if not match:
        return None, text
    try:
        data = yaml.load(match.group(1) or "", Loader=_YAML_LOADER)
    except yaml.YAMLError:
        data = {}
    return (data if isinstance(data, dict) else {}), text[match.end() :]


def _distinct(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(v for v in values if v not in (None, "")))


def _scalar_or_list(explicit: Any, derived: list[Any]) -> Any:
    if explicit not in (None, "", []):
        return explicit
    if not derived:
        return None
    return derived[0] if len(derived) == 1 else derived


def _campaign_status(runs: Sequence[RunRecord | _RunBrief]) -> str:
    if not runs:
        return "planned"
    states = [r.state for r in runs]
    if any(s in ACTIVE_STATES for s in states):
        return "running"
    if any(s == "succeeded" for s in states):
        return "completed"
    return "failed"


class _RunBrief(NamedTuple):
    """What the index needs of a run (read without validating whole records)."""

    state: str
    family: str | None
    model: str | None
    dataset: str | None
    seed: int | None


def _campaign_model(
    data: _LedgerData,
    status: str | None = None,
    created: bool = False,
    briefs: Sequence[_RunBrief] | None = None,
) -> Campaign:
    meta = data.campaign
    runs: Sequence[RunRecord | _RunBrief] = data.runs if briefs is None else briefs
    seeds = meta.seeds if meta.seeds else _distinct(r.seed for r in runs)
    return Campaign(
        id=meta.id,
        slug=meta.slug,
        date=meta.date,
        status=status or _campaign_status(runs),
        question=meta.question,
        family=_scalar_or_list(meta.family, _distinct(r.family for r in runs)),
        model=_scalar_or_list(meta.model, _distinct(r.model for r in runs)),
        dataset=_scalar_or_list(meta.dataset, _distinct(r.dataset for r in runs)),
        seeds=[int(s) for s in seeds],
        path=str(_md_path(meta.id)),
        asset_dir=str(_asset_dir(meta.id)),
        runs=len(runs),
        created=created,
    )


def _front_matter(campaign: Campaign, old: dict | None) -> str:
    status = campaign.status
    if old and str(old.get("status", "")) in MANUAL_STATUSES:
        status = str(old["status"])
    data: dict[str, Any] = {
        "id": campaign.id,
        "date": campaign.date,
        "status": status,
        "question": campaign.question,
        "family": campaign.family,
        "model": campaign.model,
        "dataset": campaign.dataset,
        "seeds": campaign.seeds,
    }
    for key, value in (old or {}).items():
        if key not in data:
            data[key] = value
    text = yaml.safe_dump(
        data, sort_keys=False, allow_unicode=True, default_flow_style=None, width=1000
    )
    return f"---\n{text}---\n"


def _run_view(r: RunRecord) -> dict[str, Any]:
    state = r.state
    if r.failure and r.state != "succeeded":
        state = f"{r.state}: {_one_line(r.failure, 90)}"
    steps = "—" if r.steps is None else str(r.steps)
    if r.total_steps:
        steps = f"{steps}/{r.total_steps}"
    wall = None
    if r.wall_time_s is not None and math.isfinite(r.wall_time_s):
        wall = f"{r.wall_time_s:.0f} s" if r.wall_time_s < 120 else f"{r.wall_time_s / 60:.1f} min"
    return {
        "run_id": r.run_id,
        "algorithm": r.algorithm,
        "state_text": state,
        "steps_text": steps,
        "wall": wall,
        "finals": {m.name: m.final for m in r.metrics},
        "wandb": f"[W&B]({r.wandb_url})" if r.wandb_url else None,
        "note": r.note,
        "command": r.command,
        "metrics": r.metrics,
        "performance": _performance_text(r.performance),
    }


def _runs_groups(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    groups: dict[str, list[RunRecord]] = {}
    for r in runs:
        groups.setdefault(r.family or "unknown family", []).append(r)
    out = []
    for family, members in groups.items():
        present = {m.name for r in members for m in r.metrics}
        columns = [
            n
            for n in _expand_metric_names(_metric_keys(family if family in FAMILIES else None))
            if n in present
        ]
        out.append({"family": family, "columns": columns, "runs": [_run_view(r) for r in members]})
    return out


def _block_contents(data: _LedgerData, campaign: Campaign) -> dict[str, str]:
    runs = data.runs
    return {
        "setup": _render("setup.md.j2", runs=runs, meta=campaign),
        "runs": _render("runs.md.j2", groups=_runs_groups(runs), runs=[_run_view(r) for r in runs]),
        "plots": _render("plots.md.j2", runs=runs),
        "comparison": _render(
            "comparison.md.j2", comparisons=data.comparisons, campaign=campaign.id
        ),
        "observations-auto": _render("observations.md.j2", runs=runs),
    }


def _skeleton(question: str) -> str:
    question = _one_line(question).replace("rlhf-lab:", "rlhf-lab: ")
    return _env().get_template("campaign.md.j2").render(question=question)


def _render_markdown(existing: str | None, data: _LedgerData, where: str) -> str:
    campaign = _campaign_model(data)
    if existing is None:
        old, body = None, "\n" + _skeleton(data.campaign.question)
    else:
        old, body = _split_front_matter(existing)
        if old is None:
            body = "\n" + body
    body = replace_blocks(body, _block_contents(data, campaign), _BLOCK_HEADINGS, where)
    return _front_matter(campaign, old) + body


# ---------------------------------------------------------------------------------------------
# Ledger data file
# ---------------------------------------------------------------------------------------------


def _meta_from_front_matter(name: str) -> _CampaignMeta | None:
    md = _md_path(name)
    if not md.is_file():
        return None
    fm, _ = _split_front_matter(md.read_text(errors="replace"))
    date, slug = _check_campaign_name(name)
    fm = fm or {}
    seeds = fm.get("seeds")
    return _CampaignMeta(
        id=name,
        slug=slug,
        date=date,
        question=_one_line(fm.get("question") or f"(question not recorded for {name})"),
        family=fm.get("family") if isinstance(fm.get("family"), str) else None,
        model=fm.get("model") if isinstance(fm.get("model"), str) else None,
        dataset=fm.get("dataset") if isinstance(fm.get("dataset"), str) else None,
        seeds=[s for s in seeds if isinstance(s, int)] if isinstance(seeds, list) else None,
        created_at=_now(),
    )


def _load_data(name: str) -> _LedgerData | None:
    """The campaign's data; rebuilt from the front matter when only the markdown exists; None when
    the campaign does not exist. A corrupt ledger.json is an error (never silently replaced)."""
    path = _data_path(name)
    if path.is_file():
        try:
            return _LedgerData.model_validate_json(path.read_text())
        except (OSError, ValueError) as err:
            raise LabError(
                f"{path} is unreadable ({type(err).__name__}); fix it by hand, or move it aside "
                f"and re-record the campaign's runs with `rlhf-lab record <run-id>` (the markdown "
                "keeps the last rendered rows meanwhile)"
            ) from None
    meta = _meta_from_front_matter(name)
    return None if meta is None else _LedgerData(campaign=meta)


def _write_data(name: str, data: _LedgerData) -> None:
    atomic_write_text(_data_path(name), data.model_dump_json(indent=1) + "\n")


def _write(name: str, data: _LedgerData) -> None:
    """Write ledger.json then regenerate the markdown (caller holds the campaign lock)."""
    (_asset_dir(name) / "runs").mkdir(parents=True, exist_ok=True)
    (_asset_dir(name) / "plots").mkdir(parents=True, exist_ok=True)
    _write_data(name, data)
    md = _md_path(name)
    existing = md.read_text() if md.is_file() else None
    text = _render_markdown(existing, data, str(md))
    if text != existing:
        atomic_write_text(md, text)


def _locked(name: str) -> FileLock:
    experiments_dir().mkdir(parents=True, exist_ok=True)
    return _lock(name)


def _acquire(lock: FileLock, name: str):
    try:
        return lock.acquire()
    except LockTimeout:
        raise LabError(
            f"campaign {name} is locked by another writer for more than {LOCK_TIMEOUT_S:.0f} s "
            f"({lock.lock_file}); try again, or remove the lock file if no lab process is running"
        ) from None


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def create_campaign(
    slug: str,
    question: str,
    family: str | None = None,
    model: str | None = None,
    dataset: str | None = None,
    seeds: Sequence[int] | None = None,
) -> Campaign:
    """Create experiments/YYYY-MM-DD-<slug>.md and its asset folder (runs/, plots/).

    Idempotent: when today's campaign with this slug (or the dated name given) exists it is
    returned unchanged (``created=False``); nothing is overwritten.
    """
    check_campaign_slug(slug)
    if not isinstance(question, str) or not question.strip():
        raise LabError("a campaign needs a question, e.g. 'does SimPO learn at gamma 0.5?'")
    if family is not None and family not in FAMILIES:
        raise LabError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    if seeds is not None and not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise LabError(f"seeds must be integers, got {list(seeds)!r}")
    name = slug if _CAMPAIGN_RE.fullmatch(slug) else f"{today()}-{slug}"
    date, bare = _check_campaign_name(name)
    with _acquire(_locked(name), name):
        data = _load_data(name)
        created = data is None
        if data is None:
            data = _LedgerData(
                campaign=_CampaignMeta(
                    id=name,
                    slug=bare,
                    date=date,
                    question=_one_line(question, 500),
                    family=family,
                    model=None if model is None else _one_line(model, 200),
                    dataset=None if dataset is None else _one_line(dataset, 200),
                    seeds=list(seeds) if seeds is not None else None,
                    created_at=_now(),
                )
            )
            _write(name, data)
        else:
            for sub in ("runs", "plots"):
                (_asset_dir(name) / sub).mkdir(parents=True, exist_ok=True)
            if not _data_path(name).is_file():
                _write_data(name, data)
            if not _md_path(name).is_file():
                _write(name, data)
    regenerate_index()
    return _campaign_model(data, created=created)


def _refresh_state(run_id: str, path: Path) -> str | None:
    """Let the runs module settle a run that run.json still calls active (it checks the process
    table and writes the final state into run.json). Returns a warning when that failed."""
    try:
        state = json.loads((path / "run.json").read_text()).get("state")
    except (OSError, ValueError, AttributeError):
        return None
    if state not in ACTIVE_STATES:
        return None
    try:
        runs = importlib.import_module("rlhf_lab.runs")
    except ImportError:
        return None
    try:
        runs.run_state(run_id)
    except Exception as err:  # the record is still built from what is on disk
        return f"state not refreshed from the process table ({type(err).__name__}: {err})"
    return None


def record_run(run_id: str, note: str | None = None, *, plot: bool = True) -> RunRecord:
    """Fill (or refresh) a run's row in its campaign ledger from the run folder.

    Reads run.json, config.yaml, summary.json, progress.json, metrics.jsonl and samples.jsonl;
    unreadable or missing files become warnings in the record. Draws the family's key metrics to
    <campaign>/plots/<run-id>.png. Recording again replaces the same row; ``note=None`` keeps the
    note recorded before. The campaign is created if the run's folder has none yet.
    """
    path = find_run(run_id)
    name = path.parent.parent.name
    try:
        _check_campaign_name(name)
    except LabError:
        raise LabError(
            f"run {run_id} sits in {path.parent.parent}, which is not a dated campaign folder "
            "(YYYY-MM-DD-<slug>); move it under one"
        ) from None
    refresh_warning = _refresh_state(run_id, path)
    record = _build_record(path, run_id)
    if refresh_warning:
        record.warnings.append(refresh_warning)
    if plot:
        png = _asset_dir(name) / "plots" / f"{run_id}.png"
        try:
            result = plot_run_metrics(
                _read_jsonl_file(path / "metrics.jsonl", "metrics.jsonl", []),
                _metric_keys(record.family),
                png,
                title=f"{run_id} ({record.algorithm or record.family or 'run'})",
            )
            if result.path:
                record.plot = os.path.relpath(result.path, experiments_dir())
        except Exception as err:  # a plot must never lose the record
            record.warnings.append(f"plot not drawn: {type(err).__name__}: {err}")
    if note is not None:
        record.note = _one_line(note, 1000) if note.strip() else None
    with _acquire(_locked(name), name):
        data = _load_data(name)
        if data is None:
            date, slug = _check_campaign_name(name)
            data = _LedgerData(
                campaign=_CampaignMeta(
                    id=name,
                    slug=slug,
                    date=date,
                    question=f"(campaign created when {run_id} was recorded: write its question)",
                    created_at=_now(),
                )
            )
            record.warnings.append("the campaign had no ledger yet; it was created")
        for i, old in enumerate(data.runs):
            if old.run_id == run_id:
                if note is None:
                    record.note = old.note
                if not plot and record.plot is None:
                    record.plot = old.plot
                data.runs[i] = record
                break
        else:
            data.runs.append(record)
        _write(name, data)
    regenerate_index()
    return record


def record_comparison(slug: str, entry: ComparisonEntry) -> Campaign:
    """Put ``entry`` into the campaign's Comparison section (same key: replaced)."""
    name = resolve_campaign(slug)
    if not entry.recorded_at:
        entry = entry.model_copy(update={"recorded_at": _now()})
    with _acquire(_locked(name), name):
        data = _load_data(name)
        if data is None:
            raise LabError(f"campaign {name} disappeared while recording; create it again")
        for i, old in enumerate(data.comparisons):
            if old.key == entry.key:
                data.comparisons[i] = entry
                break
        else:
            data.comparisons.append(entry)
        _write(name, data)
    regenerate_index()
    return _campaign_model(data)


def render_campaign(slug: str) -> Campaign:
    """Regenerate the campaign's markdown from ledger.json (e.g. after fixing its markers)."""
    name = resolve_campaign(slug)
    with _acquire(_locked(name), name):
        data = _load_data(name)
        if data is None:
            raise LabError(f"no campaign {name}")
        _write(name, data)
    regenerate_index()
    return _campaign_model(data)


def _campaign_names() -> list[str]:
    root = experiments_dir()
    if not root.is_dir():
        return []
    names = {p.stem for p in root.glob("*.md") if _CAMPAIGN_RE.fullmatch(p.stem)}
    names |= {
        p.parent.name for p in root.glob("*/ledger.json") if _CAMPAIGN_RE.fullmatch(p.parent.name)
    }
    return sorted(names)


def _light_data(name: str) -> tuple[_LedgerData, list[_RunBrief]] | None:
    """Only what the index needs from ledger.json (campaign settings, each run's state, family,
    model, dataset, seed), without validating every record: the index is rebuilt on every write."""
    path = _data_path(name)
    if not path.is_file():
        data = _load_data(name)
        return None if data is None else (data, [])
    try:
        raw = json.loads(path.read_text())
        meta = _CampaignMeta.model_validate(raw["campaign"])
        briefs = [
            _RunBrief(
                state=str(r.get("state", "unknown")),
                family=r.get("family"),
                model=r.get("model"),
                dataset=r.get("dataset"),
                seed=_int_or_none(r.get("seed")),
            )
            for r in raw.get("runs", [])
            if isinstance(r, dict)
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        _load_data(name)  # raises the LabError that explains the problem
        raise
    return _LedgerData(campaign=meta), briefs


def _manual_status(name: str) -> str | None:
    try:
        with open(_md_path(name), errors="replace") as fh:
            head = fh.read(16384)
    except OSError:
        return None
    old, _ = _split_front_matter(head)
    status = str((old or {}).get("status", ""))
    return status if status in MANUAL_STATUSES else None


def _read_campaign(name: str, light: bool = False) -> tuple[Campaign, _LedgerData | None]:
    briefs = None
    try:
        if light:
            found = _light_data(name)
            data, briefs = found if found is not None else (None, None)
        else:
            data = _load_data(name)
    except LabError as err:
        date, slug = _check_campaign_name(name)
        meta = _meta_from_front_matter(name) or _CampaignMeta(
            id=name, slug=slug, date=date, question="(unreadable)"
        )
        camp = _campaign_model(_LedgerData(campaign=meta), status="unknown")
        camp.warnings.append(str(err))
        return camp, None
    if data is None:
        raise LabError(f"no campaign {name}")
    return _campaign_model(data, status=_manual_status(name), briefs=briefs or None), data


def list_campaigns() -> list[Campaign]:
    """Every campaign under experiments/, newest first."""
    return [_read_campaign(n, light=True)[0] for n in reversed(_campaign_names())]


def show_campaign(slug: str) -> CampaignView:
    """The campaign's markdown and its run records (read-only)."""
    name = resolve_campaign(slug)
    # Under the writers' lock: a writer replaces ledger.json, then the markdown, so an unlocked
    # reader could pair the new rows with the old markdown.
    with _acquire(_locked(name), name):
        campaign, data = _read_campaign(name)
        md = _md_path(name)
        markdown = md.read_text(errors="replace") if md.is_file() else ""
    return CampaignView(
        campaign=campaign,
        markdown=markdown,
        runs=list(data.runs) if data else [],
        comparisons=list(data.comparisons) if data else [],
    )


_INDEX_HEAD = (
    "# Experiments\n\n"
    "One dated ledger per campaign (`YYYY-MM-DD-<slug>.md`, assets in the folder of the same "
    "name). The table below is regenerated by rlhf-lab; text outside its markers is kept.\n"
)


def regenerate_index() -> Path:
    """Rewrite the campaign table in experiments/README.md (text outside its markers is kept)."""
    root = experiments_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / "README.md"
    lock = FileLock(str(root / ".README.md.lock"), timeout=LOCK_TIMEOUT_S)
    with _acquire(lock, "index"):
        content = _render("index.md.j2", campaigns=list_campaigns())
        existing = path.read_text(errors="replace") if path.is_file() else None
        base = existing if existing is not None else _INDEX_HEAD
        text = replace_blocks(base, {"index": content}, {}, str(path))
        if text != existing:
            atomic_write_text(path, text)
    return path
