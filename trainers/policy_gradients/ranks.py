"""What a policy-gradient step shares across ranks under torchrun (no-ops on one process).

* **Prompts** (:func:`prompt_share`): every rank takes the same ``prompts_per_step`` prompts from
  the seeded stream and rolls out its contiguous share, whole groups (``prompts_per_step`` is a
  multiple of the world size), so a group baseline (GRPO, RLOO, Dr. GRPO, MaxRL,
  REINFORCE++-baseline) sees exactly the group one process would; the ranks' shares in rank
  order are one process's batch.
* **DAPO** (:func:`take_kept_groups`): the kept-group count is summed over the ranks each round,
  so every rank draws the same rounds and stops together; the first ``prompts_per_step`` kept
  groups (round by round, rank by rank: one process's order) are dealt out again, as many to
  each rank, because an update under FSDP needs the same number of micro-batches everywhere.
* **Statistics of the step** (:func:`global_mean`, :func:`global_count`,
  :func:`normalise_over_ranks`): pooled over every rank — the reward model's batch or running
  normalisation sees the whole step's scores, logged means are weighted by what each rank saw.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trainers.core.distributed import (
    gather_objects,
    gather_sum,
    rank_chunk,
    world,
)
from trainers.policy_gradients.experience import Experience, concat_experiences
from trainers.policy_gradients.rewards import RunningMoments, normalize_scores


def prompt_share(ids: list[int]) -> list[int]:
    """This rank's contiguous share of a round's prompt ids (all of them on one process)."""
    return rank_chunk(ids)


def global_count(n: int) -> int:
    """``n`` summed over the ranks."""
    return int(round(gather_sum([n])[0]))


def global_mean(x: Tensor) -> float:
    """The mean of ``x`` over every rank's elements (NaN when there are none)."""
    flat = x.detach().double().flatten()
    total, n = gather_sum([float(flat.sum()), flat.numel()])
    return total / n if n else float("nan")


def normalise_over_ranks(raw: Tensor, mode: str, moments: RunningMoments) -> Tensor:
    """The reward model's scores after ``reward.normalize`` with the statistics of the whole
    step: every rank's scores gathered, normalised together (the running moments take the
    step's scores once, the same on every rank), this rank's part returned."""
    if mode == "none" or not world().distributed:
        return normalize_scores(raw, mode, moments)
    every = gather_objects(raw.detach().cpu())
    whole = normalize_scores(torch.cat(every), mode, moments)
    start = sum(len(part) for part in every[: world().rank])
    return whole[start : start + len(raw)].to(raw.device)


def take_kept_groups(rounds: list[Experience], P: int, G: int, pad_id: int) -> Experience:
    """DAPO: the first ``P`` kept groups of the step, in one process's order (the rounds in
    turn, the ranks in order within a round), and of them this rank's contiguous share.
    ``rounds``: this rank's kept rows of each round (possibly none); collective."""
    everyone: list[list[Any]] = gather_objects(rounds)
    ordered = [
        everyone[rank][k]
        for k in range(len(rounds))
        for rank in range(len(everyone))
        if everyone[rank][k].num_sequences
    ]
    whole = concat_experiences(ordered, pad_id)
    rows = list(range(P * G))
    if whole.num_sequences > P * G or world().distributed:
        whole = whole.select(rank_chunk(rows))
    return whole
