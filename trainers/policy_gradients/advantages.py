"""Advantage estimators of the policy-gradient family, as pure tensor functions.

Sequence-level estimators take the rewards ``r`` of N = (number of prompts)·G completions, where
the G completions of one prompt are contiguous (rows g·G … g·G+G−1), and return one advantage
per completion (shape (N,)); the trainer broadcasts it over the completion tokens. PPO's
:func:`gae` works per token on (B, T) tensors with a completion mask, and so do the critic-free
token-level estimators (REINFORCE++, ReMax), which sum the shaped token rewards backwards
(returns-to-go) before a baseline or a normalisation over the whole batch.

A group whose rewards are all equal carries no contrast: every group-relative estimator returns
exactly 0 for it (the centred rewards are set to 0 rather than left as float round-off, so no
tiny advantage is divided by a tiny standard deviation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from trainers.core.registry import Registry
from trainers.policy_gradients.spec import BINARY_ADVANTAGES
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

Estimator = Callable[[Tensor, int], Tensor]  # (rewards r (N,), G) -> advantages (N,)


def _grouped(r: Tensor, G: int, min_G: int = 1) -> Tensor:
    """View ``r`` (N,) as (N/G, G), checking the shapes."""
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(r.shape)}")
    if G < min_G:
        raise ValueError(f"this estimator needs G >= {min_G} rollouts per prompt, got G={G}")
    if r.numel() % G:
        raise ValueError(f"{r.numel()} rewards do not split into groups of G={G}")
    return r.float().view(-1, G)


def _centred(groups: Tensor) -> tuple[Tensor, Tensor]:
    """(r − mean_G r, constant-group flag (N/G, 1)); exactly 0 in groups with no contrast."""
    constant = groups.max(dim=1, keepdim=True).values == groups.min(dim=1, keepdim=True).values
    centred = groups - groups.mean(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centred), centred), constant


ADVANTAGES = Registry("sequence advantage estimator", ("rewards", "G"))
"""One advantage per sequence (N,), from the rewards dict (keys total, correctness, format,
penalty, binary) and G; GSPO, CISPO, SAPO and DAPO use ``grpo``."""


def sequence_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator: file the estimator ``f(r, G)`` in :data:`ADVANTAGES` under ``name``, called
    on one column of the rewards dict: ``binary`` for the estimators in the spec's
    ``BINARY_ADVANTAGES`` (MaxRL), else ``total``; the estimator itself is returned unchanged."""
    reads = "binary" if name in BINARY_ADVANTAGES else "total"

    def add(estimator: Estimator) -> Estimator:
        def on_rewards(rewards: dict[str, Tensor], G: int) -> Tensor:
            return estimator(rewards[reads], G)

        ADVANTAGES.register(name)(on_rewards)
        return estimator

    return add


@sequence_estimator("reinforce")
def reinforce_advantages(r: Tensor, G: int) -> Tensor:
    """REINFORCE (Williams 1992): A_i = r_i, no baseline."""
    return _grouped(r, G).reshape(-1).clone()


@sequence_estimator("rloo")
def rloo_advantages(r: Tensor, G: int) -> Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean_G r)."""
    centred, _ = _centred(_grouped(r, G, min_G=2))
    return (centred * (G / (G - 1))).reshape(-1)


@sequence_estimator("grpo")
def grpo_advantages(r: Tensor, G: int, eps: float = 1e-8) -> Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i − mean_G r) / (std_G r + eps).

    std is the unbiased (N−1) estimate, as in DeepSeekMath and TRL (``torch.std``); a group with
    all-equal rewards gets A = 0 exactly.
    """
    groups = _grouped(r, G, min_G=2)
    centred, constant = _centred(groups)
    std = groups.std(dim=1, correction=1, keepdim=True)
    std = torch.where(constant, torch.zeros_like(std), std)
    return (centred / (std + eps)).reshape(-1)


@sequence_estimator("drgrpo")
def drgrpo_advantages(r: Tensor, G: int) -> Tensor:
    """Dr. GRPO (Liu et al. 2025): A_i = r_i − mean_G r (no division by the group std)."""
    centred, _ = _centred(_grouped(r, G))
    return centred.reshape(-1)


@sequence_estimator("maxrl")
def maxrl_advantages(b: Tensor, G: int) -> Tensor:
    """MaxRL: A_i = (b_i − mean_G b) / mean_G b if mean_G b > 0 else 0, on the binary reward b.

    Dividing by the group success rate p̂ weights a prompt by 1/p̂, so hard prompts with a rare
    success get large advantages (the maximum-likelihood gradient of log p rather than p).
    """
    groups = _grouped(b, G)
    centred, _ = _centred(groups)
    mean = groups.mean(dim=1, keepdim=True)
    safe = torch.where(mean > 0, mean, torch.ones_like(mean))
    return torch.where(mean > 0, centred / safe, torch.zeros_like(centred)).reshape(-1)


