"""Sampling completions for a rollout step (greedy completions for held-out evaluation:
:func:`trainers.core.onpolicy.greedy_rollouts`).

Each prompt is prefilled once and its ``num_rollouts`` completions are sampled from the repeated
KV cache (``trainers/core/decoding.py``: left padding, temperature / top-k / top-p / min-p). The
completion mask ends after the *first* end-of-turn token (inclusive).

With an environment (``env.name``), each completion is a trajectory of model turns and tool
replies (:mod:`trainers.core.multiturn`): the replies sit in the completion (attended, in the
KV cache) with completion mask 0, and the environment's per-turn rewards sit on each turn's last
model token (``Experience.turn_rewards``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainers.core.decoding import Sampling
from trainers.core.environments import make_environment
from trainers.core.generation import chat_prompt_ids, end_of_turn_ids
from trainers.core.multiturn import Trajectory, TrajectoryRollout, TurnLimits
from trainers.core.onpolicy import cut_at_first_stop, pad_id_of, rows_of, sample_policy
from trainers.core.records import Prompt
from trainers.policy_gradients.config import PolicyGradientConfig
from trainers.policy_gradients.experience import Experience, assemble


def _sampling(cfg: PolicyGradientConfig) -> Sampling:
    """The rollout section's sampling filters as the decoding loop takes them."""
    rc = cfg.rollout
    return Sampling(
        temperature=rc.temperature, top_k=rc.top_k, top_p=rc.top_p, min_p=rc.min_p or 0.0
    )


@torch.no_grad()
def generate_group_batch(
    model: nn.Module, tokenizer: Any, prompts: list[Prompt], cfg: PolicyGradientConfig
) -> Experience:
    """``num_rollouts`` sampled completions per prompt (rows of a group contiguous). Each prompt
    is prefilled once and its KV cache repeated for the group (trainers/core/decoding.py)."""
    if cfg.multi_turn:
        return generate_trajectory_batch(model, tokenizer, prompts, cfg)
    rc = cfg.rollout
    G = rc.num_rollouts
    stop_ids = set(end_of_turn_ids(tokenizer))
    encoded = [chat_prompt_ids(tokenizer, p.messages) for p in prompts]
    new_tokens = sample_policy(
        model,
        tokenizer,
        encoded,
        max_new_tokens=rc.max_new_tokens,
        sampling=_sampling(cfg),
        repeats=G,
        batch_size=max(1, (rc.generation_batch_size or len(prompts) * G) // G),
    )
    completion_rows, truncated, texts = [], [], []
    for tokens in new_tokens:
        kept, cut = cut_at_first_stop(tokens, stop_ids)
        completion_rows.append(kept)
        truncated.append(cut)
        texts.append(tokenizer.decode(kept if cut else kept[:-1], skip_special_tokens=True))
    prompt_rows, owners = rows_of(encoded, G), rows_of(prompts, G)
    ids, attn, lens, cmask = assemble(prompt_rows, completion_rows, pad_id_of(tokenizer))
    return Experience(
        input_ids=ids,
        attention_mask=attn,
        prompt_lens=lens,
        completion_mask=cmask,
        truncated=torch.tensor(truncated, dtype=torch.bool),
        texts=texts,
        prompts=owners,
    )


_ROLLOUTS: dict[tuple[int, TurnLimits], TrajectoryRollout] = {}


def turn_limits(cfg: PolicyGradientConfig, max_new_tokens: int | None = None) -> TurnLimits:
    """The config's bounds on a trajectory (``max_new_tokens``: per turn, default the
    rollout's)."""
    return TurnLimits(
        max_turns=cfg.env.max_turns,
        max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens,
        max_observation_tokens=cfg.env.max_observation_tokens,
        max_total_tokens=cfg.max_completion_tokens,
    )


def trajectory_rollout(tokenizer: Any, limits: TurnLimits) -> TrajectoryRollout:
    """The run's :class:`TrajectoryRollout` (built once per tokenizer and limits: it reads the
    whole vocabulary for the close tag's stop)."""
    key = (id(tokenizer), limits)
    if key not in _ROLLOUTS:
        _ROLLOUTS[key] = TrajectoryRollout(tokenizer, limits)
    return _ROLLOUTS[key]


def experience_of(trajectories: list[Trajectory], owners: list[Prompt], pad_id: int) -> Experience:
    """The rollout batch of multi-turn trajectories (rows in order, ``owners`` their prompts)."""
    ids, attn, lens, cmask = assemble(
        [t.prompt_ids for t in trajectories],
        [t.completion_ids for t in trajectories],
        pad_id,
        model_masks=[t.model_mask for t in trajectories],
    )
    turn_rewards = torch.zeros_like(cmask)
    for row, t in enumerate(trajectories):
        for end, reward in zip(t.turn_ends, t.turn_rewards, strict=False):
            turn_rewards[row, end] = reward
    exp = Experience(
        input_ids=ids,
        attention_mask=attn,
        prompt_lens=lens,
        completion_mask=cmask,
        truncated=torch.tensor([not t.finished for t in trajectories], dtype=torch.bool),
        texts=[t.model_text for t in trajectories],
        prompts=owners,
        turn_rewards=turn_rewards,
        trajectories=trajectories,
    )
    return exp


@torch.no_grad()
def generate_trajectory_batch(
    model: nn.Module,
    tokenizer: Any,
    prompts: list[Prompt],
    cfg: PolicyGradientConfig,
    *,
    greedy: bool = False,
    max_new_tokens: int | None = None,
) -> Experience:
    """``num_rollouts`` trajectories per prompt with a fresh environment each (``greedy``: one
    greedy trajectory per prompt, for held-out evaluation)."""
    G = 1 if greedy else cfg.rollout.num_rollouts
    rollout = trajectory_rollout(tokenizer, turn_limits(cfg, max_new_tokens))
    sampling = Sampling(do_sample=False) if greedy else _sampling(cfg)
    per_call = cfg.rollout.generation_batch_size or len(prompts) * G
    groups_per_call = max(1, per_call // G)
    was_training = model.training
    model.eval()
    trajectories: list[Trajectory] = []
    owners: list[Prompt] = []
    for start in range(0, len(prompts), groups_per_call):
        chunk = prompts[start : start + groups_per_call]
        envs = [make_environment(cfg.env.name) for _ in range(len(chunk) * G)]
        trajectories += rollout.run(model, chunk, envs, repeats=G, sampling=sampling)
        owners += [p for p in chunk for _ in range(G)]
    model.train(was_training)
    return experience_of(trajectories, owners, rollout.pad_id)
