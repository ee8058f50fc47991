"""The work model of each family (:mod:`rlhf_lab.planning.time` describes them): seconds per step,
the parts of a run outside its steps and the models it loads, from a resolved config and a
throughput calibration (``cal``) through the formulas of :mod:`rlhf_lab.planning.time_formulas`.
Each family's function returns ``(seconds per step, parts, models loaded)``. Torch-free."""

from __future__ import annotations

import math
from typing import Any

from rlhf_lab.planning.completion_length import completion_tokens
from rlhf_lab.planning.time_formulas import (
    batched_generation_seconds,
    evals_in_run,
    forward_seconds,
    generation_seconds,
    supervised_step_seconds,
    typical_length,
)
from rlhf_lab.planning.trainer_config import TrainerConfig

# Built-in data sets whose typical lengths the calibration measures (trainers.core.throughput).
_SFT_BUILTIN = "builtin:reasoning-sft"
_PREFERENCE_BUILTIN = ("builtin:reasoning-preferences", "builtin:preferences")


def setting(config: TrainerConfig, key: str, default: Any = None) -> Any:
    value = config.get(key, default)
    return default if value is None else value


def lora(config: TrainerConfig) -> bool:
    return bool(setting(config, "model.lora.enabled", False))


def checkpointing(config: TrainerConfig) -> bool:
    return bool(setting(config, "model.gradient_checkpointing", False))


def _sample_seconds(cal: dict[str, Any], config: TrainerConfig, steps: int) -> float:
    """The few samples an SFT / direct-alignment run writes every ``sample_every`` steps."""
    n = int(setting(config, "eval.num_samples", 0))
    new = int(setting(config, "eval.sample_max_new_tokens", 0))
    events = evals_in_run(steps, int(setting(config, "eval.sample_every", 0)))
    prompt = typical_length(cal, "prompt", None)
    return events * generation_seconds(cal, n, 1, prompt, new)


def _supervised(
    cal: dict[str, Any], config: TrainerConfig, steps: int, shape: tuple[float, float, int]
) -> tuple[float, dict[str, float]]:
    """(seconds per step, parts) shared by SFT, direct alignment and reward models; ``shape``:
    (tokens per row, of them through the LM head, rows per example)."""
    length, head, rows_per_example = shape
    batch = int(setting(config, "train.batch_size", 1))
    accum = int(setting(config, "train.gradient_accumulation_steps", 1))
    rows = batch * accum * rows_per_example
    per_step = supervised_step_seconds(
        cal,
        rows,
        batch * rows_per_example,
        length,
        lora=lora(config),
        gc=checkpointing(config),
        head=head,
    )
    eval_rows = int(setting(config, "data.eval_size", 0)) * rows_per_example
    eval_batch = int(setting(config, "eval.eval_batch_size", batch)) * rows_per_example
    evals = evals_in_run(steps, int(setting(config, "eval.eval_every", 0)))
    parts = {
        "steps": steps * per_step,
        "eval": evals * forward_seconds(cal, eval_rows, eval_batch, length, head),
        "samples": _sample_seconds(cal, config, steps),
    }
    return per_step, parts


def sft(cal: dict[str, Any], config: TrainerConfig, steps: int):
    cap = int(setting(config, "data.max_length", 0)) or None
    dataset = str(setting(config, "data.dataset", ""))
    length = typical_length(cal, "demonstration", cap) if dataset.startswith(_SFT_BUILTIN) else cap
    length = float(length or 0)
    answer = max(length - typical_length(cal, "prompt", None), 0.0)  # the trained final turn
    per_step, parts = _supervised(cal, config, steps, (length, answer or length, 1))
    return per_step, parts, 1


def _pair_length(cal: dict[str, Any], config: TrainerConfig, packed: bool) -> float:
    """A preference row: prompt + chosen + rejected packed in one row, or prompt + one response."""
    cap = int(setting(config, "data.max_length", 0)) or None
    dataset = str(setting(config, "data.dataset", ""))
    if not dataset.startswith(_PREFERENCE_BUILTIN):
        return float(cap or 0)
    prompt = typical_length(cal, "prompt", None)
    responses = typical_length(cal, "chosen", None) + typical_length(cal, "rejected", None)
    length = prompt + responses if packed else prompt + responses / 2
    return min(length, float(cap)) if cap else length


