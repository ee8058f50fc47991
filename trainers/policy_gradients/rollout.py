"""The rollout phase: generate, score, and get everything the update needs.

One rollout step, as in the algorithm box:

1. ``generate_group_batch`` (:mod:`.generation`) — each prompt is prefilled once and its
   ``num_rollouts`` completions are sampled from the repeated KV cache.
2. ``score`` — rewards.compute_rewards on the decoded completions (DAPO adds the overlong
   penalty).
3. DAPO only (``rollout_step``): dynamic sampling keeps drawing prompts until
   ``prompts_per_step`` groups with differing correctness are kept, within a bound.
4. ``prepare_update`` — π_old log-probs (only when the update needs them: see
   ``PolicyGradientConfig.needs_old_logps``), reference log-probs (β > 0), values for an
   algorithm with a value model; KL shaping of the reward where the spec puts the KL in the
   reward; advantages by the estimator the algorithm's spec names.

The result is an :class:`~.experience.Experience` that lives on the CPU between phases. The
building blocks live in one module per job: :mod:`.experience` (the batch and its layout),
:mod:`.generation` (sampling) and :mod:`.token_passes` (log-probs, values); every name is
re-exported here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from trainers.core.logprobs import position_ids_of
from trainers.policy_gradients.advantages import (
    ADVANTAGES,
    TOKEN_ADVANTAGES,
    sequence_reward_to_tokens,
)
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.data import Prompt, PromptStream
from trainers.policy_gradients.experience import (
    Experience,
    assemble,
    concat_experiences,
    cut_at_first_stop,
)
from trainers.policy_gradients.generation import generate_group_batch, greedy_completions
from trainers.policy_gradients.losses import kl_estimate
from trainers.policy_gradients.rewards import compute_rewards, dapo_keep_groups
from trainers.policy_gradients.token_passes import (
    ValueModel,
    completion_token_stats,
    explained_variance,
    load_value_model,
    masked_mean_rows,
    sequence_logps,
    trim,
)
from trainers.policy_gradients.token_passes import per_token_pass as _per_token_pass

__all__ = [
    "DynamicSamplingError",
    "Experience",
    "RolloutInfo",
    "ValueModel",
    "assemble",
    "completion_token_stats",
    "concat_experiences",
    "cut_at_first_stop",
    "explained_variance",
    "generate_group_batch",
    "greedy_completions",
    "load_value_model",
    "masked_mean_rows",
    "position_ids_of",
    "prepare_update",
    "rollout_step",
    "score",
    "sequence_logps",
    "trim",
]


class DynamicSamplingError(RuntimeError):
    """DAPO could not find enough prompt groups with reward contrast within its bound."""


def score(exp: Experience, cfg: PolicyGradientConfig) -> dict[str, Tensor]:
    """Rewards of the batch's completions (DAPO-style specs add the overlong penalty)."""
    penalty = (cfg.loss.l_max, cfg.loss.l_cache) if cfg.spec.overlong_penalty else None
    return compute_rewards(
        exp.texts,
        [p.meta for p in exp.prompts],
        [int(n) for n in exp.lengths.tolist()],
        format_weight=cfg.reward.format_weight,
        penalty=penalty,
    )


def prepare_update(
    exp: Experience,
    cfg: PolicyGradientConfig,
    policy: nn.Module,
    ref_model: nn.Module | None,
    value_model: ValueModel | None,
    device: torch.device | str,
) -> tuple[Experience, dict[str, float]]:
    """Fill π_old / π_ref log-probs, PPO values, KL shaping and advantages. Returns the batch
    and the rollout-side metrics it produced (kl in the reward, explained variance)."""
    mask = exp.completion_mask
    bs = cfg.train.batch_size
    G = cfg.rollout.num_rollouts
    info: dict[str, float] = {}
    spec = cfg.spec
    kl_in_reward = cfg.uses_kl and spec.kl == "reward"
    if cfg.needs_old_logps or kl_in_reward:
        exp.old_logps = sequence_logps(policy, exp, bs, device)
    if cfg.uses_kl:
        exp.ref_logps = sequence_logps(ref_model, exp, bs, device)

    total = exp.rewards["total"].clone()
    token_kl = None
    if kl_in_reward:
        token_kl = kl_estimate(exp.old_logps, exp.ref_logps, cfg.loss.kl_estimator, mask)
        info["kl_reward"] = float(masked_mean_rows(token_kl, mask).mean())

    if spec.needs_value_model:  # a token-level estimator on the critic's values (PPO: GAE)
        was_training = value_model.training
        value_model.eval()
        exp.values = _per_token_pass(value_model, exp, bs, device)
        value_model.train(was_training)
        token_rewards = sequence_reward_to_tokens(total, mask)
        if token_kl is not None:
            token_rewards = token_rewards - cfg.loss.beta * token_kl
        estimator = TOKEN_ADVANTAGES[spec.advantage or ""]
        adv, ret = estimator(token_rewards, exp.values, mask, cfg.loss.gamma, cfg.loss.lam)
        exp.advantages, exp.returns = adv * mask, ret * mask
        exp.shaped_total = (token_rewards * mask).sum(-1)
        info["explained_variance"] = explained_variance(exp.values, exp.returns, mask)
    else:
        if token_kl is not None:  # reinforce / rloo: one scalar per sequence
            total = total - cfg.loss.beta * masked_mean_rows(token_kl, mask)
        shaped = {**exp.rewards, "total": total}
        seq_adv = ADVANTAGES[spec.advantage or ""](shaped, G)
        exp.advantages = seq_adv.float().unsqueeze(-1) * mask
        exp.shaped_total = total
    return exp, info


