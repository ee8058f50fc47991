"""How long a run takes on this machine, predicted from its resolved config and the measured
throughput of its model (:mod:`rlhf_lab.planning.throughput_cache`). Torch-free.

A run's time is a work model per family, each term a small pure function of the config and the
calibration (``cal``, the JSON of ``trainers.core.throughput``):

* start: importing torch, loading the model (and a second model: a reference, a reward model)
  and writing the final model;
* SFT, direct alignment, reward models: optimizer steps
  (:func:`rlhf_lab.planning.steps.expected_optimizer_steps`) × (micro-batches × a forward + backward of
  ``batch × length`` tokens through the model's body, the tokens a loss needs through the LM
  head — SFT's answer, both preference responses, none for a reward model's scalar head — and
  the AdamW step); ``length`` is the data's typical padded length
  (the 90th percentile of the built-in data through this tokenizer, capped by
  ``data.max_length``; ``max_length`` for other data); direct alignment adds the reference
  pass over every pair once (a loss with a reference: not SimPO or ORPO); held-out loss passes at step 0, every ``eval_every`` steps and at
  the end; samples every ``sample_every`` steps; the gold evaluation (``eval.gold_prompts``) at
  each evaluation: a greedy and a sampled decode of its prompts and two no-grad passes;
* policy gradients: per rollout step, the sampling loop (prefill + ``max_new_tokens`` decode
  steps at ``prompts × rollouts`` rows: an upper bound, rows that stop early leave the batch; a
  multi-turn trajectory's length, :mod:`rlhf_lab.planning.completion_length`, counts its tool
  replies as decode steps too, an upper bound since a reply is fed in one forward),
  the no-grad passes (π_old when the spec needs it, π_ref when β > 0) and the update passes;
  greedy held-out generation at step 0 and every ``eval_every`` steps;
* distillation: per optimizer step, the student's sampling loop (prefill + ``max_new_tokens``
  decode steps at ``prompts × num_samples`` rows, an upper bound), then per micro-batch a
  no-grad pass of the frozen teacher and a forward + backward of the student, every completion
  token through both LM heads; greedy held-out generation by the student at step 0, every
  ``eval_every`` steps and at the end, and once by the teacher (its ceiling). The teacher is
  timed with its own calibration (the student's when both are the same model);
* online DPO: per optimizer step the sampling of its pairs, the ranker's reward model, the
  policy's update and the reference's pass over the packed pairs (:func:`rlhf_lab.planning.time_models.online_dpo`);
* rejection sampling: the pool, its scores, the baseline, the SFT stage and the final
  evaluation (:func:`rlhf_lab.planning.time_models.rejection_sampling`; an upper bound where the pool is cached);
* evaluation jobs: ``prompts × n × max_new_tokens`` sampled per policy, in batches.

Gradient checkpointing adds one forward pass to every forward + backward. The prediction says
"time: not calibrated" rather than guessing when the model has no calibration.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from rlhf_lab.planning import time_models as work
from rlhf_lab.planning.time_formulas import (
    batched_generation_seconds,
    decode_step_seconds,
    evals_in_run,
    format_duration,
    forward_seconds,
    generation_seconds,
    pass_seconds,
    startup_seconds,
    supervised_step_seconds,
    time_text,
    typical_length,
)
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "campaign_time_line",
    "predicted_total_s",
    "wall_with_prediction",
    "TimeEstimate",
    "decode_step_seconds",
    "evals_in_run",
    "format_duration",
    "generation_seconds",
    "launch_prediction",
    "not_calibrated",
    "pass_seconds",
    "predict_evaluation",
    "predict_run",
    "plan_time_total",
    "predict_from_calibration",
    "predict_planned_run",
    "startup_seconds",
    "supervised_step_seconds",
    "time_text",
]


class TimeEstimate(BaseModel):
    """A run's predicted wall time, or why there is none (``calibrated`` false)."""

    # (no field descriptions: this model is in plan_experiment's MCP schema, kept small)
    calibrated: bool
    total_s: float | None = None
    per_step_s: float | None = None  # one step, evaluations aside
    steps: int | None = None
    step_unit: str = "steps"
    parts: dict[str, float] = Field(default_factory=dict)  # seconds: start, steps, eval, ...
    text: str  # "~14 min (32 steps × 26 s)" or "time: not calibrated (...)"
    device: str | None = None
    threads: int | None = None
    calibration: str | None = None  # the calibration's cache key
    note: str | None = None  # a calibration that ran for this plan, and its cost


