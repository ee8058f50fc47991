"""Rewards of the policy-gradient family beyond the verifier's (:mod:`trainers.core.verifier`:
reasoning-gym correctness, tag format, DAPO's overlong penalty): DAPO's dynamic-sampling group
filter and the shaping of a reward model's score (normalisation, running moments, clip,
missing-EOS penalty, the weighted total) (docs/algorithms.md, "Policy gradients")."""

from __future__ import annotations

import torch
from torch import Tensor


def dapo_keep_groups(
    correctness: Tensor, G: int, min_reward: float = 0.0, max_reward: float = 1.0
) -> Tensor:
    """DAPO dynamic sampling (Yu et al. 2025): keep a group unless its G correctness scores are all
    ``min_reward`` or all ``max_reward`` (all wrong or all right: zero advantage everywhere).

    Returns a bool tensor (N/G,). A group all at an intermediate graded score is kept, as in the
    paper's accuracy-based filter and the book's code.
    """
    if correctness.dim() != 1 or G < 1 or correctness.numel() % G:
        raise ValueError(f"correctness of shape {tuple(correctness.shape)} is not (k·G,), G={G}")
    groups = correctness.view(-1, G)
    all_min = (groups == min_reward).all(dim=1)
    all_max = (groups == max_reward).all(dim=1)
    return ~(all_min | all_max)


# ---------------------------------------------------------------------------------------------
# Reward-model scores and shaping (docs/algorithms.md, "Rewards from a reward model")
# ---------------------------------------------------------------------------------------------

NORMALIZE_EPS = 1e-8


def whiten(x: Tensor, mean: float | Tensor, std: float | Tensor) -> Tensor:
    """(x − mean) / (std + 1e-8)."""
    return (x - mean) / (std + NORMALIZE_EPS)


def batch_whiten(x: Tensor) -> Tensor:
    """Whiten with the batch's own mean and population std (one score: 0)."""
    x = x.float()
    if x.numel() < 2:
        return torch.zeros_like(x)
    return whiten(x, x.mean(), x.std(unbiased=False))


class RunningMoments:
    """Mean and population variance of every value seen so far, merged batch by batch with
    Chan et al.'s parallel form of Welford's update (exact, no momentum):

        n' = n + m;  δ = mean_b − mean;  mean' = mean + δ·m/n';
        M2' = M2 + M2_b + δ²·n·m/n'   (M2 = n·variance)

    ``state()`` / ``from_state`` round-trip it through a checkpoint."""

    def __init__(self, count: int = 0, mean: float = 0.0, m2: float = 0.0):
        self.count, self.mean, self.m2 = int(count), float(mean), float(m2)

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return self.var**0.5

    def update(self, x: Tensor) -> None:
        x = x.detach().double().flatten()
        m = x.numel()
        if m == 0:
            return
        mean_b = float(x.mean())
        m2_b = float(((x - mean_b) ** 2).sum())
        n = self.count
        total = n + m
        delta = mean_b - self.mean
        self.mean += delta * m / total
        self.m2 += m2_b + delta * delta * n * m / total
        self.count = total

    def state(self) -> dict:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_state(cls, state: dict | None) -> RunningMoments:
        return cls(**state) if state else cls()


def normalize_scores(x: Tensor, mode: str, running: RunningMoments | None = None) -> Tensor:
    """The reward model's scores after ``reward.normalize``: ``none`` as is; ``batch`` whitened
    with this batch's mean/std; ``running`` whitened with the running moments *after* adding
    this batch to them (so the first batch is whitened by its own statistics)."""
    if mode == "none":
        return x.float()
    if mode == "batch":
        return batch_whiten(x)
    if mode == "running":
        if running is None:
            raise ValueError("normalize='running' needs a RunningMoments")
        running.update(x)
        if running.count < 2:
            return torch.zeros_like(x, dtype=torch.float32)
        return whiten(x.float(), running.mean, running.std)
    raise ValueError(f"unknown reward normalisation {mode!r}")


def clip_reward(x: Tensor, clip: float | None) -> Tensor:
    """``x`` clamped to [−clip, clip] (``clip`` None: unchanged)."""
    return x if clip is None else x.clamp(-clip, clip)


def eos_penalty(truncated: Tensor, penalty: float) -> Tensor:
    """−penalty for each completion that ended without an end-of-turn token, else 0."""
    return -float(penalty) * truncated.float()


def shaped_total(
    parts: dict[str, Tensor],
    truncated: Tensor,
    *,
    model_weight: float,
    verifier_weight: float,
    format_weight: float,
    missing_eos_penalty: float = 0.0,
    clip: float | None = None,
) -> Tensor:
    """The scalar reward of each completion from its parts:

    total = clip(model_weight·model_norm + verifier_weight·correctness + format_weight·format
                 + penalty + env − missing_eos_penalty·truncated, ±clip)

    ``model_norm`` is the reward model's normalised score (:func:`normalize_scores`); ``env``
    the sum of a multi-turn environment's per-turn rewards; a part that is absent counts 0. The KL leash is applied later, where the algorithm puts it."""
    n = truncated.numel()
    zero = torch.zeros(n, dtype=torch.float32)
    total = (
        model_weight * parts.get("model_norm", zero).float()
        + verifier_weight * parts.get("correctness", zero).float()
        + format_weight * parts.get("format", zero).float()
        + parts.get("penalty", zero).float()
        + parts.get("env", zero).float()
        + eos_penalty(truncated, missing_eos_penalty)
    )
    return clip_reward(total, clip)
