"""Reward-model losses and metrics: pure functions of tensors / plain lists (no model, no data).

Losses return ``(loss, metrics)`` where ``loss`` is a scalar tensor with gradients and
``metrics`` a dict of floats (detached):

* :func:`bradley_terry_loss` — preference RM, −log σ(r_c − r_r), mean over pairs;
* :func:`orm_loss` — outcome RM, binary cross-entropy with logits on the correctness label, at
  every completion token or at the last one;
* :func:`prm_loss` — process RM, cross-entropy at the step-separator positions only.

Metric helpers for held-out evaluation: :func:`auroc` (rank based, ties get average ranks),
:func:`ranking_accuracy` and :func:`top1_accuracy` (within-prompt), :func:`majority_baseline`,
:func:`first_error_index`, :func:`first_error_accuracy` and :func:`first_error_baseline`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from trainers.core.reward_model import BAD_CLASS

# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor) -> tuple[Tensor, dict[str, float]]:
    """−mean log σ(r_c − r_r) over pairs.

    Metrics: ``loss``; ``accuracy`` = share of pairs with r_c > r_r (a tie counts as wrong);
    ``reward_margin`` = mean(r_c − r_r); ``r_chosen_mean``; ``r_rejected_mean``.
    """
    if r_chosen.shape != r_rejected.shape or r_chosen.ndim != 1:
        raise ValueError(
            f"r_chosen and r_rejected must be 1-D of equal length, got "
            f"{tuple(r_chosen.shape)} and {tuple(r_rejected.shape)}"
        )
    margin = r_chosen.float() - r_rejected.float()
    loss = -F.logsigmoid(margin).mean()
    with torch.no_grad():
        metrics = {
            "loss": float(loss.detach()),
            "accuracy": float((margin > 0).float().mean()),
            "reward_margin": float(margin.mean()),
            "r_chosen_mean": float(r_chosen.float().mean()),
            "r_rejected_mean": float(r_rejected.float().mean()),
        }
    return loss, metrics


def orm_per_sequence_loss(
    token_logits: Tensor, labels: Tensor, completion_mask: Tensor, tokens: str = "all"
) -> Tensor:
    """Per-completion BCE-with-logits, shape (N,).

    ``token_logits`` (N, T): the scalar head at every position; ``labels`` (N,) in {0, 1};
    ``completion_mask`` (N, T): 1 on the completion's tokens (end-of-turn included), 0 on the
    prompt and padding; completions are contiguous and right-aligned before the padding.

    ``tokens="all"``: every completion token is trained towards the completion's label and the
    completion's loss is the mean over its tokens (the book labels every completion token too,
    but pools the tokens of the whole batch, so long completions weigh more; here every
    completion weighs the same). ``tokens="last"``: only the last completion token.
    """
    if tokens not in ("all", "last"):
        raise ValueError(f"tokens must be 'all' or 'last', got {tokens!r}")
    mask = completion_mask.to(token_logits.dtype)
    counts = mask.sum(dim=1)
    if bool((counts <= 0).any()):
        raise ValueError("every completion needs at least one token in completion_mask")
    target = labels.to(token_logits.dtype)
    if tokens == "last":
        last = last_token_index(completion_mask)
        picked = token_logits.gather(1, last.unsqueeze(1)).squeeze(1)
        return F.binary_cross_entropy_with_logits(picked, target, reduction="none")
    per_token = F.binary_cross_entropy_with_logits(
        token_logits, target.unsqueeze(1).expand_as(token_logits), reduction="none"
    )
    return (per_token * mask).sum(dim=1) / counts


def orm_loss(
    token_logits: Tensor, labels: Tensor, completion_mask: Tensor, tokens: str = "all"
) -> tuple[Tensor, dict[str, float]]:
    """Mean over completions of :func:`orm_per_sequence_loss`.

    The score of a completion is its **last** completion token's logit s (σ(s) = P(correct)),
    whatever ``tokens`` says. Metrics: ``loss``; ``accuracy`` = share with (s > 0) == label.
    """
    per_seq = orm_per_sequence_loss(token_logits, labels, completion_mask, tokens)
    loss = per_seq.mean()
    with torch.no_grad():
        last = last_token_index(completion_mask)
        scores = token_logits.gather(1, last.unsqueeze(1)).squeeze(1)
        correct = (scores > 0).long() == labels.long()
        metrics = {"loss": float(loss.detach()), "accuracy": float(correct.float().mean())}
    return loss, metrics


def prm_loss(step_logits: Tensor, step_labels: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Cross-entropy at the step-separator positions, mean over the labelled steps.

    ``step_logits`` (P, K) are the head's logits gathered at the P separator positions,
    ``step_labels`` (P,) class indices (−100 = unlabelled, ignored). Metrics: ``loss``,
    ``step_accuracy`` (argmax == label over labelled steps).
    """
    keep = step_labels != -100
    if not bool(keep.any()):
        raise ValueError("prm_loss: no labelled step in the batch")
    logits, labels = step_logits[keep].float(), step_labels[keep]
    loss = F.cross_entropy(logits, labels)
    with torch.no_grad():
        acc = (logits.argmax(dim=-1) == labels).float().mean()
    return loss, {"loss": float(loss.detach()), "step_accuracy": float(acc)}