def returns_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """G_t = Σ_{i ≥ t} r_i over each row's completion tokens (γ = 1); 0 outside the mask."""
    on = mask > 0
    r = torch.where(on, token_rewards.float(), 0.0)
    return torch.where(on, r.flip(-1).cumsum(-1).flip(-1), 0.0)


Moments = Callable[[Tensor], "tuple[float, float] | None"]
"""(mean, population std) of a batch's values, or None when they are all equal: the batch of
this process by default; under torchrun the global batch of every rank
(``trainers.core.distributed.global_moments``)."""


def whiten_over_batch(
    x: Tensor, mask: Tensor, eps: float = 1e-8, moments: Moments | None = None
) -> Tensor:
    """(x − μ) / (σ + eps) with μ, σ the mean and population std over EVERY completion token of
    the batch (REINFORCE++'s global normalisation, OpenRLHF's convention); 0 outside the mask,
    and exactly 0 everywhere when all the batch's values are equal. ``moments`` pools the
    statistics over a larger batch than ``x`` (every rank's share of the step)."""
    on = mask > 0
    values = x.float()[on]
    if moments is not None:
        pooled = moments(values)
        if pooled is None:
            return torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        mu, sigma = pooled
        return torch.where(on, (x.float() - mu) / (sigma + eps), 0.0)
    if values.numel() == 0 or bool(values.max() == values.min()):
        return torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    mu = values.mean()
    sigma = values.std(correction=0)
    return torch.where(on, (x.float() - mu) / (sigma + eps), 0.0)


def shaped_token_rewards(r: Tensor, kl_penalty: Tensor, mask: Tensor) -> Tensor:
    """The sequence reward r_b on the last completion token of row b, minus β·k_t on every
    completion token (``kl_penalty`` is β·k_t, zeros without a KL term)."""
    on = mask > 0
    return sequence_reward_to_tokens(r, mask) - torch.where(on, kl_penalty.float(), 0.0)


def reinforce_pp_advantages(
    r: Tensor, kl_penalty: Tensor, mask: Tensor, moments: Moments | None = None
) -> Tensor:
    """REINFORCE++ (Hu et al. 2025): A_t = r − Σ_{i ≥ t} β·k_i, the return-to-go of the shaped
    token rewards, then normalised over every completion token of the batch (not per prompt;
    ``moments``: of the global batch, see :func:`whiten_over_batch`)."""
    returns = returns_to_go(shaped_token_rewards(r, kl_penalty, mask), mask)
    return whiten_over_batch(returns, mask, moments=moments)


def reinforce_pp_baseline_advantages(
    r: Tensor, kl_penalty: Tensor, mask: Tensor, G: int, moments: Moments | None = None
) -> Tensor:
    """REINFORCE++-baseline (Hu et al. 2025): the group mean is subtracted from the sequence
    reward first (r_i − mean_G r), then as :func:`reinforce_pp_advantages`."""
    centred, _ = _centred(_grouped(r, G))
    return reinforce_pp_advantages(centred.reshape(-1), kl_penalty, mask, moments)


def remax_advantages(r: Tensor, r_greedy: Tensor, kl_penalty: Tensor, mask: Tensor) -> Tensor:
    """ReMax (Li et al. 2023): A_t = (r − Σ_{i ≥ t} β·k_i) − r(x, ŷ), the return-to-go minus the
    reward of the prompt's greedy completion ŷ (``r_greedy``, one per row); no normalisation."""
    returns = returns_to_go(shaped_token_rewards(r, kl_penalty, mask), mask)
    baseline = r_greedy.detach().float().to(returns.device).unsqueeze(-1)
    return torch.where(mask > 0, returns - baseline, 0.0)


# ---------------------------------------------------------------------------------------------
# The token-level registries (the sequence one, ADVANTAGES, is above its estimators): one per
# kind of estimator, each with one signature; an algorithm's spec names its estimator
# (``advantage``), which is in exactly one of them.
# ---------------------------------------------------------------------------------------------

TOKEN_REWARD_ADVANTAGES = Registry(
    "critic-free token advantage estimator", ("rewards", "kl_penalty", "mask", "G", "moments")
)
"""(N, T) advantages from the rewards dict (ReMax reads ``greedy``, the reward of the prompt's
greedy completion, repeated over its rows), the per-token KL penalty β·k_t (zeros without a KL
term), the completion mask, G and ``moments``: the pooled (mean, std) of the global batch under
torchrun (None: this batch's), read by the estimators that normalise over the whole batch."""