def _needs_reference(loss: str) -> bool:
    """Whether a direct-alignment loss compares against a frozen reference (SimPO, ORPO: no)."""
    from rlhf_lab.planning.catalog import algorithm_spec

    return bool(algorithm_spec(loss).needs_reference)


def direct_alignment(cal: dict[str, Any], config: TrainerConfig, algorithm: str, steps: int):
    length = _pair_length(cal, config, packed=True)
    responses = typical_length(cal, "chosen", None) + typical_length(cal, "rejected", None)
    head = min(responses, length) or length  # log-probs of both responses
    per_step, parts = _supervised(cal, config, steps, (length, head, 1))
    reference = _needs_reference(algorithm)
    pairs = int(setting(config, "data.max_samples", 0)) if reference else 0
    batch = int(setting(config, "eval.eval_batch_size", setting(config, "train.batch_size", 1)))
    parts["reference"] = forward_seconds(cal, pairs, batch, length, head)
    parts["gold"] = _gold_seconds(cal, config, steps)
    copies = not lora(config)  # full fine-tuning loads the reference on its own ...
    models = 1 + int(reference and copies) + int(parts["gold"] > 0 and copies)  # ... gold KL too
    return per_step, parts, models


def online_dpo(cal: dict[str, Any], config: TrainerConfig, steps: int):
    """Online DPO (trainers/direct_alignment/online.py). Per optimizer step: ``batch × accum``
    prompts, each sampled ``online.num_samples`` times by the current policy (prefill +
    ``online.max_new_tokens`` decode steps at prompts × samples rows); the ranker's reward model,
    when there is one, reads every sample without gradients (timed with the policy's
    calibration: a reward model of the policy's size); then, per micro-batch of ``batch_size``
    pairs, a forward + backward of the policy and a no-grad pass of the reference (when the
    pair loss has one) over the packed pair rows (prompt + both completions, the completions
    through the LM head). Every prompt counts as a pair and every sample runs to the limit: an
    upper bound (a tie gives no pair). Held out, at step 0, every ``eval_every`` steps and at
    the end: the held-out pairs through the policy (through the reference once) and greedy
    completions of their prompts, ``eval_batch_size`` a call, scored by the ranker (at the end
    only when ``eval_every`` is 0)."""
    batch = int(setting(config, "train.batch_size", 1))
    prompts = batch * int(setting(config, "train.gradient_accumulation_steps", 1))
    k = int(setting(config, "online.num_samples", 2))
    new = int(setting(config, "online.max_new_tokens", 64))
    reward_model = bool(setting(config, "reward.model"))
    score_batch = int(setting(config, "reward.score_batch_size", 16))
    reference = _needs_reference(str(setting(config, "online.loss", "dpo")))
    prompt = typical_length(cal, "prompt", None)
    pair, completion = prompt + 2 * new, prompt + new

    per_step = generation_seconds(cal, prompts, k, prompt, new)
    per_step += reward_model * forward_seconds(cal, prompts * k, score_batch, completion)
    per_step += supervised_step_seconds(
        cal, prompts, batch, pair, lora=lora(config), gc=checkpointing(config), head=2 * new
    )
    per_step += reference * forward_seconds(cal, prompts, batch, pair, head=2 * new)

    held_out = int(setting(config, "data.eval_size", 0))
    eval_batch = int(setting(config, "eval.eval_batch_size", batch))
    one_eval = forward_seconds(cal, held_out, eval_batch, pair, head=2 * new)
    one_eval += batched_generation_seconds(cal, held_out, eval_batch, 1, prompt, new)
    one_eval += reward_model * forward_seconds(cal, held_out, score_batch, completion)
    every = int(setting(config, "eval.eval_every", 0))
    evals = (evals_in_run(steps, every) if every > 0 else 1) if held_out else 0  # the end's
    parts = {
        "steps": steps * per_step,
        "eval": evals * one_eval,
        "reference": reference * forward_seconds(cal, held_out, eval_batch, pair, head=2 * new),
    }
    return per_step, parts, 1 + int(reference) + int(reward_model)


