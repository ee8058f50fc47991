"""Per-token divergences between the student's and the teacher's next-token distributions
(docs/algorithms.md, "Distillation"); pure tensor functions on log-probabilities.

Every function takes ``student_logp`` and ``teacher_logp`` of shape (..., V), log-softmaxed over
the vocabulary, and returns the divergence at each position, shape (...). P is the teacher,
Q_θ the student:

* ``reverse_kl``: KL(Q_θ ‖ P) = Σ_v q(v)·(log q(v) − log p(v)) (mode seeking; the default);
* ``forward_kl``: KL(P ‖ Q_θ) = Σ_v p(v)·(log p(v) − log q(v)) (mean seeking, what supervised
  KD on teacher outputs minimises);
* ``jsd`` (GKD's generalised JSD): with M = β·P + (1 − β)·Q_θ,
  JSD(β) = β·KL(P ‖ M) + (1 − β)·KL(Q_θ ‖ M). Its value vanishes at β = 0 and β = 1, where
  its gradient, rescaled, tends to that of forward KL (β → 0) and reverse KL (β → 1); so
  ``beta = 0`` and ``beta = 1`` compute forward and reverse KL themselves (GKD's convention,
  as TRL's GKDTrainer does).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def _kl(logp_a: Tensor, logp_b: Tensor) -> Tensor:
    """KL(A ‖ B) = Σ_v a(v)·(log a(v) − log b(v)) over the last axis (0·log 0 = 0)."""
    a = logp_a.exp()
    return torch.where(a > 0, a * (logp_a - logp_b), torch.zeros_like(a)).sum(-1)


def reverse_kl(student_logp: Tensor, teacher_logp: Tensor, beta: float = 1.0) -> Tensor:
    """KL(student ‖ teacher) per position (``beta`` unused)."""
    return _kl(student_logp, teacher_logp)


def forward_kl(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.0) -> Tensor:
    """KL(teacher ‖ student) per position (``beta`` unused)."""
    return _kl(teacher_logp, student_logp)


def generalized_jsd(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.5) -> Tensor:
    """GKD's JSD(β) per position: β·KL(P ‖ M) + (1 − β)·KL(Q ‖ M), M = β·P + (1 − β)·Q;
    β = 0 gives forward KL and β = 1 reverse KL (module doc)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl(student_logp, teacher_logp)
    if beta == 1.0:
        return reverse_kl(student_logp, teacher_logp)
    mixture = torch.logsumexp(
        torch.stack([teacher_logp + math.log(beta), student_logp + math.log1p(-beta)]), dim=0
    )
    return beta * _kl(teacher_logp, mixture) + (1.0 - beta) * _kl(student_logp, mixture)


Divergence = Callable[[Tensor, Tensor, float], Tensor]

DIVERGENCES: dict[str, Divergence] = {
    "reverse_kl": reverse_kl,
    "forward_kl": forward_kl,
    "jsd": generalized_jsd,
}


def token_log_probs(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """log-softmax of ``logits / temperature`` in float32 over the last axis."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def masked_token_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    """Σ over the positions where ``mask`` is 1 (padding contributes nothing)."""
    return (per_token * mask.to(per_token.dtype)).sum()


def distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor,
    *,
    divergence: str = "reverse_kl",
    beta: float = 0.5,
    temperature: float = 1.0,
    n_tokens: int | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The per-token divergence summed over the completion tokens (``mask`` 1) and divided by
    ``n_tokens`` (the token count of the whole optimizer step; default: this batch's), so the
    step's loss is the mean over all its completion tokens. Logits (..., V), mask (...).
    Metrics: ``loss``, and ``reverse_kl`` whatever the divergence (comparable across them)."""
    s = token_log_probs(student_logits, temperature)
    with torch.no_grad():
        t = token_log_probs(teacher_logits, temperature)
    per_token = DIVERGENCES[divergence](s, t, beta)
    count = int(mask.sum()) if n_tokens is None else n_tokens
    loss = masked_token_sum(per_token, mask) / max(count, 1)
    with torch.no_grad():
        n = max(int(mask.sum()), 1)
        metrics = {
            "loss": float(masked_token_sum(per_token, mask)) / n,
            "reverse_kl": float(masked_token_sum(reverse_kl(s, t), mask)) / n,
        }
    return loss, metrics
