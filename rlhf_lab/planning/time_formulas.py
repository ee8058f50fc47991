"""The pure cost formulas of the wall-time predictor (:mod:`rlhf_lab.planning.time`): a pass
over some tokens, a decode step at some rows, the sampling loop, an optimizer step, start-up,
and how many evaluations a run makes, each from the throughput calibration (``cal``, the JSON
of ``trainers.core.throughput``). No config is read here: the work models per family are in
``time``. Torch-free."""

from __future__ import annotations

import math
from typing import Any


def format_duration(seconds: float) -> str:
    """``4.2 s``, ``42 s``, ``2.5 min``, ``14 min``, ``2.5 h``: a duration as people read one."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 600:
        return f"{seconds / 60:.1f} min"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def time_text(total_s: float, steps: int | None, per_step_s: float | None) -> str:
    """``~14 min (32 steps × 26 s)``; without steps, ``~14 min``."""
    if steps and per_step_s is not None:
        return f"~{format_duration(total_s)} ({steps} steps × {format_duration(per_step_s)})"
    return f"~{format_duration(total_s)}"


def pass_seconds(rate: dict[str, Any], tokens: float) -> float:
    """One pass over ``tokens`` tokens: ``fixed_s + tokens / tokens_per_s`` (a fit of the
    calibration's two shapes)."""
    return float(rate.get("fixed_s", 0.0)) + tokens / float(rate["tokens_per_s"])


def head_seconds(cal: dict[str, Any], tokens: float, *, grad: bool) -> float:
    """``tokens`` through the LM head (the positions a loss or a log-prob needs); 0 for a
    calibration that counted the head inside its passes (format 1-2)."""
    head = cal.get("head")
    if not head or tokens <= 0:
        return 0.0
    return tokens / float(head["train_tokens_per_s" if grad else "forward_tokens_per_s"])


def train_pass_seconds(
    cal: dict[str, Any], tokens: float, *, lora: bool, checkpointing: bool, head: float = 0.0
) -> float:
    """A forward + backward over ``tokens`` (LoRA or full), ``head`` of them through the LM
    head; gradient checkpointing recomputes the forward during the backward, one more."""
    seconds = pass_seconds(cal["lora" if lora else "train"], tokens)
    if checkpointing:
        seconds += pass_seconds(cal["forward"], tokens)
    return seconds + head_seconds(cal, head, grad=True)


def supervised_step_seconds(
    cal: dict[str, Any],
    rows: int,
    micro_batch: int,
    length: float,
    *,
    lora: bool,
    gc: bool,
    head: float = 0.0,
) -> float:
    """One optimizer step over ``rows`` rows of ``length`` tokens (``head`` of them per row
    through the LM head) in micro-batches of ``micro_batch``: the passes, then AdamW's step."""
    micro = max(1, math.ceil(rows / max(micro_batch, 1)))
    size = min(rows, micro_batch)
    one = train_pass_seconds(cal, size * length, lora=lora, checkpointing=gc, head=size * head)
    return micro * one + float(cal["lora" if lora else "train"]["optimizer_s"])


def forward_seconds(
    cal: dict[str, Any], rows: int, batch: int, length: float, head: float = 0.0
) -> float:
    """No-grad passes over ``rows`` rows of ``length`` tokens (``head`` per row through the
    LM head), ``batch`` rows a pass."""
    if rows <= 0:
        return 0.0
    passes = math.ceil(rows / max(batch, 1))
    size = min(rows, batch)
    return passes * pass_seconds(cal["forward"], size * length) + head_seconds(
        cal, rows * head, grad=False
    )


def decode_step_seconds(cal: dict[str, Any], rows: int) -> float:
    """One decode step at ``rows`` rows: linear between the measured row counts (made
    non-decreasing: more rows never cost less, whatever noise the measurement had), extended by
    the last two beyond them."""
    table = monotone_steps(cal["decode"]["rows"])
    if rows <= table[0][0]:
        return table[0][1]
    for (r1, s1), (r2, s2) in zip(table, table[1:], strict=False):
        if rows <= r2:
            return s1 + (s2 - s1) * (rows - r1) / (r2 - r1)
    (r1, s1), (r2, s2) = table[-2], table[-1]
    return s2 + (s2 - s1) / (r2 - r1) * (rows - r2)


def monotone_steps(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(rows, seconds per step) sorted by rows, each step at least the one before it."""
    out: list[tuple[int, float]] = []
    for count, seconds in sorted((int(r["rows"]), float(r["step_s"])) for r in rows):
        out.append((count, max(seconds, out[-1][1] if out else 0.0)))
    return out


def generation_seconds(
    cal: dict[str, Any], prompts: int, repeats: int, prompt_tokens: float, new_tokens: int
) -> float:
    """The sampling loop: one prefill of ``prompts`` prompts, then ``new_tokens`` − 1 decode
    steps at ``prompts × repeats`` rows (every row running to the limit: an upper bound)."""
    if prompts <= 0 or new_tokens <= 0:
        return 0.0
    prefill = prompts * prompt_tokens / float(cal["decode"]["prefill_tokens_per_s"])
    return prefill + (new_tokens - 1) * decode_step_seconds(cal, prompts * repeats)


def batched_generation_seconds(
    cal: dict[str, Any], prompts: int, batch: int, repeats: int, prompt_tokens: float, new: int
) -> float:
    """``prompts`` prompts sampled ``batch`` at a time (the last batch may be smaller)."""
    if prompts <= 0:
        return 0.0
    batch = max(1, min(batch, prompts))
    full, rest = divmod(prompts, batch)
    seconds = full * generation_seconds(cal, batch, repeats, prompt_tokens, new)
    return seconds + generation_seconds(cal, rest, repeats, prompt_tokens, new)


def startup_seconds(cal: dict[str, Any], models: int = 1, saves: int = 0) -> float:
    """Imports and the first model load, each further model's load, the final model's save."""
    start = cal["startup"]
    reload_s = float(start.get("reload_s", start["load_s"]))
    seconds = float(start["import_s"]) + float(start["load_s"]) + (models - 1) * reload_s
    return seconds + saves * float(start.get("save_s", 0.0))


def evals_in_run(steps: int, every: int | None, *, at_start: bool = True) -> int:
    """Evaluations in a run of ``steps`` steps: at step 0 (``at_start``), every ``every`` steps
    and at the end (once when the last step is also a multiple)."""
    if not every or every <= 0:
        return 0
    return int(at_start) + steps // every + (1 if steps % every else 0)


def typical_length(cal: dict[str, Any], kind: str, cap: int | None) -> float:
    """The 90th-percentile token count of one kind of built-in text, capped by ``cap``."""
    value = float(((cal.get("lengths") or {}).get(kind) or {}).get("p90") or 0.0)
    if not value:
        return float(cap or 0)
    return min(value, float(cap)) if cap else value