@dataclass
class RolloutInfo:
    prompts_drawn: int
    groups_drawn: int
    groups_kept: int
    generate_s: float
    score_s: float
    drawn: Experience  # every scored rollout of the step (DAPO: before filtering)


def rollout_step(
    policy: nn.Module,
    tokenizer: Any,
    stream: PromptStream,
    train_prompts: list[Prompt],
    cfg: PolicyGradientConfig,
) -> tuple[Experience, RolloutInfo]:
    """Sample prompts, generate, score. DAPO keeps drawing ``prompts_per_step`` prompts at a
    time and keeps only groups whose correctness is not all-min / all-max, until
    ``prompts_per_step`` groups are kept or ``max_draw_factor × prompts_per_step`` prompts have
    been drawn (then DynamicSamplingError). Returns the scored batch (on CPU) and what was drawn."""
    P, G = cfg.rollout.prompts_per_step, cfg.rollout.num_rollouts
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gen_s = score_s = 0.0
    kept: list[Experience] = []
    drawn: list[Experience] = []
    n_kept = n_drawn_prompts = 0
    limit = cfg.loss.max_draw_factor * P
    while True:
        ids = stream.take(P)
        prompts = [train_prompts[i] for i in ids]
        t0 = time.time()
        batch = generate_group_batch(policy, tokenizer, prompts, cfg)
        t1 = time.time()
        batch.rewards = score(batch, cfg)
        score_s += time.time() - t1
        gen_s += t1 - t0
        n_drawn_prompts += P
        drawn.append(batch)
        if not cfg.spec.dynamic_sampling:
            kept, n_kept = [batch], P
            break
        keep = dapo_keep_groups(
            batch.rewards["correctness"],
            G,
            cfg.loss.accuracy_min_reward,
            cfg.loss.accuracy_max_reward,
        )
        groups = [g for g in range(P) if bool(keep[g])]
        if groups:
            rows = [g * G + j for g in groups for j in range(G)]
            kept.append(batch.select(rows))
            n_kept += len(groups)
        if n_kept >= P:
            break
        if n_drawn_prompts >= limit:
            raise DynamicSamplingError(
                f"DAPO dynamic sampling drew {n_drawn_prompts} prompts "
                f"(loss.max_draw_factor={cfg.loss.max_draw_factor} × "
                f"prompts_per_step={P}) and kept only {n_kept} of the {P} groups it needs: all "
                "other groups had identical correctness (every rollout at "
                f"accuracy_min_reward={cfg.loss.accuracy_min_reward} or at "
                f"accuracy_max_reward={cfg.loss.accuracy_max_reward}). The task is too hard or "
                "too easy for this model: change the task difficulty (data.specs), warm start "
                "from an SFT model, raise rollout.num_rollouts / temperature, or raise "
                "loss.max_draw_factor."
            )
    exp = concat_experiences(kept, pad_id)
    if cfg.spec.dynamic_sampling and exp.num_sequences > P * G:
        exp = exp.select(list(range(P * G)))
    info = RolloutInfo(
        prompts_drawn=n_drawn_prompts,
        groups_drawn=n_drawn_prompts,
        groups_kept=n_kept,
        generate_s=gen_s,
        score_s=score_s,
        drawn=concat_experiences(drawn, pad_id),
    )
    return exp, info