def rejection_sampling(cal: dict[str, Any], config: TrainerConfig, steps: int):
    """Rejection sampling (trainers/rejection_sampling/train.py), stage by stage: the pool
    (``max_train_samples`` prompts, ``rollout_batch_size`` a call, each sampled
    ``num_completions_per_prompt`` times to ``max_new_tokens``: every row to the limit, an
    upper bound); its scores (the verifier is free here; a reward model, ``scorer.name``, reads
    every completion, ``score_batch_size`` a pass, timed with the policy's calibration); the
    starting policy's greedy completions of the ``max_test_samples`` held-out prompts
    (``eval.baseline``); the SFT stage, ``steps`` optimizer steps over prompt + completion rows
    (the completion through the LM head); the SFT model's greedy completions of the held-out
    prompts. Models: the policy, the SFT stage's own load, the final model (and a reward model).
    ``stages``: the libraries the stages import that a calibration's start-up does not (the SFT
    stage's ``datasets``, the plots' matplotlib), about one more torch import (measured on this
    project's machine: ``datasets`` 3.0 s beside torch's 4.1 s in the same process).
    The pool and the baseline are cached per model, data and sampling, shared by the four
    strategies: a run that finds them skips parts ``pool``, ``scoring`` and ``baseline``."""
    prompts = int(setting(config, "data.max_train_samples", 0))
    held_out = int(setting(config, "data.max_test_samples", 0) or 0)
    n = int(setting(config, "generation.num_completions_per_prompt", 1))
    new = int(setting(config, "generation.max_new_tokens", 512))
    call = int(setting(config, "generation.rollout_batch_size", 8))
    eval_new = int(setting(config, "eval.eval_max_new_tokens", new))
    eval_batch = int(setting(config, "eval.eval_batch_size", 8))
    prompt = typical_length(cal, "prompt", None)
    reward_model = str(setting(config, "scorer.name", "verifier")) != "verifier"
    score_batch = int(setting(config, "scorer.score_batch_size", 2))
    cap = int(setting(config, "sft.max_seq_length", 0)) or None
    row = min(prompt + new, float(cap)) if cap else prompt + new
    batch = int(setting(config, "sft.batch_size", 1))
    per_step = supervised_step_seconds(
        cal,
        batch * int(setting(config, "sft.gradient_accumulation_steps", 1)),
        batch,
        row,
        lora=lora(config),
        gc=checkpointing(config),
        head=max(row - prompt, 0.0),
    )
    greedy = batched_generation_seconds(cal, held_out, eval_batch, 1, prompt, eval_new)
    sft_eval = int(setting(config, "sft.eval_size", 0))
    parts = {
        "pool": batched_generation_seconds(cal, prompts, call, n, prompt, new),
        "scoring": reward_model * forward_seconds(cal, prompts * n, score_batch, prompt + new),
        "baseline": greedy if bool(setting(config, "eval.baseline", True)) else 0.0,
        "steps": steps * per_step,
        "eval": greedy + forward_seconds(cal, sft_eval, eval_batch, row, head=row - prompt),
        "stages": float(cal["startup"]["import_s"]),
    }
    return per_step, parts, 3 + int(reward_model)


def _gold_seconds(cal: dict[str, Any], config: TrainerConfig, steps: int) -> float:
    """The gold evaluation (``eval.gold_prompts`` > 0) at every evaluation: a greedy and a
    sampled decode of all its prompts in one batch (rows to the limit: an upper bound), then the
    sampled answers through the policy and the reference, ``eval_batch_size`` rows a pass
    (trainers/direct_alignment/gold.py)."""
    n = int(setting(config, "eval.gold_prompts", 0))
    if n <= 0:
        return 0.0
    new = int(setting(config, "eval.gold_max_new_tokens", 128))
    batch = int(setting(config, "eval.eval_batch_size", n))
    prompt = typical_length(cal, "prompt", None)
    decode = 2 * generation_seconds(cal, n, 1, prompt, new)
    scoring = 2 * forward_seconds(cal, n, batch, prompt + new, head=new)
    return evals_in_run(steps, int(setting(config, "eval.eval_every", 0))) * (decode + scoring)


def reward_models(cal: dict[str, Any], config: TrainerConfig, steps: int):
    length = _pair_length(cal, config, packed=False)
    rows = 2 if str(setting(config, "kind", "preference")) == "preference" else 1
    per_step, parts = _supervised(cal, config, steps, (length, 0.0, rows))  # a scalar head
    return per_step, parts, 1


