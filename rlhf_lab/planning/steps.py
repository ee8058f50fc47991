"""How many optimizer steps a resolved config takes, and what ``progress.json`` will count
(rollout steps for policy gradients, optimizer steps elsewhere): the arithmetic of batch,
accumulation, epochs and data sizes per family, read by the shrink's report, the plan and the
time estimate. Pure functions of a config (:class:`~rlhf_lab.planning.trainer_config.TrainerConfig`)."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from rlhf_lab.planning.trainer_config import TrainerConfig, find_key

__all__ = ["StepsEstimate", "estimate_steps", "expected_optimizer_steps", "find_key"]


def _epochs_steps(n: int, per_step: int, epochs: int, max_steps: int | None) -> int:
    total = math.ceil(max(n, 0) / per_step) * epochs
    return min(total, max_steps) if max_steps else total


class StepsEstimate(BaseModel):
    optimizer_steps: int | None
    progress_steps: int | None = Field(description="total_steps in progress.json")
    progress_unit: str
    detail: str


def estimate_steps(family: str, view: TrainerConfig) -> StepsEstimate:
    """Optimizer steps a run of ``view`` should take, and the total progress.json will show
    (rollout steps for policy gradients, optimizer steps elsewhere)."""
    steps, detail = expected_optimizer_steps(family, view)
    if family == "policy_gradients":
        max_steps = view.get("train.max_steps")
        if max_steps:
            rollout = int(max_steps)
        else:
            epochs = int(view.get("train.num_epochs", 1) or 1)
            size = int(view.get("data.size", 0) or 0)
            prompts = int(view.get("rollout.prompts_per_step", 1) or 1)
            rollout = max(1, epochs * (size // prompts))
        return StepsEstimate(
            optimizer_steps=steps,
            progress_steps=rollout,
            progress_unit="rollout steps",
            detail=detail,
        )
    return StepsEstimate(
        optimizer_steps=steps, progress_steps=steps, progress_unit="optimizer steps", detail=detail
    )


def expected_optimizer_steps(family: str, view: TrainerConfig) -> tuple[int | None, str]:
    """(optimizer steps a run of ``view`` should take, how it was computed). None when it
    depends on a data set size the config does not fix."""
    g = view.get
    batch = int(g("train.batch_size", 1) or 1)
    accum = int(g("train.gradient_accumulation_steps", 1) or 1)
    epochs = int(g("train.num_epochs", 1) or 1)
    max_steps = g("train.max_steps")
    per_step = batch * accum

    if family in ("direct_alignment", "sft", "reward_models"):
        n = g("data.max_samples")
        dataset = str(g("data.dataset") or "")
        if n is None and dataset.startswith("builtin:"):
            n = 1000 if family == "direct_alignment" else 2000 if family == "sft" else None
        if n is None:
            if max_steps:
                return int(max_steps), f"train.max_steps = {max_steps} (data size not fixed)"
            return None, "depends on the data set size (data.max_samples is null)"
        eval_size = int(g("data.eval_size", 0) or 0)
        train_n = int(n) - eval_size
        unit = "examples"
        if family == "reward_models" and g("kind") == "orm":
            rollouts = int(g("data.rollouts_per_prompt", 1) or 1)
            train_n *= rollouts
            unit = f"completions ({int(n) - eval_size} prompts × {rollouts})"
        steps = _epochs_steps(train_n, per_step, epochs, max_steps)
        detail = (
            f"ceil(({n} - {eval_size} held out) {unit} / ({batch} × {accum})) × {epochs} epoch(s)"
        )
        if max_steps:
            detail += f", capped by train.max_steps = {max_steps}"
        if family == "reward_models" and g("kind") == "prm":
            detail += " (approximate: long solutions are split into several windows)"
        elif family != "sft":
            detail += " (slightly fewer if pairs are dropped after truncation)"
        return steps, detail

    if family == "policy_gradients":
        prompts = int(g("rollout.prompts_per_step", 4))
        rollouts = int(g("rollout.num_rollouts", 8))
        updates = int(g("loss.updates_per_rollout", 1) or 1)
        size = int(g("data.size", 0))
        rollout_steps = int(max_steps) if max_steps else max(1, epochs * (size // max(prompts, 1)))
        micro = (prompts * rollouts) // batch
        per_update = math.ceil(micro / accum)
        steps = rollout_steps * per_update * updates
        detail = (
            f"{rollout_steps} rollout steps × ceil({prompts}×{rollouts} sequences / {batch} per "
            f"micro-batch / {accum} accumulation) = {per_update} optimizer step(s) per update × "
            f"{updates} update(s) per rollout"
        )
        return steps, detail

    if family == "distillation":
        size = int(g("data.size", 0) or 0)
        steps = _epochs_steps(size, per_step, epochs, max_steps)
        detail = f"ceil({size} prompts / ({batch} × {accum})) × {epochs} epoch(s)"
        if max_steps:
            detail += f", capped by train.max_steps = {max_steps}"
        return steps, detail

    if family == "rejection_sampling":
        return _rejection_sampling_steps(view)

    return None, f"no step rule for family {family}"


def _rejection_sampling_steps(view: TrainerConfig) -> tuple[int | None, str]:
    """The SFT stage's optimizer steps, the trainer's rule (trainers/rejection_sampling/train.py
    ``planned_sft_steps``): the selection (the trainer's ``selection_size``: one completion per
    prompt, or min(``top_k``, the pool) for the overall strategies) less ``sft.eval_size``, ``batch × accum`` a step,
    ``sft.num_epochs`` times, capped by ``sft.max_steps``."""
    from trainers.rejection_sampling.config import selection_size  # torch-free

    g = view.get
    prompts = g("data.max_train_samples")
    if prompts is None:
        return None, "depends on the number of training prompts (data.max_train_samples is null)"
    n = int(g("generation.num_completions_per_prompt", 1) or 1)
    strategy = str(g("strategy", "") or "")
    per_prompt = strategy.endswith("per_prompt")
    size = selection_size(strategy, int(prompts), n, int(g("top_k", 0) or 0))
    held = int(g("sft.eval_size", 0) or 0)
    batch = int(g("sft.batch_size", 1) or 1)
    accum = int(g("sft.gradient_accumulation_steps", 1) or 1)
    epochs = int(g("sft.num_epochs", 1) or 1)
    cap = g("sft.max_steps")
    steps = _epochs_steps(size - held, batch * accum, epochs, int(cap) if cap else None)
    what = "one per prompt" if per_prompt else f"min(top_k {g('top_k')}, {prompts} × {n})"
    detail = f"SFT on {size} selected completions ({what})"
    detail += f" less {held} held out" if held else ""
    detail += f": ceil({size - held} / ({batch} × {accum})) × {epochs} epoch(s)"
    return steps, detail + (f", capped by sft.max_steps = {cap}" if cap else "")
