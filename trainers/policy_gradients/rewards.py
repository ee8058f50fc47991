"""Rewards of the policy-gradient family: reasoning-gym correctness, tag format, DAPO's overlong
penalty, their combinations, and DAPO's dynamic-sampling group filter (docs/algorithms.md, "Policy
gradients")."""

from __future__ import annotations

import torch
from torch import Tensor

from trainers.core.tasks import extract_answer, score_fn

FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_score(text: str) -> float:
    """0.25 for each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>`` present anywhere."""
    return 0.25 * sum(tag in text for tag in FORMAT_TAGS)


def correctness_score(text: str, meta: dict) -> float:
    """reasoning-gym's ``score_answer`` on the last ``<answer>`` block (0 when there is none).

    ``meta`` = {"task": name, "entry": the reasoning-gym entry}. Graded for some tasks (for
    spell_backward in reasoning-gym 0.1.25, the share of leading letters in place).
    """
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    return float(score_fn(meta["task"])(answer, meta["entry"]))


def overlong_penalty(length: int, l_max: int, l_cache: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025), with L_safe = l_max − l_cache:

    0 if length ≤ L_safe;  (L_safe − length)/l_cache if L_safe < length ≤ l_max;  −1 beyond.
    """
    if not 0 <= l_cache <= l_max:
        raise ValueError(f"need 0 <= l_cache <= l_max, got l_cache={l_cache}, l_max={l_max}")
    safe = l_max - l_cache
    if length <= safe:
        return 0.0
    if length <= l_max:
        return (safe - length) / l_cache
    return -1.0


def compute_rewards(
    texts: list[str],
    metas: list[dict],
    lengths: list[int],
    *,
    format_weight: float = 0.5,
    penalty: tuple[int, int] | None = None,
) -> dict[str, Tensor]:
    """Reward components of N completions, each a float32 tensor (N,):

    * ``correctness``: :func:`correctness_score`; ``format``: :func:`format_score`;
    * ``penalty``: :func:`overlong_penalty` on the completion length in tokens when ``penalty``
      = (l_max, l_cache) is given (DAPO), else 0;
    * ``binary``: 1.0 iff correctness == 1 and format == 1, else 0.0. Truly 0/1: the book's code
      used correctness·1[format == 1], which lets graded scores (0.05, 0.8, …) through;
    * ``total`` = correctness + format_weight·format + penalty.
    """
    if not len(texts) == len(metas) == len(lengths):
        raise ValueError("texts, metas and lengths must have the same length")
    correct = [correctness_score(t, m) for t, m in zip(texts, metas, strict=True)]
    fmt = [format_score(t) for t in texts]
    pen = [overlong_penalty(n, *penalty) if penalty else 0.0 for n in lengths]
    binary = [1.0 if c == 1.0 and f == 1.0 else 0.0 for c, f in zip(correct, fmt, strict=True)]
    out = {
        "correctness": correct,
        "format": fmt,
        "penalty": pen,
        "binary": binary,
        "total": [c + format_weight * f + p for c, f, p in zip(correct, fmt, pen, strict=True)],
    }
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in out.items()}


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