def predict_from_calibration(
    cal: dict[str, Any],
    family: str,
    algorithm: str,
    config: TrainerConfig,
    teacher: dict[str, Any] | None = None,
) -> TimeEstimate:
    """The prediction for a resolved ``config`` from a calibration (pure: no cache, no
    subprocess); ``teacher``: a distillation teacher's calibration (None: the same model's).
    ``calibrated`` is false for a family without a work model."""
    from rlhf_lab.planning.steps import expected_optimizer_steps

    unit = "optimizer steps"
    if family == "policy_gradients":
        steps = work.rollout_steps(config)
        per_step, parts, models = work.policy_gradients(cal, config, algorithm, steps)
        unit = "rollout steps"
    elif family in ("sft", "direct_alignment", "reward_models"):
        steps = expected_optimizer_steps(family, config)[0] or 0
        if not steps:
            return not_calibrated("the number of steps depends on the data set size")
        if algorithm == "online_dpo":  # samples and ranks its pairs each step
            per_step, parts, models = work.online_dpo(cal, config, steps)
        elif family == "direct_alignment":
            per_step, parts, models = work.direct_alignment(cal, config, algorithm, steps)
        else:
            model = work.sft if family == "sft" else work.reward_models
            per_step, parts, models = model(cal, config, steps)
    elif family == "rejection_sampling":
        steps = expected_optimizer_steps(family, config)[0]
        if steps is None:
            return not_calibrated("the number of prompts depends on the data set size")
        per_step, parts, models = work.rejection_sampling(cal, config, steps)
        unit = "SFT steps"
    elif family == "distillation":
        steps = expected_optimizer_steps(family, config)[0] or 0
        if not steps:
            return not_calibrated("the number of steps depends on the data set size")
        per_step, parts, models = work.distillation(cal, config, steps, teacher or cal)
    else:
        return not_calibrated(f"no time model for family {family} yet")
    # rejection sampling's SFT stage always writes final_model/: its final evaluation loads it
    saved = bool(work.setting(config, "checkpoint.save_final_model"))
    saves = int(family == "rejection_sampling" or saved)
    parts["start"] = startup_seconds(cal, models=models, saves=saves)
    total = sum(parts.values())
    text = time_text(total, steps, per_step)
    if family == "rejection_sampling":  # most of it is the pool, sampled before any step
        pool, step = format_duration(parts["pool"]), format_duration(per_step)
        text = f"~{format_duration(total)} (the pool {pool}, then {steps} SFT steps × {step})"
    return TimeEstimate(
        calibrated=True,
        total_s=round(total, 1),
        per_step_s=round(per_step, 2),
        steps=steps,
        step_unit=unit,
        parts={k: round(v, 1) for k, v in parts.items()},
        text=text,
        device=str(cal.get("device")),
        threads=cal.get("threads"),
    )


def not_calibrated(reason: str) -> TimeEstimate:
    return TimeEstimate(calibrated=False, text=f"time: not calibrated ({reason})")


def _with_calibration(
    model: str | None, device: str, threads: int | None, mode: str | None
) -> tuple[dict[str, Any] | None, TimeEstimate | None, Any]:
    from rlhf_lab.planning.throughput_cache import get_calibration

    result = get_calibration(model, device=device, threads=threads, mode=mode)
    if not result.ok:
        return None, not_calibrated(result.reason or "no calibration"), result
    return result.data, None, result


def _noted(estimate: TimeEstimate, result: Any) -> TimeEstimate:
    estimate.calibration = result.key
    if result.measured_now:
        data = result.data or {}
        load = data.get("load_avg_1m")
        estimate.note = (
            f"time calibration of {data.get('model')} on {data.get('device')} "
            f"({data.get('threads') or '-'} thread(s)) ran now: {result.seconds} s, cached"
            + (f" (machine load {load} while measuring)" if load is not None else "")
        )
    return estimate


def _stand_in_name(model: Any) -> str | None:
    """The model whose calibration times ``model`` (a run's final model: its base model's)."""
    from rlhf_lab.runs.lineage import stand_in

    try:
        return stand_in(model) if isinstance(model, str) else None
    except Exception:  # noqa: BLE001 - a pending upstream run: its base model's speed
        return None