def _pg_rollout_seconds(cal: dict[str, Any], config: TrainerConfig, algorithm: str) -> float:
    """One rollout step of a policy-gradient run: sampling, no-grad passes, updates."""
    from rlhf_lab.planning.catalog import algorithm_spec

    prompts = int(setting(config, "rollout.prompts_per_step", 4))
    rollouts = int(setting(config, "rollout.num_rollouts", 8))
    new = completion_tokens(config, default_new_tokens=128)  # a trajectory: its tool replies too
    batch = int(setting(config, "train.batch_size", 1))
    accum = int(setting(config, "train.gradient_accumulation_steps", 1))
    updates = int(setting(config, "loss.updates_per_rollout", 1))
    prompt = typical_length(cal, "prompt", None)
    rows, length = prompts * rollouts, prompt + new
    seconds = generation_seconds(cal, prompts, rollouts, prompt, new)
    spec = algorithm_spec(algorithm)
    optimizer_steps = math.ceil(math.ceil(rows / batch) / accum)
    no_grad = int(bool(spec.needs_old_logprobs) and (updates > 1 or optimizer_steps > 1))
    no_grad += int(float(setting(config, "loss.beta", 0.0)) > 0 and spec.kl != "none")
    seconds += no_grad * forward_seconds(cal, rows, batch, length, head=new)
    per_update = optimizer_steps * supervised_step_seconds(
        cal, batch * accum, batch, length, lora=lora(config), gc=checkpointing(config), head=new
    )
    return seconds + updates * per_update


def policy_gradients(cal: dict[str, Any], config: TrainerConfig, algorithm: str, steps: int):
    per_step = _pg_rollout_seconds(cal, config, algorithm)
    held_out = int(setting(config, "data.eval_size", 0))
    per_turn = setting(config, "eval.max_new_tokens", 0) or None
    new = completion_tokens(config, per_turn, default_new_tokens=128)
    batch = int(setting(config, "eval.eval_batch_size", held_out or 1))
    prompt = typical_length(cal, "prompt", None)
    one_eval = batched_generation_seconds(cal, held_out, batch, 1, prompt, new)
    evals = evals_in_run(steps, int(setting(config, "eval.eval_every", 0)))
    models = 1 + int(bool(setting(config, "reward.model")))
    models += int(float(setting(config, "loss.beta", 0.0)) > 0 and not lora(config))
    return per_step, {"steps": steps * per_step, "eval": evals * one_eval}, models


def distillation(
    cal: dict[str, Any], config: TrainerConfig, steps: int, teacher: dict[str, Any]
) -> tuple[float, dict[str, float], int]:
    """On-policy distillation (trainers/distillation/train.py): ``teacher`` is the teacher's
    calibration."""
    batch = int(setting(config, "train.batch_size", 8))
    accum = int(setting(config, "train.gradient_accumulation_steps", 1))
    k = int(setting(config, "rollout.num_samples", 1))
    new = int(setting(config, "rollout.max_new_tokens", 128))
    prompt = typical_length(cal, "prompt", None)
    rows, micro, length = batch * accum * k, batch * k, prompt + new
    per_step = generation_seconds(cal, batch * accum, k, prompt, new)
    per_step += forward_seconds(teacher, rows, micro, length, head=new)
    per_step += supervised_step_seconds(
        cal, rows, micro, length, lora=lora(config), gc=checkpointing(config), head=new
    )
    held_out = int(setting(config, "data.eval_size", 0))
    eval_new = int(setting(config, "eval.max_new_tokens", 0) or new)
    eval_batch = int(setting(config, "eval.eval_batch_size", 32))
    every = int(setting(config, "eval.eval_every", 0))
    student_evals = evals_in_run(steps, every) if every > 0 else int(held_out > 0)  # the end
    evals = student_evals * batched_generation_seconds(
        cal, held_out, eval_batch, 1, prompt, eval_new
    )
    evals += batched_generation_seconds(teacher, held_out, eval_batch, 1, prompt, eval_new)
    return per_step, {"steps": steps * per_step, "eval": evals}, 2


def rollout_steps(config: TrainerConfig) -> int:
    max_steps = setting(config, "train.max_steps")
    if max_steps:
        return int(max_steps)
    epochs = int(setting(config, "train.num_epochs", 1))
    size = int(setting(config, "data.size", 0))
    return max(1, epochs * (size // max(int(setting(config, "rollout.prompts_per_step", 1)), 1)))
