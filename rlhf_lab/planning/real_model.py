"""The shrink's rules for a pretrained model (not a built-in preset). Torch-free: the model's size
and architecture come from its ``config.json`` (:func:`rlhf_lab.planning.memory.model_facts`), never from
loading it.

* **LoRA on a CPU** for a model of at least :data:`LORA_MIN_PARAMS` parameters: adapters on the
  architecture's attention and MLP projections (``trainers.core.lora.DEFAULT_TARGETS``: q, k, v,
  o, gate, up, down for a Llama or Qwen), rank by width (:func:`lora_rank`), alpha twice the
  rank, and the recipe's full fine-tuning learning rate ×10 (at most 2e-4), the usual ratio
  between the two. Any ``model.lora.*`` override of the user's keeps the shrink off LoRA
  entirely (``model.lora.enabled=false`` is full fine-tuning).
* **Gradient checkpointing only when the memory estimate needs it**: off when the run's estimate
  without it fits this machine's free memory (it costs ~30% of a step), on otherwise.
* **CPU sizes** a 2-core machine finishes for a ~135M model: preference pairs, demonstrations
  and reward-model samples of 256 tokens at most (the built-in sets are under 120 tokens with
  SmolLM2's chat template), micro-batch 4 × 2 accumulation, 320 samples, 32 held out; policy
  gradients 4 prompts × 4 completions of at most 128 new tokens, one optimizer step per rollout,
  32 held-out prompts (a multi-turn run: tool replies of at most 32 tokens and trajectories of at
  most 256 tokens in all); 128 new tokens at most for every other generation.
* **Gold evaluation** of an offline direct-alignment run on the built-in reasoning preferences
  (:mod:`rlhf_lab.planning.gold_eval`): verifier on greedy held-out answers and KL to the
  reference, at step 0 and six times along training.

:func:`pretrained_rules` applies them in that order (sizes, then LoRA, then checkpointing, whose
estimate sees the others). A calibration of the base model may later fix the generation limits:
``rlhf_lab.planning.shrink.shrink_config(..., calibration=[...])`` takes its overrides.
"""

from __future__ import annotations

from typing import Any

from rlhf_lab.errors import LabError
from rlhf_lab.planning.overrides import Override
from rlhf_lab.planning.trainer_config import TrainerConfig

__all__ = [
    "LORA_LR_CEILING",
    "LORA_LR_FACTOR",
    "LORA_MIN_PARAMS",
    "free_memory_gb",
    "lora_rank",
    "pretrained_model_rules",
    "pretrained_rules",
    "runs_on_cpu",
]

LORA_MIN_PARAMS = 50_000_000
"""Below this a full fine-tuning step on a CPU is cheap enough (the presets are 1M-30M)."""
LORA_LR_FACTOR = 10.0
LORA_LR_CEILING = 2e-4

CPU_MAX_LENGTH = 256
CPU_SAMPLES = 320
CPU_EVAL_SIZE = 32
CPU_BATCH = 4
CPU_ACCUMULATION = 2
CPU_NEW_TOKENS = 128
CPU_ORM_PROMPTS = 64
CPU_ORM_COMPLETIONS = 4
CPU_PG_PROMPTS = 4
CPU_PG_ROLLOUTS = 4
CPU_PG_MICRO_BATCH = 8
CPU_OBSERVATION_TOKENS = 32
CPU_TRAJECTORY_TOKENS = 2 * CPU_NEW_TOKENS


def runs_on_cpu(config: TrainerConfig) -> bool:
    """Whether a run of ``config`` trains on the CPU here: ``model.device=cpu``, or ``auto`` on
    a machine with no GPU the lab can see (:func:`rlhf_lab.runs.machine.this_machine`)."""
    device = str(config.get("model.device") or "auto")
    if device == "cpu":
        return True
    if device.startswith("cuda"):
        return False
    from rlhf_lab.runs.machine import this_machine

    return not this_machine().gpus()


def free_memory_gb(cpu: bool) -> float | None:
    """Free memory where the run would train: available RAM on the CPU, else the freest GPU's
    free memory; None when it cannot be read."""
    from rlhf_lab.runs.machine import this_machine

    machine = this_machine()
    if cpu:
        return machine.free_ram_gb()
    return max((g.free_gb for g in machine.gpus()), default=None)


def lora_rank(hidden_size: int) -> int:
    """8 below a width of 512, 16 up to 2048 (SmolLM2-135M: 576), 32 above."""
    if hidden_size < 512:
        return 8
    return 16 if hidden_size <= 2048 else 32


# ---------------------------------------------------------------------------------------------
# CPU sizes
# ---------------------------------------------------------------------------------------------


def _cap(r: Any, key: str, limit: int) -> None:
    """``key`` at most ``limit``, read after the rules so far (``None``, "all", becomes
    ``limit``); a key the config lacks is left alone."""
    current = r.get(key)
    if isinstance(current, bool) or not isinstance(current, int | float | None):
        return
    r.set(key, limit if current is None else int(min(current, limit)))