def predict_run(
    family: str,
    algorithm: str,
    config: TrainerConfig,
    *,
    device: str = "cpu",
    threads: int | None = None,
    mode: str | None = None,
) -> TimeEstimate:
    """A run's predicted wall time on ``device`` (``mode``: see
    :func:`rlhf_lab.planning.throughput_cache.calibration_mode`); never raises."""
    name = _stand_in_name(config.get("model.name"))
    cal, missing, result = _with_calibration(name, device, threads, mode)
    if cal is None:
        return missing  # type: ignore[return-value]
    teacher = None
    if family == "distillation":
        teacher_name = _stand_in_name(config.get("teacher.name"))
        if teacher_name != name:
            teacher, _, _ = _with_calibration(teacher_name, device, threads, mode)
            if teacher is None:
                return not_calibrated(f"no throughput calibration of the teacher {teacher_name}")
    try:
        estimate = predict_from_calibration(cal, family, algorithm, config, teacher)
    except (KeyError, TypeError, ValueError) as err:
        return not_calibrated(f"the calibration lacks a figure: {err}")
    return _noted(estimate, result)


def evaluation_from_calibration(
    cal: dict[str, Any], eval_config: TrainerConfig, policies: int
) -> TimeEstimate:
    """An evaluation job (pure): ``prompts × n × max_new_tokens`` per policy, in batches of
    ``sampling.batch_size`` prompts, each policy loaded once."""
    if eval_config.get("suite") == "best_of_n":
        return best_of_n_from_calibration(cal, eval_config)
    prompts, n, new, batch = _job_sampling(eval_config, n=1, batch=16)
    prompt = typical_length(cal, "prompt", None)
    per_policy = batched_generation_seconds(cal, prompts, batch, n, prompt, new)
    parts = {
        "start": startup_seconds(cal, models=max(policies, 1)),
        "generation": policies * per_policy,
    }
    what = f"{policies} model(s) × {prompts} prompts × {n} samples"
    return _job_estimate(cal, parts, prompts, per_policy, what)


def _job_sampling(config: TrainerConfig, n: int, batch: int) -> tuple[int, int, int, int]:
    """(prompts, samples per prompt, new tokens, prompts per batch) of an evaluation job; ``n``
    and ``batch``: the suite's defaults."""
    g = config.get
    return (
        int(g("prompts.size", 64)),
        int(g("sampling.n", n)),
        int(g("sampling.max_new_tokens", 128)),
        int(g("sampling.batch_size", batch)),
    )


def _job_estimate(
    cal: dict[str, Any], parts: dict[str, float], prompts: int, work_s: float, what: str
) -> TimeEstimate:
    """An evaluation job's estimate: its ``parts`` summed, ``work_s`` (the sampling and scoring
    of one pass over the prompts) per prompt, and ``what`` it does in the text."""
    total = sum(parts.values())
    return TimeEstimate(
        calibrated=True,
        total_s=round(total, 1),
        per_step_s=round(work_s / max(prompts, 1), 3),
        steps=prompts,
        step_unit="prompts",
        parts={k: round(v, 1) for k, v in parts.items()},
        text=f"~{format_duration(total)} ({what})",
        device=str(cal.get("device")),
        threads=cal.get("threads"),
    )


def best_of_n_from_calibration(cal: dict[str, Any], eval_config: TrainerConfig) -> TimeEstimate:
    """A best_of_n job (pure): the policy samples ``n`` (n_max) completions of each prompt,
    ``batch_size`` prompts at a time (every row to ``max_new_tokens``: an upper bound), then
    the ORM and the PRM each score every completion once (a no-grad pass over the prompt and
    the completion, ``best_of_n.score_batch_size`` rows a pass); three models loaded. With
    ``best_of_n.samples_from`` nothing is sampled."""
    config = eval_config
    g = config.get
    prompts, n, new, batch = _job_sampling(config, n=16, batch=4)
    score_batch = int(g("best_of_n.score_batch_size", 16))
    prompt = typical_length(cal, "prompt", None)
    generation = batched_generation_seconds(cal, prompts, batch, n, prompt, new)
    what = f"{prompts} prompts × {n} samples, then ORM and PRM scoring"
    if g("best_of_n.samples_from"):
        generation = 0.0  # an earlier job's completions are scored again
        what = f"ORM and PRM scoring of {prompts} prompts × {n} earlier samples"
    one_scorer = forward_seconds(cal, prompts * n, score_batch, prompt + new)
    parts = {
        "start": startup_seconds(cal, models=3),
        "generation": generation,
        "scoring": 2 * one_scorer,
    }
    return _job_estimate(cal, parts, prompts, generation + 2 * one_scorer, what)


