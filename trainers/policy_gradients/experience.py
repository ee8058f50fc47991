"""The rollout batch: :class:`Experience` and how sequences are laid out in it.

Layout of a batch: ``input_ids`` is ``[left-padded prompt | completion, right-padded]``; every row
shares the prompt width ``P``, so completion position ``t`` is column ``P + t`` and all per-token
tensors (``completion_mask``, log-probs, values, advantages) are ``(N, T)``. The G rows of one
prompt's group are contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from trainers.core.records import Prompt


@dataclass
class Experience:
    """One rollout step's sequences (rows of a prompt's group are contiguous)."""

    input_ids: Tensor  # (N, P+T) long
    attention_mask: Tensor  # (N, P+T) long: prompt tokens + completion up to the first EOT
    prompt_lens: Tensor  # (N,) long: real (unpadded) prompt tokens
    completion_mask: Tensor  # (N, T) float
    truncated: Tensor  # (N,) bool: no end-of-turn token within max_new_tokens
    texts: list[str]
    prompts: list[Prompt]  # per sequence (each prompt repeated G times)
    rewards: dict[str, Tensor] = field(default_factory=dict)  # (N,) each
    old_logps: Tensor | None = None  # (N, T) π_old, when the update needs it
    ref_logps: Tensor | None = None  # (N, T) π_ref, when β > 0
    values: Tensor | None = None  # (N, T) PPO value model at rollout time
    returns: Tensor | None = None  # (N, T) PPO GAE returns
    advantages: Tensor | None = None  # (N, T), zero outside the mask
    shaped_total: Tensor | None = None  # (N,) the reward the advantage used (after KL shaping)
    kl_ref: Tensor | None = None  # (N,) Σ_t k3(π_old ‖ π_ref) of each sequence (kl_ref metric)
    # multi-turn rollouts (env.name set): the environment's per-turn rewards on each model
    # turn's last token (N, T), and each row's trajectory (turns, tool calls: metrics, samples)
    turn_rewards: Tensor | None = None
    trajectories: list[Any] | None = None

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.completion_mask.shape[1]

    @property
    def num_sequences(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        return self.completion_mask.sum(-1)

    def token_ids(self) -> tuple[list[list[int]], list[list[int]]]:
        """(prompt ids, completion ids) of every row, without padding; a completion keeps its
        end-of-turn token when it has one (and, multi-turn, the tool replies between turns)."""
        width_p = self.prompt_width
        lengths = self.attention_mask[:, width_p:].sum(-1).long().tolist()
        prompts, completions = [], []
        for row, (n_p, n_c) in enumerate(zip(self.prompt_lens.tolist(), lengths, strict=True)):
            prompts.append(self.input_ids[row, width_p - n_p : width_p].tolist())
            completions.append(self.input_ids[row, width_p : width_p + n_c].tolist())
        return prompts, completions

    def to(self, device) -> Experience:
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                moved[f.name] = value.to(device)
            elif isinstance(value, dict):
                moved[f.name] = {k: v.to(device) for k, v in value.items()}
        return replace(self, **moved)

    def select(self, rows: list[int]) -> Experience:
        """A copy with only ``rows`` (tensors sliced, lists picked)."""
        idx = torch.tensor(rows, dtype=torch.long)
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                picked[f.name] = value[idx]
            elif isinstance(value, dict):
                picked[f.name] = {k: v[idx] for k, v in value.items()}
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in rows]
        return replace(self, **picked)


def _cat_optional(parts: list[Experience], name: str, width_t: int) -> Tensor | None:
    """The (N, T) field ``name`` of every part stacked (right-padded with 0); None when the
    parts have none."""
    values = [getattr(p, name) for p in parts]
    if all(v is None for v in values):
        return None
    return torch.cat([F.pad(v, (0, width_t - v.shape[1]), value=0.0) for v in values])


def concat_experiences(parts: list[Experience], pad_id: int) -> Experience:
    """Stack rollout batches (before prepare_update) into one, re-padding to a common layout."""
    if len(parts) == 1:
        return parts[0]
    width_p = max(p.prompt_width for p in parts)
    width_t = max(p.completion_mask.shape[1] for p in parts)
    ids, attn, cmask = [], [], []
    for p in parts:
        dp, dt = width_p - p.prompt_width, width_t - p.completion_mask.shape[1]
        ids.append(F.pad(p.input_ids, (dp, dt), value=pad_id))
        attn.append(F.pad(p.attention_mask, (dp, dt), value=0))
        cmask.append(F.pad(p.completion_mask, (0, dt), value=0.0))
    return Experience(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(attn),
        prompt_lens=torch.cat([p.prompt_lens for p in parts]),
        completion_mask=torch.cat(cmask),
        truncated=torch.cat([p.truncated for p in parts]),
        texts=[t for p in parts for t in p.texts],
        prompts=[q for p in parts for q in p.prompts],
        rewards={k: torch.cat([p.rewards[k] for p in parts]) for k in parts[0].rewards},
        turn_rewards=_cat_optional(parts, "turn_rewards", width_t),
        trajectories=None
        if parts[0].trajectories is None
        else [t for p in parts for t in p.trajectories or []],
    )


def assemble(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    model_masks: list[list[float]] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Lay out sequences as [left-padded prompt | right-padded completion].
    Returns input_ids, attention_mask, prompt_lens, completion_mask. ``model_masks`` (multi-turn):
    one 0/1 per completion token, 0 on the tool replies, which stay attended (context) but
    out of the completion mask (no loss, no KL, not counted)."""
    n = len(prompt_ids)
    width_p = max(len(p) for p in prompt_ids)
    width_t = max(1, max(len(c) for c in completion_ids))
    ids = torch.full((n, width_p + width_t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width_p + width_t), dtype=torch.long)
    cmask = torch.zeros((n, width_t), dtype=torch.float32)
    for row, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        ids[row, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
        attn[row, width_p - len(p) : width_p] = 1
        if c:
            ids[row, width_p : width_p + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[row, width_p : width_p + len(c)] = 1
            cmask[row, : len(c)] = 1.0
            if model_masks is not None:
                cmask[row, : len(c)] = torch.tensor(model_masks[row], dtype=torch.float32)
    lens = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    return ids, attn, lens, cmask