def _pairs_and_demonstrations(r: Any, algorithm: str) -> None:
    if algorithm == "orm":  # max_samples counts prompts, each with several completions
        _cap(r, "data.max_samples", CPU_ORM_PROMPTS)
        _cap(r, "data.rollouts_per_prompt", CPU_ORM_COMPLETIONS)
        _cap(r, "data.eval_size", CPU_ORM_PROMPTS // 4)
    else:
        _cap(r, "data.max_samples", CPU_SAMPLES)
        _cap(r, "data.eval_size", CPU_EVAL_SIZE)
    _cap(r, "data.max_length", CPU_MAX_LENGTH)
    r.set("train.batch_size", CPU_BATCH)
    r.set("train.gradient_accumulation_steps", CPU_ACCUMULATION)


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _policy_gradient_sizes(r: Any) -> None:
    _cap(r, "rollout.prompts_per_step", CPU_PG_PROMPTS)
    _cap(r, "rollout.num_rollouts", CPU_PG_ROLLOUTS)
    prompts = int(r.get("rollout.prompts_per_step") or 1)
    sequences = prompts * int(r.get("rollout.num_rollouts") or 1)
    micro = _largest_divisor(sequences, CPU_PG_MICRO_BATCH)
    r.set("train.batch_size", micro)
    r.set("train.gradient_accumulation_steps", max(1, sequences // micro))  # one step a rollout
    steps = r.get("train.max_steps")
    if isinstance(steps, int) and steps > 0:
        _cap(r, "data.size", prompts * steps)
    _cap(r, "data.eval_size", CPU_EVAL_SIZE)
    _cap(r, "rollout.max_new_tokens", CPU_NEW_TOKENS)
    if r.get("env.name") is not None:
        _trajectory_sizes(r)


def _trajectory_sizes(r: Any) -> None:
    """A multi-turn run's tool replies and whole trajectory: at most
    :data:`CPU_OBSERVATION_TOKENS` a reply and :data:`CPU_TRAJECTORY_TOKENS` in all (a tool call,
    its reply and an answer fit; the full ``max_turns`` turns of ``max_new_tokens`` each would
    triple a CPU step), never more than the turns can fill."""
    from rlhf_lab.planning.completion_length import env_value, trajectory_bound

    _cap(r, "env.max_observation_tokens", CPU_OBSERVATION_TOKENS)
    turns = env_value("max_turns", r.get("env.max_turns"))
    observation = env_value("max_observation_tokens", r.get("env.max_observation_tokens"))
    bound = trajectory_bound(turns, int(r.get("rollout.max_new_tokens")), observation)
    _cap(r, "env.max_total_tokens", min(bound, CPU_TRAJECTORY_TOKENS))


def _generation_caps(r: Any) -> None:
    """At most 128 new tokens wherever the config generates."""
    for key in (
        "eval.sample_max_new_tokens",
        "online.max_new_tokens",
        "rollout.max_new_tokens",
        "generation.max_new_tokens",
        "eval.eval_max_new_tokens",
        "eval.max_new_tokens",
    ):
        if isinstance(r.get(key), int):  # None ("as the rollouts") stays
            _cap(r, key, CPU_NEW_TOKENS)


def cpu_size_rules(r: Any, family: str, algorithm: str, notes: list[str]) -> None:
    """Sizes a 2-core CPU finishes with a ~135M model (module doc)."""
    if family in ("sft", "direct_alignment", "reward_models"):
        _pairs_and_demonstrations(r, algorithm)
    elif family == "policy_gradients":
        _policy_gradient_sizes(r)
    _generation_caps(r)
    if family == "policy_gradients":
        sized = (
            f"rollouts of {r.get('rollout.prompts_per_step')} prompts × "
            f"{r.get('rollout.num_rollouts')} completions of at most "
            f"{r.get('rollout.max_new_tokens')} new tokens, one optimizer step each"
        )
        if r.get("env.name") is not None:
            sized += (
                f"; trajectories of at most {r.get('env.max_turns')} model turns and "
                f"{r.get('env.max_total_tokens')} tokens with the tool replies (at most "
                f"{r.get('env.max_observation_tokens')} tokens each)"
            )
    elif family in ("sft", "direct_alignment", "reward_models"):
        sized = (
            f"{r.get('data.max_samples')} samples of at most {r.get('data.max_length')} tokens, "
            f"micro-batches of {r.get('train.batch_size')}"
        )
    else:
        sized = f"at most {CPU_NEW_TOKENS} new tokens per generation"
    notes.append(f"sized for a CPU: {sized}; {CPU_EVAL_SIZE} held-out items at most")


# ---------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------


def _lora_learning_rate(r: Any, family: str, user_keys: set[str], notes: list[str]) -> None:
    from trainers.core.spec import family_spec

    key = family_spec(family).learning_rate_key
    current = r.get(key)
    if key in user_keys or not isinstance(current, int | float) or current <= 0:
        return
    lr = min(float(current) * LORA_LR_FACTOR, LORA_LR_CEILING)
    r.set(key, float(f"{lr:.3g}"))
    notes.append(
        f"{key} {lr:.3g}: the recipe's full fine-tuning rate ×{LORA_LR_FACTOR:g} (at most "
        f"{LORA_LR_CEILING:g}), the usual ratio for adapters; a starting point, not a tuned value"
    )


def lora_rules(r: Any, family: str, facts: Any, user_keys: set[str], notes: list[str]) -> None:
    """LoRA by default for a model of at least :data:`LORA_MIN_PARAMS` (on a CPU; the caller
    decides). Nothing when the user set any ``model.lora.*`` key or the recipe is LoRA already."""
    from trainers.core.lora import DEFAULT_TARGETS

    if any(k.startswith("model.lora.") for k in user_keys) or r.get("model.lora.enabled"):
        return
    if r.base.get("model.lora.enabled", None) is None:
        return  # a config without a LoRA section
    params = facts.params
    if params.total < LORA_MIN_PARAMS:
        return
    arch = params.arch
    rank = lora_rank(arch.hidden_size) if arch is not None else 16
    targets = DEFAULT_TARGETS.get(arch.model_type) if arch is not None else None
    r.set("model.lora.enabled", True)
    r.set("model.lora.rank", rank)
    r.set("model.lora.alpha", float(2 * rank))
    if targets:
        r.set("model.lora.target_modules", list(targets))
    on = ", ".join(targets) if targets else "every linear layer but the LM head"
    notes.append(
        f"LoRA (rank {rank}, alpha {2 * rank}) on {on}: {params.total / 1e6:.0f}M parameters "
        "train slowly in full on a CPU; the override model.lora.enabled=false trains in full"
    )
    _lora_learning_rate(r, family, user_keys, notes)


# ---------------------------------------------------------------------------------------------
# Gradient checkpointing
# ---------------------------------------------------------------------------------------------


def _estimate_gb(r: Any, family: str, algorithm: str, checkpointing: bool, cpu: bool) -> float:
    from rlhf_lab.planning.memory import estimate_memory

    config = r.preview(Override.of("model.gradient_checkpointing", checkpointing))
    device = "cpu" if cpu else "cuda"
    return estimate_memory(family, algorithm, config, device=device).total_gb


def checkpointing_rule(r: Any, family: str, algorithm: str, cpu: bool, notes: list[str]) -> None:
    """Gradient checkpointing off when the estimate without it fits the free memory, on when
    only the estimate with it does (or neither: the smaller one); kept as configured when the
    estimate or the free memory cannot be known here."""
    from rlhf_lab.planning.memory import fits

    free = free_memory_gb(cpu)
    try:
        without = _estimate_gb(r, family, algorithm, False, cpu)
    except (LabError, KeyError, ValueError):  # no estimate here: keep the recipe's setting
        return
    if free is None:
        return
    where = "RAM" if cpu else "GPU memory"
    if fits(without, free):
        was = bool(r.get("model.gradient_checkpointing"))
        r.set("model.gradient_checkpointing", False)
        if was:
            notes.append(
                f"gradient checkpointing off: the estimate without it (~{without:.1f} GiB) fits "
                f"the free {where} ({free:.1f} GiB), and it costs ~30% of a step"
            )
        return
    r.set("model.gradient_checkpointing", True)
    notes.append(
        f"gradient checkpointing on: the estimate without it (~{without:.1f} GiB) does not fit "
        f"the free {where} ({free:.1f} GiB)"
    )


def pretrained_rules(
    r: Any, family: str, algorithm: str, facts: Any, user_keys: set[str], notes: list[str]
) -> None:
    """Every rule of this module for a pretrained model whose size is ``facts``
    (:class:`rlhf_lab.planning.memory.ModelFacts`; None when unknown here)."""
    cpu = runs_on_cpu(r.base)
    if cpu:
        cpu_size_rules(r, family, algorithm, notes)
        if facts is not None:
            lora_rules(r, family, facts, user_keys, notes)
    if "model.gradient_checkpointing" not in user_keys and facts is not None:
        checkpointing_rule(r, family, algorithm, cpu, notes)


def pretrained_model_rules(
    r: Any, family: str, algorithm: str, user: list[Override], notes: list[str]
) -> None:
    """What ``rlhf_lab.planning.shrink`` applies to a pretrained model after the family's rules: offline
    data (:mod:`rlhf_lab.planning.offline_data`), then :func:`pretrained_rules` with the model's
    facts read from its config.json (None when this machine cannot tell), then the gold
    evaluation of an offline direct-alignment run (:mod:`rlhf_lab.planning.gold_eval`)."""
    from rlhf_lab.planning.gold_eval import gold_eval_rules
    from rlhf_lab.planning.memory import model_facts
    from rlhf_lab.planning.offline_data import offline_data_rules

    keys = {o.key for o in user}  # the dotted keys the user's overrides set
    offline_data_rules(r, family, algorithm, keys, notes)
    name = r.get("model.name")
    try:
        facts = model_facts(name) if isinstance(name, str) else None
    except LabError:
        facts = None
    pretrained_rules(r, family, algorithm, facts, keys, notes)
    gold_eval_rules(r, family, algorithm, user, notes)
