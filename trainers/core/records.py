"""The record types every family's data pipeline produces before tokenisation.

They live in core (torch-free) so that the shared loaders and the built-in generators can build
them without importing a family; each family's ``data`` module re-exports the ones it uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["OutcomeRecord", "PreferenceRecord", "Prompt", "SFTRecord", "StepRecord"]


@dataclass
class SFTRecord:
    """A conversation whose last message is the assistant turn to imitate.

    ``meta`` says where it came from; the built-in demonstrations keep the reasoning-gym
    ``task`` and ``entry`` there, which is what scoring a generation against them needs.
    """

    messages: list[dict]
    meta: dict = field(default_factory=dict)

    @property
    def prompt(self) -> list[dict]:
        """The messages a sample is generated from: all but the final assistant turn."""
        return self.messages[:-1]

    @property
    def reference(self) -> str:
        """The text of the final assistant turn (the demonstration itself)."""
        return self.messages[-1]["content"]


@dataclass
class PreferenceRecord:
    """A prompt with a better and a worse response, or (unpaired, KTO) only one of them.

    ``prompt`` is the list of chat messages before the response, system message and earlier
    turns included. ``meta`` optionally records provenance (the built-in set stores the
    reasoning-gym task and entry so responses can be scored).
    """

    prompt: list[dict]
    chosen: str | None
    rejected: str | None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.chosen is None and self.rejected is None:
            raise ValueError("a PreferenceRecord needs a chosen or a rejected response (both None)")

    @property
    def paired(self) -> bool:
        """Whether both responses are present (a pairwise loss can use it)."""
        return self.chosen is not None and self.rejected is not None


@dataclass
class OutcomeRecord:
    """A prompt (chat messages) with several completions, each labelled 0/1 for correctness."""

    prompt: list[dict]
    completions: list[str]
    labels: list[int]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.completions) != len(self.labels):
            raise ValueError(
                f"{len(self.completions)} completions but {len(self.labels)} labels in one row"
            )


@dataclass
class StepRecord:
    """A worked solution: its problem, the steps in order and a rating per step (−1/0/1/None)."""

    problem: str
    steps: list[str]
    ratings: list[int | None]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.steps) != len(self.ratings):
            raise ValueError(f"{len(self.steps)} steps but {len(self.ratings)} ratings")


@dataclass
class Prompt:
    """A policy-gradient prompt: the chat to sample from and what scoring an answer needs."""

    messages: list[dict]  # [system, user]
    question: str
    answer: str  # the oracle answer (written to samples.jsonl; scoring reads meta)
    meta: dict = field(repr=False)  # {"task": reasoning-gym task, "entry": the item}
