"""The environment protocol of multi-turn rollouts, and the registry of built-in environments.

An environment is one trajectory's world. ``reset(prompt)`` gives the first observation: the
chat messages the model starts from. ``step(text)`` takes one model turn and answers with a
:class:`StepResult`: the reply to append (a tool's output, shown to the model as a ``tool``
message), a reward for the turn, and whether the trajectory is over. A turn that calls no tool
ends the trajectory; its text is the answer the family then scores (the reasoning-gym verifier for
reasoning tasks), so the verifier is the terminal reward and ``StepResult.reward`` holds only
what the environment adds per turn (0 for the built-in tool environments).

Environments are torch-free and one object per trajectory (the G rollouts of a prompt each get
their own). The registry maps a name (``env.name`` in a policy-gradient config) to a factory;
``environment_names()`` (the package's) is what config validation lists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from trainers.core.records import Prompt


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one model turn."""

    observation: str | None = None  # the tool message's content (None when done)
    reward: float = 0.0  # this turn's reward (summed into the return)
    done: bool = False
    tool_call: bool = False  # the turn called a tool (well-formed or not)
    tool_error: bool = False  # the call was malformed, named an unknown tool, or failed


class Environment(Protocol):
    def reset(self, prompt: Prompt) -> list[dict]:
        """The first observation: the chat messages the model's first turn follows."""
        ...

    def step(self, text: str) -> StepResult:
        """Answer one model turn (its decoded text, special tokens dropped)."""
        ...


EnvironmentFactory = Callable[[], Environment]

_ENVIRONMENTS: dict[str, tuple[EnvironmentFactory, str]] = {}


def register_environment(
    name: str, summary: str
) -> Callable[[EnvironmentFactory], EnvironmentFactory]:
    """Decorator: file a factory of fresh environments under ``name`` (once)."""

    def add(factory: EnvironmentFactory) -> EnvironmentFactory:
        if name in _ENVIRONMENTS:
            raise ValueError(f"environment {name!r} is registered twice")
        _ENVIRONMENTS[name] = (factory, summary)
        return factory

    return add
