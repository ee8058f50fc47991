"""What the rollout-engine tests share: the questions they decode, where the pulled SmolLM2 is,
and stop tokens that make rows end at different steps."""

from __future__ import annotations

from tests._helpers.paths import SMOLLM2_DIR

QUESTIONS = [
    "What is 3 + 4?",
    "Sort these words alphabetically: pear, apple, fig, banana, cherry.",
    "Spell 'cat' backward.",
]

SMOLLM2 = SMOLLM2_DIR.name
__all__ = ["QUESTIONS", "SMOLLM2", "SMOLLM2_DIR", "staggered_stops"]


def staggered_stops(rows: list[list[int]]) -> list[int]:
    """Stop tokens taken from the rows at different steps (row i's token at step 2 + 3i), so
    that rows end at different steps when decoded again."""
    return sorted({row[min(2 + 3 * i, len(row) - 1)] for i, row in enumerate(rows[:4])})
