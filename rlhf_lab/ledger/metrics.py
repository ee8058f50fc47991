"""The ledger's key metrics: which metrics a run's row shows, which way each is better, and the
final/best summary of a run's metrics. Torch-free.

The metric names come from the lab's catalog (``catalog.key_metrics_for(family)``), folded to the
ledger's convention: a bare name covers the training metric and its held-out ``eval/`` twin, a
name given with the prefix is held-out only. ``_TRAIN_TWINS`` names the families whose catalog
lists only the held-out metric where the ledger also shows the training one; ``_LEDGER_EXTRAS``
the metrics the ledger shows beyond the catalog's (rejection sampling's SFT stage and its test
accuracy, which the comparison of strategies reads; a policy-gradient run's proxy and gold reward
and KL to the reference, the RLHF picture).

Which way each metric is better comes from the algorithm specs through
:func:`rlhf_lab.planning.catalog.metric_direction`; this module keeps no direction table of its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from rlhf_lab.index.campaign_summary import _int_or_none
from rlhf_lab.ledger.schema import MetricSummary
from rlhf_lab.planning.catalog import FAMILIES as CATALOG_FAMILIES
from rlhf_lab.planning.catalog import key_metrics_for, metric_direction
from rlhf_lab.results.plots import EVAL_PREFIX, as_float
from rlhf_lab.results.stages import stage_names

__all__ = [
    "FAMILY_METRICS",
    "TOOL_LEGEND",
    "TOOL_METRICS",
    "metric_direction",
    "summarize_metrics",
    "summarize_performance",
]

# A multi-turn policy-gradient run's per-trajectory means (rollouts; ``eval/`` twins held out):
# model turns, tool calls, calls answered with an error, the share of trajectories with a call
# and the share whose final answer repeats a tool result.
TOOL_METRICS: tuple[str, ...] = (
    "tools/called",
    "tools/used_result",
    "tools/calls",
    "tools/errors",
    "tools/turns",
)
TOOL_LEGEND = (
    "Tools (multi-turn runs, means per trajectory): called = share of trajectories that called "
    "a tool, used_result = share of final answers that repeat a tool result, calls = tool calls, "
    "errors = calls answered with an error, turns = model turns."
)

# Families whose catalog lists only ``eval/<name>`` where the ledger shows ``<name>`` (training
# and held-out).
_TRAIN_TWINS: dict[str, tuple[str, ...]] = {"reward_models": ("accuracy", "reward_margin")}
# Metrics the ledger shows beyond the catalog's key metrics.
_LEDGER_EXTRAS: dict[str, tuple[str, ...]] = {
    "rejection_sampling": ("sft/loss", "eval/accuracy", "test_accuracy"),
    # a run optimising a learned reward model: the proxy and gold reward and the KL to the
    # reference; a multi-turn run with a tool: its per-trajectory means (TOOL_METRICS); each
    # shown only when the run logs it
    "policy_gradients": ("proxy_reward", "gold_reward", "kl_ref", *TOOL_METRICS),
}


def _catalog_keys(family: str) -> list[str]:
    """The family's key metrics as the catalog lists them."""
    return key_metrics_for(family)


def _ledger_keys(family: str) -> tuple[str, ...]:
    """The catalog's key metrics in the ledger's convention (see the module docstring): an
    ``eval/`` name whose training twin is listed too (or named in ``_TRAIN_TWINS``) folds into
    the bare name, which covers both."""
    names = _catalog_keys(family)
    bare = {n for n in names if not n.startswith(EVAL_PREFIX)}
    bare |= set(_TRAIN_TWINS.get(family, ()))
    out: dict[str, None] = {}
    for name in [*names, *_LEDGER_EXTRAS.get(family, ())]:
        base = name.removeprefix(EVAL_PREFIX)
        out[base if name.startswith(EVAL_PREFIX) and base in bare else name] = None
    return tuple(out)


FAMILY_METRICS: dict[str, tuple[str, ...]] = {f: _ledger_keys(f) for f in CATALOG_FAMILIES}


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
    the highest ``memory/peak_gb``, the median seconds of each ``timing/*`` phase per step and
    the median of each ``mfu/*`` figure.
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
    phases = sorted({k for r in steady for k in r if k.startswith(("timing/", "mfu/"))})
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
    stages = {f"timing/{name}_s" for name in stage_names(perf)}  # in time_split's line
    timing = [
        (k.removeprefix("timing/"), v)
        for k, v in perf.items()
        if k.startswith("timing/") and k not in stages
    ]
    if timing:
        parts.append("per step: " + ", ".join(f"{name} {v:.3g} s" for name, v in timing))
    return "; ".join(parts) or None