def predict_evaluation(
    model: str | None,
    eval_config: TrainerConfig,
    *,
    policies: int = 2,
    device: str = "cpu",
    threads: int | None = None,
    mode: str | None = None,
) -> TimeEstimate:
    """An evaluation job's predicted wall time (sampling suites; ``policies``: the target and
    its baseline)."""
    from rlhf_lab.runs.lineage import stand_in

    try:
        name = stand_in(model) if model else None
    except Exception:  # noqa: BLE001
        name = None
    cal, missing, result = _with_calibration(name, device, threads, mode)
    if cal is None:
        return missing  # type: ignore[return-value]
    return _noted(evaluation_from_calibration(cal, eval_config, policies), result)


def predict_planned_run(
    family: str, algorithm: str, config: TrainerConfig, device: str | None
) -> TimeEstimate:
    """A planned run's time on its recommended device (the CPU when none is recommended)."""
    kind = "cpu" if not device or device.startswith("cpu") else device.split(":")[0]
    return predict_run(family, algorithm, config, device=kind)


def plan_time_total(runs: list[Any], notes: list[str]) -> dict[str, Any]:
    """The plan's fields for its total: every run one after another (one training job per
    device), and the note of a calibration that ran for it (its cost)."""
    estimates = [r.time for r in runs if r.time is not None]
    ran = [e.note for e in estimates if e.note]
    update: dict[str, Any] = {"notes": [*notes, *dict.fromkeys(ran)]}
    missing = [r.name for r in runs if r.time is None or not r.time.calibrated]
    if not runs:
        return update
    if missing:
        update["time_total"] = f"time: not calibrated for {', '.join(missing)}"
        return update
    total = sum(e.total_s or 0.0 for e in estimates)
    update["time_total_s"] = round(total, 1)
    count = f"{len(runs)} runs, one after another" if len(runs) > 1 else "1 run"
    update["time_total"] = f"~{format_duration(total)} ({count})"
    return update


def launch_prediction(
    family: str, algorithm: str, config: TrainerConfig, device: str
) -> dict[str, Any] | None:
    """What a launch writes into run.json (``predicted_time``): the prediction from the cached
    calibration only (a launch never measures), None when there is none or anything fails."""
    kind = "cpu" if device.startswith("cpu") else device.split(":")[0]
    if kind not in ("cpu", "cuda"):
        return None  # a Slurm job runs elsewhere: this machine's throughput says nothing
    try:
        if family == "evaluation":
            policies = 1 + int(bool(config.get("baseline")))
            target = config.get("target")
            estimate = predict_evaluation(
                target if isinstance(target, str) else None,
                config,
                policies=policies,
                device=kind,
                mode="cached",
            )
        else:
            estimate = predict_run(family, algorithm, config, device=kind, mode="cached")
    except Exception:  # noqa: BLE001 - a prediction never stops a launch
        return None
    if not estimate.calibrated:
        return None
    keep = ("total_s", "per_step_s", "steps", "step_unit", "text", "threads", "calibration")
    return estimate.model_dump(include=set(keep))


# ---------------------------------------------------------------------------------------------
# Predicted vs actual (the ledger)
# ---------------------------------------------------------------------------------------------


def predicted_total_s(run_meta: dict[str, Any]) -> float | None:
    """The predicted wall time a launch wrote into run.json, if any."""
    predicted = run_meta.get("predicted_time")
    value = predicted.get("total_s") if isinstance(predicted, dict) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def wall_with_prediction(
    actual_text: str | None, actual_s: float | None, predicted_s: float | None
) -> str | None:
    """A run's wall-time cell: ``12.3 min (predicted ~14 min, 1.14×)``; the actual alone when
    there was no prediction, ``predicted ~14 min`` before it has run."""
    if predicted_s is None:
        return actual_text
    predicted = f"predicted ~{format_duration(predicted_s)}"
    if actual_s is None or actual_s <= 0 or actual_text is None:
        return predicted
    return f"{actual_text} ({predicted}, {predicted_s / actual_s:.2f}×)"


def campaign_time_line(briefs: list[dict[str, Any]]) -> str | None:
    """The campaign's total, predicted vs actual, over the runs that have both (None when no
    run has a prediction)."""
    pairs = [
        (b["predicted_s"], b["wall_s"]) for b in briefs if b.get("predicted_s") and b.get("wall_s")
    ]
    if not pairs:
        return None
    predicted = sum(p for p, _ in pairs)
    actual = sum(a for _, a in pairs)
    return (
        f"Campaign wall time: {format_duration(actual)} actual against ~"
        f"{format_duration(predicted)} predicted before launch ({predicted / actual:.2f}×, "
        f"{len(pairs)} of {len(briefs)} runs predicted)."
    )
