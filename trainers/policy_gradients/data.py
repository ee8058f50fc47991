"""Prompts for policy-gradient runs: a seeded reasoning-gym ``composite`` of ``data.specs``.

Each prompt is the chat ``[system: SYSTEM_PROMPT, user: question]`` plus what scoring needs
(``meta = {"task", "entry"}``: reasoning-gym scores an answer against its own entry). The
held-out split is drawn from the same task mixture with a different seed, and any question that
also appears in the training prompts is dropped from it. The generator itself lives with the
other built-in datasets in :mod:`trainers.core.builtin_data`.

Training prompts are served by :class:`PromptStream`: one seeded permutation per epoch, consumed
``prompts_per_step`` at a time (a short tail is dropped, as a ``drop_last`` loader would), with a
position that a checkpoint can save and restore.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainers.core.builtin_data import (
    HELD_OUT_SEED_OFFSET,
    build_composite,
    check_specs,
    composite_prompts,
    to_prompt,
)
from trainers.core.records import Prompt

__all__ = [
    "HELD_OUT_SEED_OFFSET",
    "Prompt",
    "PromptStream",
    "build_composite",
    "check_specs",
    "load_prompts",
    "to_prompt",
]


def load_prompts(
    specs: Sequence[Any], size: int, eval_size: int, seed: int
) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts). Held-out questions never occur in training."""
    return composite_prompts(specs, size, eval_size, seed)


class PromptStream:
    """Training prompts in a seeded order, ``n`` at a time, epoch after epoch."""

    def __init__(self, n_prompts: int, seed: int, epoch: int = 0, index: int = 0):
        self.n_prompts, self.seed = n_prompts, seed
        self.epoch, self.index = epoch, index
        self._order_epoch: int | None = None
        self._order: list[int] = []

    def _order_of(self, epoch: int) -> list[int]:
        if self._order_epoch != epoch:
            from trainers.core.training import epoch_order

            self._order, self._order_epoch = epoch_order(self.n_prompts, self.seed, epoch), epoch
        return self._order

    def take(self, n: int) -> list[int]:
        """The next ``n`` prompt indices (never straddling an epoch boundary)."""
        if n > self.n_prompts:
            raise ValueError(f"cannot take {n} prompts from {self.n_prompts}")
        if self.index + n > self.n_prompts:
            self.epoch, self.index = self.epoch + 1, 0
        ids = self._order_of(self.epoch)[self.index : self.index + n]
        self.index += n
        return ids

    def state(self) -> dict:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_state(cls, n_prompts: int, seed: int, state: dict) -> PromptStream:
        return cls(n_prompts, seed, epoch=int(state["epoch"]), index=int(state["index"]))
