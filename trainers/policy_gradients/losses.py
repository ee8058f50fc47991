"""Per-token policy losses, KL estimators, PPO's value loss and the loss aggregation modes.

Every policy loss takes :class:`PolicyLossInputs` (per-token log-probs on a (B, T) grid of
completion positions with a float mask) and :class:`PolicyLossParams`, and returns

    (per_token_loss (B, T), stats: dict[str, Tensor (B, T)])

with zeros outside the mask. Reducing the per-token loss to a scalar is :func:`aggregate`'s job,
so the same loss can be reduced three ways (see docs/algorithms.md "Loss aggregation"). Stats are
detached: ``ratio`` (ρ, or GSPO's sequence ratio s), ``clipped`` (1.0 where a clip changed the
loss), ``pg_loss`` (the policy term without KL) and ``kl`` (when a reference is given).

Notation: ρ_t = exp(logπ_t − logπ_old,t), A the advantage (the sequence advantage broadcast over
the tokens, or GAE), sg[·] stop-gradient, d = logπ − logπ_ref.

Log-ratios are zeroed outside the mask BEFORE any exponential, so arbitrary values on padding can
neither overflow into inf/NaN nor leak NaN gradients through ``torch.where``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from trainers.core.registry import Registry
from trainers.policy_gradients.spec import FAMILY as PG_FAMILY

Stats = dict[str, Tensor]
KLKind = Literal["k1", "k2", "k3"]
AggMode = Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"]
AGG_MODES: tuple[str, ...] = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")

# ---------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------

# Taylor coefficients of e^{−d} − 1 + d = Σ_{k≥2} (−d)^k / k!, used where |d| is small.
_K3_SERIES = tuple((-1) ** k / math.factorial(k) for k in range(2, 12))
_K3_SERIES_MAX = 0.5  # |d| below this: series (truncation < 1e-10 relative); above: expm1 form


def _k3(d: Tensor) -> Tensor:
    """e^{−d} − 1 + d without cancellation at any |d|.

    ``expm1(−d) + d`` alone still cancels: near 0, expm1(−d) ≈ −d + d²/2 and adding d loses the
    d²/2 part to round-off (in float32 it returns 0 or noise at d = 1e-8). Below |d| = 0.5 we sum
    the Taylor series d²·(1/2 − d/6 + d²/24 − …) by Horner, whose terms do not cancel.
    """
    small = d.abs() < _K3_SERIES_MAX
    ds = torch.where(small, d, torch.zeros_like(d))
    poly = torch.zeros_like(d)
    for c in reversed(_K3_SERIES):
        poly = poly * ds + c
    series = ds * ds * poly
    dl = torch.where(small, torch.ones_like(d), d)
    direct = torch.expm1(-dl) + dl
    return torch.where(small, series, direct)


def kl_estimate(
    logp: Tensor, ref_logp: Tensor, kind: KLKind = "k3", mask: Tensor | None = None
) -> Tensor:
    """Per-token estimators of KL(π ‖ π_ref) on tokens sampled from π (Schulman 2020, "Approximating
    KL divergence"), with d = logπ − logπ_ref:

        k1 = d            (unbiased, can be negative)
        k2 = d²/2         (biased, ≥ 0)
        k3 = e^{−d} − 1 + d   (unbiased, ≥ 0, ≈ d²/2 near 0; the DeepSeekMath / TRL GRPO form)

    Differs from the book's code, which has k1 = −d (so a positive β rewarded divergence) and
    k3 = e^{d} − 1 − d (the other ratio direction). Where ``mask`` is given, d is set to 0
    outside it before the nonlinearity, so padding contributes exactly 0.
    """
    d = logp - ref_logp
    if mask is not None:
        d = torch.where(mask > 0, d, torch.zeros_like(d))
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return _k3(d)
    raise ValueError(f"unknown KL estimator {kind!r}; expected k1, k2 or k3")


# ---------------------------------------------------------------------------------------------
# Policy losses
# ---------------------------------------------------------------------------------------------


@dataclass
class PolicyLossInputs:
    """Per-token tensors of one micro-batch, all (B, T) float32.

    ``logp``: current policy (carries the gradient); ``old_logp``: the policy that generated the
    rollout (detached); ``advantages``: sequence advantages broadcast over tokens, or GAE;
    ``mask``: 1 on completion tokens (end-of-turn token included), 0 on padding; ``ref_logp``:
    frozen reference, needed when a KL term is in the loss.
    """

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    ref_logp: Tensor | None = None


@dataclass
class PolicyLossParams:
    """Clip range [1 − clip_eps_lo, 1 + clip_eps_hi]; β and estimator of the per-token KL term
    (added to the loss when ``beta > 0`` and ``kl_in_loss``; the trainer sets ``kl_in_loss``
    False for algorithms whose KL enters the reward instead); SAPO temperatures."""

    clip_eps_lo: float = 0.2
    clip_eps_hi: float = 0.2
    beta: float = 0.0
    kl_estimator: KLKind = "k3"
    kl_in_loss: bool = True
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05


PolicyLossFn = Callable[[PolicyLossInputs, PolicyLossParams], tuple[Tensor, Stats]]

POLICY_LOSS_FUNCTIONS = Registry("policy loss", ("inp", "params"))
"""Per-token policy losses by name; an algorithm's spec (``trainers/policy_gradients/spec.py``)
names the one it uses. The loss adds β·KL whenever ``beta > 0 and kl_in_loss`` (the trainer
decides from the spec's ``kl``)."""


def _on(inp: PolicyLossInputs) -> Tensor:
    return inp.mask > 0


def _masked(x: Tensor, on: Tensor) -> Tensor:
    return torch.where(on, x, torch.zeros_like(x))


def _adv(inp: PolicyLossInputs) -> Tensor:
    """The advantages as constants, 0 outside the mask."""
    return _masked(inp.advantages.detach().float(), _on(inp))


def _log_ratio(inp: PolicyLossInputs) -> Tensor:
    """logπ − logπ_old, 0 outside the mask (so exp never sees padding garbage)."""
    return _masked(inp.logp - inp.old_logp.detach(), _on(inp))


def _finish(pg: Tensor, inp: PolicyLossInputs, params: PolicyLossParams, stats: Stats):
    """Mask the policy term, add β·KL when asked, detach the stats."""
    on = _on(inp)
    pg = _masked(pg, on)
    loss = pg
    stats = {k: _masked(v.detach().float(), on) for k, v in stats.items()}
    stats["pg_loss"] = pg.detach()
    if inp.ref_logp is not None:
        kl = kl_estimate(inp.logp, inp.ref_logp.detach(), params.kl_estimator, inp.mask)
        stats["kl"] = _masked(kl.detach(), on)
        if params.beta > 0 and params.kl_in_loss:
            loss = loss + params.beta * _masked(kl, on)
    elif params.beta > 0 and params.kl_in_loss:
        raise ValueError("beta > 0 with kl_in_loss needs ref_logp")
    return loss, stats


def _clip_active(ratio: Tensor, adv: Tensor, params: PolicyLossParams) -> Tensor:
    """Where min(ρA, clip(ρ)A) picks the clipped branch and so passes no gradient."""
    high = (ratio > 1 + params.clip_eps_hi) & (adv > 0)
    low = (ratio < 1 - params.clip_eps_lo) & (adv < 0)
    return (high | low).float()


def _clipped_surrogate(ratio: Tensor, inp: PolicyLossInputs, params: PolicyLossParams):
    """ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1 − ε_lo, 1 + ε_hi)·A_t) for the ratio ``ratio`` (per token
    for PPO, per sequence for GSPO), finished by :func:`_finish`."""
    adv = _adv(inp)
    clipped_ratio = ratio.clamp(1 - params.clip_eps_lo, 1 + params.clip_eps_hi)
    pg = -torch.minimum(ratio * adv, clipped_ratio * adv)
    stats = {"ratio": ratio, "clipped": _clip_active(ratio, adv, params)}
    return _finish(pg, inp, params, stats)


@POLICY_LOSS_FUNCTIONS.register("reinforce")
def reinforce_loss(inp: PolicyLossInputs, params: PolicyLossParams) -> tuple[Tensor, Stats]:
    """REINFORCE (Williams 1992), also RLOO (Ahmadian et al. 2024) and MaxRL: ℓ_t = −logπ_t·A_t.

    On-policy: no ratio and no clip (``ratio`` is still reported as a staleness diagnostic).
    """
    adv = _adv(inp)
    ratio = torch.exp(_log_ratio(inp))
    stats = {"ratio": ratio, "clipped": torch.zeros_like(ratio)}
    return _finish(-_masked(inp.logp, _on(inp)) * adv, inp, params, stats)


@POLICY_LOSS_FUNCTIONS.register("clipped_surrogate")
def clipped_surrogate_loss(inp: PolicyLossInputs, params: PolicyLossParams) -> tuple[Tensor, Stats]:
    """PPO (Schulman et al. 2017) clipped surrogate, shared by GRPO (Shao et al. 2024), Dr. GRPO
    (Liu et al. 2025) and DAPO (Yu et al. 2025, "clip-higher": ε_hi > ε_lo):

        ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1 − ε_lo, 1 + ε_hi)·A_t)

    The algorithms differ in advantage and aggregation, not in this term.
    """
    return _clipped_surrogate(torch.exp(_log_ratio(inp)), inp, params)


@POLICY_LOSS_FUNCTIONS.register("gspo")
def gspo_loss(inp: PolicyLossInputs, params: PolicyLossParams) -> tuple[Tensor, Stats]:
    """GSPO (Zheng et al. 2025): one importance ratio per sequence,

        s = exp(mean_t∈mask (logπ_t − logπ_old,t)),   ℓ_t = −min(s·A, clip(s, 1 − ε_lo, 1 + ε_hi)·A)

    the same value on every token of the sequence; the gradient flows through s. The paper's
    clip range is tiny (ε ≈ 3e-4 / 4e-4); that default lives in the configs, not here.
    """
    n = _on(inp).float().sum(dim=1, keepdim=True).clamp(min=1.0)
    seq_ratio = torch.exp(_log_ratio(inp).sum(dim=1, keepdim=True) / n).expand_as(inp.logp)
    return _clipped_surrogate(seq_ratio, inp, params)


@POLICY_LOSS_FUNCTIONS.register("gmpo")
def gmpo_loss(inp: PolicyLossInputs, params: PolicyLossParams) -> tuple[Tensor, Stats]:
    """GMPO (Zhao et al. 2025, Geometric-Mean Policy Optimization): the sequence objective is the
    geometric mean of the token ratios, each clipped PPO-style in log space,

        l̃_t = sgn(A)·min(sgn(A)·logρ_t, sgn(A)·clip(logρ_t, −ε_lo, ε_hi))
        s = exp(mean_t∈mask l̃_t),   ℓ_t = −A·s

    the same value on every token of the sequence (so ``seq_mean_token_mean`` gives −A·s per
    sequence). The clip is pessimistic per token, as PPO's: for A > 0 a token's log-ratio is
    capped at ε_hi, for A < 0 floored at −ε_lo, and a capped token passes no gradient. ``ε`` are
    log-space bounds here (the paper's (e^−0.4, e^0.4) is ε_lo = ε_hi = 0.4); ``ratio`` is s.
    """
    on = _on(inp)
    adv = _adv(inp)
    log_ratio = _log_ratio(inp)
    sign = torch.sign(adv)
    clipped_log_ratio = log_ratio.clamp(-params.clip_eps_lo, params.clip_eps_hi)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    n = on.float().sum(dim=1, keepdim=True).clamp(min=1.0)
    seq_ratio = torch.exp(_masked(pessimistic, on).sum(dim=1, keepdim=True) / n)
    seq_ratio = seq_ratio.expand_as(inp.logp)
    pg = -adv * seq_ratio
    high = (log_ratio > params.clip_eps_hi) & (adv > 0)
    low = (log_ratio < -params.clip_eps_lo) & (adv < 0)
    stats = {"ratio": seq_ratio, "clipped": (high | low).float()}
    return _finish(pg, inp, params, stats)


@POLICY_LOSS_FUNCTIONS.register("cispo")
def cispo_loss(inp: PolicyLossInputs, params: PolicyLossParams) -> tuple[Tensor, Stats]:
    """CISPO (MiniMax-M1, 2025): clip the importance-sampling weight, not the update,

        ℓ_t = −sg[clip(ρ_t, 1 − ε_lo, 1 + ε_hi)]·A_t·logπ_t

    so every token keeps a gradient −clip(ρ_t)·A_t (unlike PPO's clip, which zeroes it).
    ``clipped`` marks tokens whose weight was truncated.
    """
    on = _on(inp)
    adv = _adv(inp)
    ratio = torch.exp(_log_ratio(inp)).detach()
    weight = ratio.clamp(1 - params.clip_eps_lo, 1 + params.clip_eps_hi)
    pg = -weight * adv * _masked(inp.logp, on)
    clipped = ((ratio > 1 + params.clip_eps_hi) | (ratio < 1 - params.clip_eps_lo)).float()
    return _finish(pg, inp, params, {"ratio": ratio, "clipped": clipped})


@POLICY_LOSS_FUNCTIONS.register("sapo")
def sapo_loss(inp: PolicyLossInputs, params: PolicyLossParams) -> tuple[Tensor, Stats]:
    """SAPO (soft adaptive policy optimisation, Qwen 2025): a smooth gate instead of a hard clip,

        ℓ_t = −(4/τ)·σ(τ(ρ_t − 1))·A_t,   τ = τ_pos if A_t > 0 else τ_neg

    At ρ = 1 the gate's slope is (4/τ)·τ·σ'(0) = 1, so the gradient there equals the unclipped
    surrogate's (−A wrt ρ); far from 1 it decays smoothly. No hard clip: ``clipped`` is 0.
    """
    adv = _adv(inp)
    ratio = torch.exp(_log_ratio(inp))
    tau = torch.where(
        adv > 0,
        torch.full_like(adv, params.sapo_tau_pos),
        torch.full_like(adv, params.sapo_tau_neg),
    )
    pg = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv
    return _finish(pg, inp, params, {"ratio": ratio, "clipped": torch.zeros_like(ratio)})


def policy_loss_for(algorithm: str) -> PolicyLossFn:
    """The per-token loss function of ``algorithm``, as its spec names it."""
    return POLICY_LOSS_FUNCTIONS[PG_FAMILY.algorithm(algorithm).loss]


class _LossesByAlgorithm(Mapping[str, PolicyLossFn]):
    """:data:`POLICY_LOSSES`: each algorithm's loss, read through its spec at lookup time (a
    view of the registry, not a second table)."""

    def __getitem__(self, algorithm: str) -> PolicyLossFn:
        return policy_loss_for(algorithm)

    def __iter__(self) -> Iterator[str]:
        return iter(PG_FAMILY.algorithm_names)

    def __len__(self) -> int:
        return len(PG_FAMILY.algorithm_names)


POLICY_LOSSES: Mapping[str, PolicyLossFn] = _LossesByAlgorithm()
"""Policy loss by algorithm name (``POLICY_LOSSES["dapo"]`` is ``clipped_surrogate_loss``)."""


# ---------------------------------------------------------------------------------------------
# Value loss (PPO)
# ---------------------------------------------------------------------------------------------


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip_eps_val: float
) -> Tensor:
    """PPO's clipped value loss per token (0 outside the mask):

    ½·max((R − V)², (R − clip(V, V_old − ε, V_old + ε))²)
    """
    on = mask > 0
    old = old_values.detach()
    target = returns.detach()
    clipped = old + (values - old).clamp(-clip_eps_val, clip_eps_val)
    loss = 0.5 * torch.maximum((target - values) ** 2, (target - clipped) ** 2)
    return torch.where(on, loss, torch.zeros_like(loss))


# ---------------------------------------------------------------------------------------------
# Aggregation over one optimizer step
# ---------------------------------------------------------------------------------------------


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: AggMode,
    *,
    step_num_seqs: int,
    step_num_tokens: float | Tensor,
    max_new_tokens: int,
) -> Tensor:
    """THIS micro-batch's contribution to the optimizer step's loss; summing it over all the
    micro-batches of the step (the loop calls ``.backward()`` on each, unscaled) gives

    * ``seq_mean_token_mean``: (1/S)·Σ_seq (Σ_t ℓ·m / Σ_t m)        (GRPO paper, PPO, …)
    * ``token_mean``: Σ_{seq,t} ℓ·m / N_tokens                       (DAPO, CISPO)
    * ``seq_mean_token_sum_norm``: (1/S)·Σ_seq Σ_t ℓ·m / max_new_tokens   (Dr. GRPO)

    with S = ``step_num_seqs`` and N_tokens = ``step_num_tokens`` counted over the WHOLE step.
    Differs from the book's code, where DAPO's token mean spans one micro-batch (then /batch_acc)
    and Dr. GRPO keeps the per-sequence token mean; the paper's point is a constant normaliser
    and an equal weight per token across the step. An empty sequence contributes 0.
    """
    on = mask > 0
    x = torch.where(on, per_token, torch.zeros_like(per_token))
    token_sums = x.sum(dim=1)
    if mode == "seq_mean_token_mean":
        if step_num_seqs <= 0:
            raise ValueError("step_num_seqs must be positive")
        lengths = on.float().sum(dim=1).clamp(min=1.0)
        return (token_sums / lengths).sum() / step_num_seqs
    if mode == "token_mean":
        if float(step_num_tokens) <= 0:
            raise ValueError("step_num_tokens must be positive")
        return token_sums.sum() / step_num_tokens
    if mode == "seq_mean_token_sum_norm":
        if step_num_seqs <= 0 or max_new_tokens <= 0:
            raise ValueError("step_num_seqs and max_new_tokens must be positive")
        return token_sums.sum() / (max_new_tokens * step_num_seqs)
    raise ValueError(f"unknown loss_agg {mode!r}; expected one of {AGG_MODES}")


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the mask's tokens (0 when the mask is empty); for metrics."""
    on = mask > 0
    return torch.where(on, x, torch.zeros_like(x)).sum() / on.float().sum().clamp(min=1.0)