TOKEN_ADVANTAGES = Registry(
    "value-model advantage estimator", ("token_rewards", "values", "mask", "gamma", "lam")
)
"""Token-level estimators on a learned value model (PPO's ``gae``): (advantages, returns)."""


@TOKEN_REWARD_ADVANTAGES.register("reinforce_pp")
def _reinforce_pp(
    rewards: dict[str, Tensor], kl_penalty: Tensor, mask: Tensor, G: int, moments=None
) -> Tensor:
    return reinforce_pp_advantages(rewards["total"], kl_penalty, mask, moments)


@TOKEN_REWARD_ADVANTAGES.register("reinforce_pp_baseline")
def _reinforce_pp_baseline(
    rewards: dict[str, Tensor], kl_penalty: Tensor, mask: Tensor, G: int, moments=None
) -> Tensor:
    return reinforce_pp_baseline_advantages(rewards["total"], kl_penalty, mask, G, moments)


@TOKEN_REWARD_ADVANTAGES.register("remax")
def _remax(
    rewards: dict[str, Tensor], kl_penalty: Tensor, mask: Tensor, G: int, moments=None
) -> Tensor:
    """No normalisation: ``moments`` is not read."""
    if "greedy" not in rewards:
        raise ValueError(
            "remax needs rewards['greedy'], the reward of each prompt's greedy completion"
        )
    return remax_advantages(rewards["total"], rewards["greedy"], kl_penalty, mask)


def sequence_advantage_for(algorithm: str) -> Callable[[dict[str, Tensor], int], Tensor]:
    """The sequence advantage estimator ``algorithm``'s spec names (KeyError for PPO, whose
    advantage is token-level)."""
    return ADVANTAGES[PG_FAMILY.algorithm(algorithm).advantage or ""]


def frac_zero_std(r: Tensor, G: int) -> float:
    """Share of groups whose G rewards are all equal (no contrast, so nothing to learn)."""
    groups = _grouped(r, G)
    constant = groups.max(dim=1).values == groups.min(dim=1).values
    return constant.float().mean().item()


def sequence_reward_to_tokens(r: Tensor, mask: Tensor) -> Tensor:
    """Place each sequence reward r_b at the last completion token of row b (zeros elsewhere).

    A row with an empty mask gets no reward.
    """
    on = mask > 0
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(on, positions, torch.full_like(positions, -1)).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = r.detach().float().to(mask.device)[rows]
    return out


def model_token_order(mask: Tensor) -> Tensor:
    """Per row, the column order that puts the masked (model) tokens first, in their order,
    then the others: (B, T) indices. The identity for a mask that is a prefix of each row."""
    return torch.sort((mask <= 0).to(torch.int8), dim=1, stable=True).indices


def over_model_tokens(
    estimator: Callable[..., tuple[Tensor, Tensor]],
    token_rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
) -> tuple[Tensor, Tensor]:
    """A value-model estimator run as if each row held only its model tokens: multi-turn rows
    have tool replies (mask 0) between turns, where :func:`gae` would otherwise end the episode.
    The model tokens are moved to the front, the estimator runs on that contiguous layout, and
    its (advantages, returns) go back to their columns; V of the next model token bootstraps
    across a reply. Single-turn rows are unchanged (their order is the identity)."""
    order = model_token_order(mask)
    packed = [torch.gather(x.float(), 1, order) for x in (token_rewards, values, mask)]
    adv, ret = estimator(*packed, gamma, lam)
    out_adv = torch.zeros_like(packed[0]).scatter_(1, order, adv)
    out_ret = torch.zeros_like(packed[0]).scatter_(1, order, ret)
    on = (mask > 0).float()
    return out_adv * on, out_ret * on


@TOKEN_ADVANTAGES.register("gae")
@torch.no_grad()
def gae(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015, used by PPO, Schulman et al. 2017).

    Backwards over t, with m the completion mask:
        δ_t = r_t + γ·V_{t+1}·m_{t+1} − V_t
        A_t = δ_t + γλ·m_{t+1}·A_{t+1}
    so the episode ends after the last completion token (V beyond it bootstraps nothing). A and
    the returns R = A + V are 0 outside the mask; works with right (or left) padded contiguous
    masks. Advantages are not whitened. Inputs are treated as constants (no gradient).
    """
    on = mask > 0
    r = torch.where(on, token_rewards.float(), 0.0)
    v = torch.where(on, values.float(), 0.0)
    m = on.float()
    T = r.shape[1]
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(T)):
        m_next = m[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        v_next = v[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        delta = r[:, t] + gamma * v_next * m_next - v[:, t]
        running = (delta + gamma * lam * m_next * running) * m[:, t]
        adv[:, t] = running
    return adv, (adv + v) * m
