"""The rollout phase: generate, score, and get everything the update needs.

One rollout step, as in the algorithm box:

1. ``generate_group_batch`` (:mod:`.generation`) — each prompt is prefilled once and its
   ``num_rollouts`` completions are sampled from the repeated KV cache.
2. ``score`` — the reward parts of the decoded completions: reasoning-gym correctness and tag
   format (core.verifier.compute_rewards; only format without a verifier), DAPO's overlong penalty,
   the reward model's score (``RewardModels.proxy``, normalised as ``reward.normalize`` says)
   and the gold reward model's score; then the weighted, shaped ``total``
   (rewards.shaped_total).
3. DAPO only (``rollout_step``): dynamic sampling keeps drawing prompts until
   ``prompts_per_step`` groups with differing correctness are kept, within a bound. ReMax only:
   each prompt's greedy completion is generated and scored the same way (``greedy_baseline``),
   its ``total`` stored as ``rewards["greedy"]`` on the prompt's rows.
4. ``prepare_update`` — π_old log-probs (only when the update needs them: see
   ``PolicyGradientConfig.needs_old_logps``), reference log-probs (β > 0), values for an
   algorithm with a value model; KL shaping of the reward where the spec puts the KL in the
   reward; advantages by the estimator the algorithm's spec names. With a reference model,
   each sequence's summed KL to it (``Experience.kl_ref``, the ``kl_ref`` metric) from π_old
   (or, when the π_old forward is skipped, from the update's first pass, where π = π_old).

Under torchrun (:mod:`.ranks`) each rank rolls out its own contiguous share of the step's
prompts, whole groups; what is a statistic of the step (DAPO's kept-group count, the reward
model's batch or running normalisation, REINFORCE++'s whitening, the logged means) is pooled
over every rank, and DAPO's kept groups are re-dealt so that every rank updates on as many.

The result is an :class:`~.experience.Experience` that lives on the CPU between phases. The
building blocks live in one module per job: :mod:`.experience` (the batch and its layout),
:mod:`.generation` (sampling) and :mod:`.token_passes` (log-probs, values); import each name
from the module that defines it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from trainers.core.distributed import global_moments, world
from trainers.core.flops import StageClock
from trainers.core.lora import reference_view
from trainers.core.onpolicy import greedy_rollouts
from trainers.core.prompts import Prompt, PromptStream
from trainers.core.reward_scorer import PolicyCompletions
from trainers.core.verifier import Verifier, compute_rewards, text_rewards
from trainers.policy_gradients.advantages import (
    ADVANTAGES,
    TOKEN_ADVANTAGES,
    TOKEN_REWARD_ADVANTAGES,
    over_model_tokens,
    sequence_reward_to_tokens,
)
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.experience import Experience, concat_experiences
from trainers.policy_gradients.generation import generate_group_batch
from trainers.policy_gradients.losses import kl_estimate
from trainers.policy_gradients.ranks import (
    global_count,
    global_mean,
    normalise_over_ranks,
    prompt_share,
    take_kept_groups,
)
from trainers.policy_gradients.rewards import RunningMoments, dapo_keep_groups, shaped_total
from trainers.policy_gradients.token_passes import (
    ValueModel,
    explained_variance,
    masked_mean_rows,
    per_token_pass,
    sequence_logps,
)


class DynamicSamplingError(RuntimeError):
    """DAPO could not find enough prompt groups with reward contrast within its bound."""


@dataclass
class RewardModels:
    """The run's reward models (None when unused) and the running moments of the proxy's
    scores (``reward.normalize=running``; saved in checkpoints)."""

    proxy: Any = None  # core.reward_scorer.RewardScorer: the optimised reward model
    gold: Any = None  # core.reward_scorer.RewardScorer: the held-out gold reward model
    moments: RunningMoments = field(default_factory=RunningMoments)
    stop_ids: set[int] = field(default_factory=set)
    # scores the verifier prompts: (texts, metas, lengths, *, format_weight, penalty) -> parts
    verifier: Verifier = compute_rewards


def score_texts(
    cfg: PolicyGradientConfig,
    prompts: list[Prompt],
    texts: list[str],
    lengths: list[int],
    truncated: Tensor,
    models: RewardModels | None = None,
    *,
    prompt_ids: list[list[int]] | None = None,
    completion_ids: list[list[int]] | None = None,
    update_moments: bool = True,
    penalty: tuple[int, int] | None = None,
    env_rewards: Tensor | None = None,
) -> dict[str, Tensor]:
    """The reward parts of N completions and their weighted ``total`` (float32, (N,) each):
    ``correctness``/``binary`` (verifier prompts only), ``format``, ``penalty``, ``model`` (the
    reward model's raw score) and ``model_norm`` (after ``reward.normalize``), ``gold`` (the
    gold reward model's score). ``update_moments=False`` (evaluation) whitens the proxy's score
    with neither the batch nor the running statistics: ``model_norm`` is the raw score.
    Verifier prompts are scored by ``models.verifier`` (by default
    :func:`trainers.core.verifier.compute_rewards`). ``env_rewards`` (multi-turn): each
    trajectory's summed per-turn environment rewards, the ``env`` part."""
    rw = cfg.reward
    metas = [p.meta for p in prompts]
    models = models or RewardModels()
    if cfg.data.has_verifier:
        verify = models.verifier
        parts = dict(verify(texts, metas, lengths, format_weight=rw.format_weight, penalty=penalty))
        parts.pop("total", None)
    else:
        parts = text_rewards(texts, lengths, penalty=penalty)
    messages = [p.messages for p in prompts]
    batch = PolicyCompletions(messages, texts, prompt_ids, completion_ids, models.stop_ids)
    if models.proxy is not None:
        raw = models.proxy.score_completions(batch)
        parts["model"] = raw
        mode = rw.normalize if update_moments else "none"
        parts["model_norm"] = normalise_over_ranks(raw, mode, models.moments)
    if models.gold is not None:
        parts["gold"] = models.gold.score_completions(batch)
    if env_rewards is not None:
        parts["env"] = env_rewards.float()
    parts["total"] = shaped_total(
        parts,
        truncated,
        model_weight=rw.model_weight or 0.0,
        verifier_weight=rw.verifier_weight or 0.0,
        format_weight=rw.format_weight or 0.0,
        missing_eos_penalty=rw.missing_eos_penalty,
        clip=rw.clip,
    )
    return parts


def score(
    exp: Experience, cfg: PolicyGradientConfig, models: RewardModels | None = None
) -> dict[str, Tensor]:
    """Rewards of the batch's completions (DAPO-style specs add the overlong penalty)."""
    penalty = (cfg.loss.l_max, cfg.loss.l_cache) if cfg.spec.overlong_penalty else None
    prompt_ids = completion_ids = None
    if models is not None and (models.proxy is not None or models.gold is not None):
        prompt_ids, completion_ids = exp.token_ids()
    return score_texts(
        cfg,
        exp.prompts,
        exp.texts,
        [int(n) for n in exp.lengths.tolist()],
        exp.truncated,
        models,
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        penalty=penalty,
        env_rewards=None if exp.turn_rewards is None else exp.turn_rewards.sum(-1),
    )


def turn_reward_shift(exp: Experience) -> Tensor | None:
    """Multi-turn: what moves the environment's per-turn rewards from the end of the
    trajectory (where the sequence reward ``total`` holds their sum) to each turn's last model
    token, as (N, T) token rewards that sum to 0 per row; None for single-turn batches."""
    if exp.turn_rewards is None or "env" not in exp.rewards:
        return None
    at_end = sequence_reward_to_tokens(exp.rewards["env"], exp.completion_mask)
    return exp.turn_rewards.float() - at_end


def sequence_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Σ_t k3(logπ_t − logπ_ref,t) over each sequence's completion tokens (N,): a non-negative,
    unbiased sample estimate of the sequence-level KL(π ‖ π_ref)."""
    return (kl_estimate(logp.float(), ref_logp.float(), "k3", mask) * mask).sum(-1)


def prepare_update(
    exp: Experience,
    cfg: PolicyGradientConfig,
    policy: nn.Module,
    ref_model: nn.Module | None,
    value_model: ValueModel | None,
    device: torch.device | str,
    clock: StageClock | None = None,
) -> tuple[Experience, dict[str, float]]:
    """Fill π_old / π_ref log-probs, PPO values, KL shaping and advantages, each pass timed as
    a stage of ``clock`` (``old_logps``, ``reference``, ``values``, ``advantages``). Returns
    the batch and the rollout-side metrics it produced (kl in the reward, explained variance)."""
    clock = clock or StageClock(device)
    bs = cfg.train.batch_size
    if cfg.needs_old_logps or (cfg.uses_kl and cfg.spec.kl == "reward"):
        with clock.stage("old_logps"):
            exp.old_logps = sequence_logps(policy, exp, bs, device)
    if cfg.uses_kl:  # ref_model None with LoRA: the policy with its adapters off
        with clock.stage("reference"), reference_view(policy, ref_model) as reference:
            exp.ref_logps = sequence_logps(reference, exp, bs, device)
    if cfg.spec.needs_value_model:
        with clock.stage("values"):
            was_training = value_model.training
            value_model.eval()
            exp.values = per_token_pass(value_model, exp, bs, device)
            value_model.train(was_training)
    with clock.stage("advantages"):
        info = fill_advantages(exp, cfg)
    return exp, info


def fill_advantages(exp: Experience, cfg: PolicyGradientConfig) -> dict[str, float]:
    """The KL to the reference, KL shaping of the reward and the advantages (and PPO's returns)
    of a batch whose log-probs and values are filled; returns the metrics it produced."""
    mask = exp.completion_mask
    G = cfg.rollout.num_rollouts
    info: dict[str, float] = {}
    spec = cfg.spec
    kl_in_reward = cfg.uses_kl and spec.kl == "reward"
    if exp.ref_logps is not None and exp.old_logps is not None:  # else the update's first
        exp.kl_ref = sequence_kl(exp.old_logps, exp.ref_logps, mask)  # pass fills it (π = π_old)
    total = exp.rewards["total"].clone()
    shift = turn_reward_shift(exp)
    token_kl = None
    if kl_in_reward:
        token_kl = kl_estimate(exp.old_logps, exp.ref_logps, cfg.loss.kl_estimator, mask)
        info["kl_reward"] = global_mean(masked_mean_rows(token_kl, mask))

    if spec.needs_value_model:  # a token-level estimator on the critic's values (PPO: GAE)
        token_rewards = sequence_reward_to_tokens(total, mask)
        if shift is not None:
            token_rewards = token_rewards + shift
        if token_kl is not None:
            token_rewards = token_rewards - cfg.loss.beta * token_kl
        estimator = TOKEN_ADVANTAGES[spec.advantage or ""]
        adv, ret = over_model_tokens(
            estimator, token_rewards, exp.values, mask, cfg.loss.gamma, cfg.loss.lam
        )
        exp.advantages, exp.returns = adv * mask, ret * mask
        exp.shaped_total = (token_rewards * mask).sum(-1)
        pooled = global_moments if world().distributed else None
        info["explained_variance"] = explained_variance(exp.values, exp.returns, mask, pooled)
    elif spec.advantage in TOKEN_REWARD_ADVANTAGES:  # critic-free, per token (REINFORCE++, ReMax)
        penalty = torch.zeros_like(mask) if token_kl is None else cfg.loss.beta * token_kl * mask
        if shift is not None:  # the per-turn rewards, as a negative penalty that sums to 0
            penalty = penalty - shift * mask
        estimator = TOKEN_REWARD_ADVANTAGES[spec.advantage]
        pooled = global_moments if world().distributed else None  # every rank's tokens
        exp.advantages = estimator(exp.rewards, penalty, mask, G, pooled) * mask
        exp.shaped_total = total - penalty.sum(-1)
    else:
        if token_kl is not None:  # reinforce / rloo: one scalar per sequence
            total = total - cfg.loss.beta * masked_mean_rows(token_kl, mask)
        shaped = {**exp.rewards, "total": total}
        seq_adv = ADVANTAGES[spec.advantage or ""](shaped, G)
        exp.advantages = seq_adv.float().unsqueeze(-1) * mask
        exp.shaped_total = total
    return info


def score_greedy(
    cfg: PolicyGradientConfig,
    prompts: list[Prompt],
    out: dict[str, Any],
    models: RewardModels | None = None,
) -> dict[str, Tensor]:
    """The reward parts of greedy completions (``out``: :func:`greedy_rollouts`' layout, with
    ``env_rewards`` for multi-turn trajectories), scored as the samples are (:func:`score_texts`)
    but leaving the reward model's running moments as they are: held-out evaluation and ReMax's
    baseline."""
    return score_texts(
        cfg,
        prompts,
        out["texts"],
        out["lengths"],
        torch.tensor(out["truncated"], dtype=torch.bool),
        models,
        prompt_ids=out["prompt_ids"],
        completion_ids=out["completion_ids"],
        update_moments=False,
        env_rewards=out.get("env_rewards"),
    )


def greedy_baseline(
    policy: nn.Module,
    tokenizer: Any,
    prompts: list[Prompt],
    cfg: PolicyGradientConfig,
    models: RewardModels | None = None,
) -> Tensor:
    """ReMax's baseline: the ``total`` reward of each prompt's greedy completion (same
    max_new_tokens, same reward path; the reward model's score unwhitened, which the config
    guarantees the samples' is too), repeated over the prompt's ``num_rollouts`` rows (N,)."""
    rc = cfg.rollout
    per_call = max(1, (rc.generation_batch_size or len(prompts) * rc.num_rollouts))
    out = greedy_rollouts(
        policy, tokenizer, prompts, rc.max_new_tokens, min(per_call, len(prompts))
    )
    return score_greedy(cfg, prompts, out, models)["total"].repeat_interleave(rc.num_rollouts)


@dataclass
class RolloutInfo:
    prompts_drawn: int  # over every rank
    groups_drawn: int
    groups_kept: int
    drawn: Experience  # this rank's scored rollouts of the step (DAPO: before filtering)


Draw = Callable[[list[Prompt]], Experience]
"""Roll out and score a list of prompts: the scored batch."""


def draw_groups(
    policy: nn.Module,
    tokenizer: Any,
    cfg: PolicyGradientConfig,
    models: RewardModels | None = None,
    clock: StageClock | None = None,
) -> Draw:
    """The rollout of one round of prompts: generate, score (ReMax: and its greedy baseline,
    timed as generation), each timed as a stage of ``clock``."""
    clock = clock or StageClock()

    def draw(prompts: list[Prompt]) -> Experience:
        with clock.stage("generate"):
            batch = generate_group_batch(policy, tokenizer, prompts, cfg)
        with clock.stage("score"):
            batch.rewards = score(batch, cfg, models)
        if cfg.spec.greedy_baseline:
            with clock.stage("generate"):
                greedy = greedy_baseline(policy, tokenizer, prompts, cfg, models)
            batch.rewards["greedy"] = greedy
        return batch

    return draw


def rollout_step(
    policy: nn.Module,
    tokenizer: Any,
    stream: PromptStream,
    train_prompts: list[Prompt],
    cfg: PolicyGradientConfig,
    models: RewardModels | None = None,
    draw: Draw | None = None,
    clock: StageClock | None = None,
) -> tuple[Experience, RolloutInfo]:
    """Sample prompts, generate, score. DAPO keeps drawing ``prompts_per_step`` prompts at a
    time and keeps only groups whose correctness is not all-min / all-max, until
    ``prompts_per_step`` groups are kept or ``max_draw_factor × prompts_per_step`` prompts have
    been drawn (then DynamicSamplingError). Returns the scored batch (on CPU) and what was drawn.

    Under torchrun every rank takes the same ``prompts_per_step`` prompts from the stream and
    rolls out its contiguous share of them (whole groups); DAPO counts the groups kept on every
    rank, so all ranks draw the same number of rounds and stop together, and the first
    ``prompts_per_step`` kept groups (in one process's order) are dealt out again, as many to
    each rank. ``draw`` (tests): what rolls out and scores a round (:func:`draw_groups`, its
    generation and scoring timed as stages of ``clock``)."""
    P, G = cfg.rollout.prompts_per_step, cfg.rollout.num_rollouts
    draw = draw or draw_groups(policy, tokenizer, cfg, models, clock)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    kept: list[Experience] = []
    drawn: list[Experience] = []
    n_kept = n_drawn_prompts = 0
    limit = cfg.loss.max_draw_factor * P
    while True:
        ids = prompt_share(stream.take(P))
        prompts = [train_prompts[i] for i in ids]
        batch = draw(prompts)
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
        groups = [g for g in range(len(prompts)) if bool(keep[g])]
        kept.append(batch.select([g * G + j for g in groups for j in range(G)]))
        n_kept += global_count(len(groups))  # every rank's: all decide alike
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
    if cfg.spec.dynamic_sampling:
        exp = take_kept_groups(kept, P, G, pad_id)
    else:
        exp = concat_experiences(kept, pad_id)
    info = RolloutInfo(
        prompts_drawn=n_drawn_prompts,
        groups_drawn=n_drawn_prompts,
        groups_kept=n_kept,
        drawn=concat_experiences(drawn, pad_id),
    )
    return exp, info
