"""What an evaluation job costs, before it runs: peak memory and the tokens it generates, and the
evaluation ``plan_experiment`` proposes after each training run. Torch-free.

Memory: the job loads one model at a time (target, baseline, then a judge or reference), so the
peak is the largest model's weights plus the KV cache of one generation batch
(``sampling.batch_size`` prompts × ``sampling.n`` samples of ``prompt + max_new_tokens``
tokens), the runtime (CUDA context or the CPU process) and 10 % allocator slack: the same
blocks as the training estimates (:mod:`rlhf_lab.planning.memory.blocks`). Time is given as the number of
tokens sampled at most (``prompts.size × n × max_new_tokens`` per policy) — the trainers'
throughput on the device turns it into seconds; a cached model costs nothing.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.errors import LabError
from rlhf_lab.evaluation.jobs import cpu_sized_overrides, shipped_suite
from rlhf_lab.planning.memory import blocks
from rlhf_lab.planning.trainer_config import EVALUATION, TrainerConfig

__all__ = [
    "EvalCost",
    "estimate_evaluation",
    "keeps_final_model",
    "plan_evaluation_step",
    "suites_for_family",
]

# What to evaluate a run of each family on (a reward model is a judge, not a policy).
_FAMILY_SUITES: dict[str, tuple[str, ...]] = {
    "policy_gradients": ("reasoning",),
    "sft": ("reasoning",),
    "rejection_sampling": ("reasoning",),
    "direct_alignment": ("pair_accuracy", "generation"),
}


class EvalCost(BaseModel):
    suite: str
    model: str | None
    device: str
    memory_gb: float | None = Field(description="peak, one model loaded at a time")
    policies: int = Field(description="models sampled: the target, and the baseline if any")
    generated_tokens: int = Field(description="at most, over all policies")
    note: str = ""


def suites_for_family(family: str | None) -> tuple[str, ...]:
    return _FAMILY_SUITES.get(family or "", ())


def _config(suite: str, overrides: list[str]) -> TrainerConfig:
    """A suite's shipped config with ``overrides`` applied (not validated: no models set)."""
    from trainers.core.config import apply_overrides

    data = apply_overrides(shipped_suite(suite).to_data(), overrides)
    return TrainerConfig(EVALUATION, data)


def estimate_evaluation(
    model: str | None,
    suite: str,
    overrides: list[str] | None = None,
    *,
    device: str = "cuda",
    baseline: bool = True,
) -> EvalCost:
    """The cost of evaluating ``model`` (a name, a run's final_model path or ``run:<id>``) on
    ``suite`` with the shipped config and ``overrides``; ``memory_gb`` is None when the model's
    architecture cannot be known here."""
    from rlhf_lab.planning.memory import dtype_bytes, model_facts
    from rlhf_lab.runs.lineage import stand_in

    dev = "cpu" if device == "cpu" else "cuda"
    shipped = shipped_suite(suite)
    cfg = _config(suite, [*cpu_sized_overrides(shipped, model, dev), *(overrides or [])])
    prompts = int(cfg.get("prompts.size", 64))
    n = int(cfg.get("sampling.n", 1))
    new = int(cfg.get("sampling.max_new_tokens", 128))
    batch = int(cfg.get("sampling.batch_size", 16))
    policies = 1 + int(baseline) if suite != "pair_accuracy" else 0
    tokens = prompts * n * new * policies
    if suite == "best_of_n" and cfg.get("best_of_n.samples_from"):
        tokens = 0  # an earlier job's completions are scored again
    memory, note = None, ""
    try:
        facts = model_facts(stand_in(model)) if model else None
    except LabError as err:
        facts, note = None, f"model size unknown here ({err.message})"
    if facts is not None:
        b = dtype_bytes("bf16" if dev == "cuda" else "fp32")
        total = blocks.weights_gb(facts.params.total, b)
        arch = facts.params.arch
        if arch is not None and policies:
            kv, _ = blocks.kv_cache_gb(arch, b, batch * n, blocks.DEFAULT_PROMPT_TOKENS + new)
            total += kv
        total += blocks.CUDA_CONTEXT_GB if dev == "cuda" else blocks.CPU_BASELINE_GB
        memory = round(total * (1 + blocks.ALLOCATOR_SLACK), 3)
    return EvalCost(
        suite=suite,
        model=model,
        device=dev,
        memory_gb=memory,
        policies=policies,
        generated_tokens=tokens,
        note=note,
    )


def keeps_final_model(run: Any) -> bool:
    """Whether a planned run saves the final model an evaluation needs (a change of the plan's
    sets ``checkpoint.save_final_model`` false otherwise; the shrink keeps it on)."""
    for change in getattr(run, "changes", []) or []:
        if change.key == "checkpoint.save_final_model":
            return change.used is not False
    from rlhf_lab.planning.catalog import get_dotted
    from rlhf_lab.planning.configs import resolve_config

    try:  # unchanged: the recipe's own value
        shipped = resolve_config(run.config_path).data
    except LabError:
        return True
    return get_dotted(shipped, "checkpoint.save_final_model", True) is not False


def _predicted_time(model: str | None, suite: str, cost: EvalCost) -> str:
    """ ", ~N min" from the cached throughput calibration of ``model`` (a plan measures the
    trained runs' models already), or nothing when there is none."""
    if not cost.generated_tokens or not model:
        return ""
    from rlhf_lab.planning.time import predict_evaluation

    cfg = _config(suite, cpu_sized_overrides(shipped_suite(suite), model, cost.device))
    try:
        estimate = predict_evaluation(
            model, cfg, policies=cost.policies, device=cost.device, mode="cached"
        )
    except Exception:  # noqa: BLE001 - a prediction never stops a plan
        return ""
    return f", {estimate.text}" if estimate.calibrated and estimate.text else ""


def plan_evaluation_step(runs: list[Any], number: int) -> str | None:
    """The plan's step that evaluates every trained run once it ends, with each job's cost; a
    run that keeps no final model is left out (its evaluation would be refused)."""
    parts = []
    for run in runs:
        if not keeps_final_model(run):
            continue
        for suite in suites_for_family(run.family):
            device = "cpu" if (run.recommended_device or "").startswith("cpu") else "cuda"
            try:
                cost = estimate_evaluation(run.model, suite, device=device)
            except LabError:
                continue
            memory = f"~{cost.memory_gb:.2g} GiB" if cost.memory_gb is not None else "memory ?"
            tokens = (
                f"≤{cost.generated_tokens:,} sampled tokens"
                if cost.generated_tokens
                else "scoring only, no sampling"
            )
            when = _predicted_time(run.model, suite, cost)
            parts.append(f"{run.name} on {suite} ({memory} on {cost.device}, {tokens}{when})")
    if not parts:
        return None
    return (
        f"{number}. when a run has succeeded, evaluate it against its starting model "
        "(evaluate_model with its run id: same prompts and seed, intervals, recorded in the "
        "ledger's Evaluation section): " + "; ".join(parts)
    )
