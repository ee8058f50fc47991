"""Where a step's time goes: each stage's share of the step and its MFU, from the stage metrics
a trainer logs in its train rows (``timing/<stage>_s``, ``mfu/<stage>``, ``mfu/step``;
trainers/core/flops.py). ``rlhf-lab status`` shows it for the latest train row, the ledger for
the median step of each run (rlhf_lab.ledger.metrics.summarize_performance)."""

from __future__ import annotations

from typing import Any

from rlhf_lab.results.plots import as_float

# The stages of a step, in the order a policy-gradient step runs them (trainers/core/flops.py,
# trainers/policy_gradients/stages.py); a stage not listed here follows them, by name.
STAGES = (
    "generate",
    "weight_gather",
    "score",
    "reference",
    "old_logps",
    "values",
    "advantages",
    "update",
)
_NOT_STAGES = ("step", "train", "prepare")  # the whole step, and sums of stages


def stage_names(values: dict[str, float]) -> list[str]:
    found = [
        k.removeprefix("timing/").removesuffix("_s")
        for k in values
        if k.startswith("timing/") and k.endswith("_s")
    ]
    stages = [n for n in found if n not in _NOT_STAGES]
    known = [n for n in STAGES if n in stages]
    return known + sorted(n for n in stages if n not in STAGES)


def time_split(values: dict[str, Any]) -> str | None:
    """Where a step's time goes, from a train row or the medians of :func:`summarize_performance`:
    each stage's share of ``timing/step_s`` with its MFU (``mfu/<stage>``), then the step's
    seconds and MFU (``mfu/step``); None when the row has neither stages nor an MFU."""
    step = as_float(values.get("timing/step_s"))
    if step is None or step <= 0:
        return None
    parts = []
    for name in stage_names(values):
        seconds = as_float(values.get(f"timing/{name}_s")) or 0.0
        mfu = as_float(values.get(f"mfu/{name}"))
        shown = f"{name} {100 * seconds / step:.0f}%"
        parts.append(shown + (f" (MFU {_percent(mfu)})" if mfu is not None else ""))
    mfu_step = as_float(values.get("mfu/step"))
    if not parts and mfu_step is None:
        return None
    whole = f"step {step:.3g} s" + (f", MFU {_percent(mfu_step)}" if mfu_step is not None else "")
    return ", ".join(parts) + ("; " if parts else "") + whole


def _percent(x: float) -> str:
    return f"{100 * x:.2g}%" if 0 < abs(x) < 0.01 else f"{100 * x:.1f}%"