def last_token_index(mask: Tensor) -> Tensor:
    """Index of the last 1 in each row of a 0/1 mask (rows must hold at least one 1)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, -1).max(dim=1).values


# ---------------------------------------------------------------------------------------------
# Held-out metrics (plain Python on lists; NaN when undefined)
# ---------------------------------------------------------------------------------------------


def _average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, tied values sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        shared = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = shared
        i = j + 1
    return ranks


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative),
    ties counted as 1/2 (Mann–Whitney U with average ranks). NaN if a class is absent."""
    if len(scores) != len(labels):
        raise ValueError("scores and labels differ in length")
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = _average_ranks([float(s) for s in scores])
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def _groups(groups: Sequence[Hashable], *columns: Sequence) -> dict:
    out: dict = defaultdict(list)
    for g, *row in zip(groups, *columns, strict=True):
        out[g].append(tuple(row))
    return out


def ranking_accuracy(
    scores: Sequence[float], labels: Sequence[int], groups: Sequence[Hashable]
) -> float:
    """Over every (correct, incorrect) pair of completions of the same prompt, pooled over
    prompts: 1 if the correct one scores higher, 1/2 on a tie, 0 otherwise. NaN without pairs."""
    total = count = 0.0
    for rows in _groups(groups, scores, labels).values():
        good = [s for s, y in rows if y]
        bad = [s for s, y in rows if not y]
        for g in good:
            for b in bad:
                total += 1.0 if g > b else 0.5 if g == b else 0.0
                count += 1
    return total / count if count else math.nan


def top1_accuracy(
    scores: Sequence[float], labels: Sequence[int], groups: Sequence[Hashable]
) -> float:
    """Per prompt, the share of correct completions among those tied for the top score (the
    best-of-n pick), averaged over prompts. NaN with no prompts."""
    per_prompt = []
    for rows in _groups(groups, scores, labels).values():
        best = max(s for s, _ in rows)
        picked = [y for s, y in rows if s == best]
        per_prompt.append(sum(1 for y in picked if y) / len(picked))
    return sum(per_prompt) / len(per_prompt) if per_prompt else math.nan


def step_accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    pairs = [(p, y) for p, y in zip(predictions, labels, strict=True) if y != -100]
    return sum(1 for p, y in pairs if p == y) / len(pairs) if pairs else math.nan


def majority_baseline(labels: Sequence[int]) -> float:
    """Accuracy of always predicting the most frequent class of ``labels`` (−100 ignored): the
    best any constant predictor can do on this set."""
    kept = [y for y in labels if y != -100]
    if not kept:
        return math.nan
    counts: dict[int, int] = defaultdict(int)
    for y in kept:
        counts[y] += 1
    return max(counts.values()) / len(kept)


def first_error_index(step_classes: Sequence[int], bad_class: int = BAD_CLASS) -> int | None:
    """Index of the first step of class ``bad_class`` (−100 entries are skipped, but keep their
    index), or None when no step is bad."""
    for i, c in enumerate(step_classes):
        if c != -100 and c == bad_class:
            return i
    return None


def first_error_baseline(labels: Sequence[Sequence[int]], bad_class: int = BAD_CLASS) -> float:
    """Accuracy of the best constant guess of the first bad step (the most frequent labelled
    first-error index, "no error" included) — the bar :func:`first_error_accuracy` must beat.
    Unlabelled steps are left out as in :func:`first_error_accuracy`. NaN with no solutions."""
    counts: dict = defaultdict(int)
    for lab in labels:
        kept = [y for y in lab if y != -100]
        if kept:
            counts[first_error_index(kept, bad_class)] += 1
    total = sum(counts.values())
    return max(counts.values()) / total if total else math.nan


def first_error_accuracy(
    predicted: Sequence[Sequence[int]],
    labels: Sequence[Sequence[int]],
    bad_class: int = BAD_CLASS,
) -> float:
    """Share of solutions whose predicted first bad step equals the labelled one; "no bad step"
    (None) on both sides counts as a match. Steps labelled −100 are left out on both sides
    before comparing. NaN with no solutions."""
    if len(predicted) != len(labels):
        raise ValueError("predicted and labels differ in number of solutions")
    hits = n = 0
    for pred, lab in zip(predicted, labels, strict=True):
        if len(pred) != len(lab):
            raise ValueError("a solution's predictions and labels differ in length")
        kept = [(p, y) for p, y in zip(pred, lab, strict=True) if y != -100]
        if not kept:
            continue
        n += 1
        want = first_error_index([y for _, y in kept], bad_class)
        got = first_error_index([p for p, _ in kept], bad_class)
        hits += int(want == got)
    return hits / n if n else math.nan


REWARD_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, float]]]] = {
    "bradley_terry": bradley_terry_loss,
    "orm": orm_loss,
    "prm": prm_loss,
}
"""Training losses by name; each reward-model kind's spec (``trainers/reward_models/spec.py``)
names the one it trains with."""
