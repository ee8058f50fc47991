"""What each stage of a rollout step processed: its tokens and model FLOPs, for the step's
``timing/<stage>_s``, ``tokens/<stage>``, ``throughput/<stage>_tokens_per_s`` and
``mfu/<stage>`` (:class:`trainers.core.flops.StageClock`; README "Where the time goes").

The stages, in the order the step runs them: ``generate`` (the rollouts; ReMax's greedy
baseline is timed here but its tokens are not counted), ``score`` (verifier and reward models),
``reference`` (π_ref log-probs), ``old_logps`` (π_old log-probs), ``values`` (the critic's
values), ``advantages`` (KL shaping and the estimator: arithmetic, no model FLOPs), ``update``
(every pass of ``updates_per_rollout``; a critic trains in the same passes) and, under torchrun,
``weight_gather`` (the seconds spent gathering whole weights to generate).

Tokens follow trainers.core.flops' convention: non-padding tokens, a group's prompt once (the
rollouts prefill it once and the log-prob passes share it), the LM head at the completion
positions (generation: at each sampled token). A pass over the batch is ``prompt + completion``
tokens; generation reports the tokens it sampled; scoring reports every row's tokens (a reward
model reads each row whole). Tokens are summed over every rank and the peak is that of all the
run's devices together, so each MFU is the whole run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainers.core.distributed import gather_sum, world
from trainers.core.flops import ModelFlops, Work, measured_peak, model_flops
from trainers.policy_gradients.experience import Experience


@dataclass(frozen=True)
class StepShapes:
    """The models a rollout step runs, as :class:`ModelFlops`, and the devices' peak FLOP/s."""

    policy: ModelFlops
    peak: float
    value: ModelFlops | None = None  # the critic (PPO)
    scorers: tuple[ModelFlops, ...] = ()  # reward models scoring the rollouts (proxy, gold)


def step_shapes(policy, value_model, reward_models: Any, device, dtype) -> StepShapes:
    """:class:`StepShapes` of the run's policy (the reference has its shape), critic and reward
    models (``reward_models``: rollout.RewardModels); the peak measured now, once a process."""
    scorers = [s for s in (reward_models.proxy, reward_models.gold) if s is not None]
    return StepShapes(
        policy=model_flops(policy),
        peak=measured_peak(device, dtype) * world().size,
        value=model_flops(value_model) if value_model is not None else None,
        scorers=tuple(model_flops(s.model) for s in scorers),
    )


@dataclass(frozen=True)
class StepTokens:
    """The tokens of a rollout batch (over every rank)."""

    prompt: float  # each group's prompt once
    completion: float  # completion-side tokens the rows attend (tool replies included)
    sampled: float  # tokens the policy sampled (the trainable mask)
    rows: float  # every row's prompt and completion tokens


def step_tokens(exp: Experience, group_size: int) -> StepTokens:
    """:class:`StepTokens` of ``exp``, whose rows come in groups of ``group_size`` rows sharing
    a prompt (collective: summed over every rank)."""
    width_p = exp.prompt_width
    prompt = float(exp.prompt_lens[::group_size].sum())
    completion = float(exp.attention_mask[:, width_p:].sum())
    sampled = float(exp.completion_mask.sum())
    rows = float(exp.attention_mask.sum())
    return StepTokens(*gather_sum([prompt, completion, sampled, rows]))


def stage_work(drawn: StepTokens, t: StepTokens, s: StepShapes, updates: int) -> dict[str, Work]:
    """Tokens and model FLOPs of every stage that runs a model (module doc): ``drawn`` are the
    tokens the step generated and scored (DAPO: every round, before its filter), ``t`` those it
    updates on; ``updates``: the passes over the batch (``loss.updates_per_rollout``)."""
    batch = t.prompt + t.completion
    logps = Work(batch, s.policy.forward(batch, t.completion))
    train = s.policy.training(batch, t.completion)
    sampled = drawn.prompt + drawn.completion
    work = {
        "generate": Work(drawn.sampled, s.policy.forward(sampled, drawn.sampled)),
        "score": Work(drawn.rows, sum(rm.forward(drawn.rows, 0) for rm in s.scorers)),
        "reference": logps,
        "old_logps": logps,
    }
    if s.value is not None:
        work["values"] = Work(batch, s.value.forward(batch, 0))
        train += s.value.training(batch, 0)
    work["update"] = Work(batch * updates, train * updates)
    return work


def stage_metrics(clock, drawn: Experience, exp: Experience, shapes: StepShapes, cfg: Any):
    """The step's stage metrics (:meth:`StageClock.row` up to now) for the rollouts it
    ``drawn`` and the batch ``exp`` it updated on (collective)."""
    G = cfg.rollout.num_rollouts
    work = stage_work(
        step_tokens(drawn, G), step_tokens(exp, G), shapes, cfg.loss.updates_per_rollout
    )
    return clock.row(work, shapes.peak, clock.dt)


def prepare_seconds(clock) -> float:
    """Seconds between the rollout and the update (``timing/prepare_s``): the reference, π_old,
    value and advantage stages together."""
    stages = ("reference", "old_logps", "values", "advantages")
    return sum(clock.seconds.get(k, 0.0) for k in stages)
