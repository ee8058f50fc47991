"""Multi-turn environments: the protocol and registry (:mod:`.base`), the tool-call format
(:mod:`.tool_calls`), the tools (:mod:`.calculator`, :mod:`.python_sandbox`, :mod:`.tools`) and the
built-in environments (:mod:`.builtin`, registered on import). Torch-free: config validation
reads the names from here."""

from trainers.core.environments import builtin  # noqa: F401  (registers the built-ins)
from trainers.core.environments.base import (
    _ENVIRONMENTS,
    Environment,
    StepResult,
    register_environment,
)

__all__ = [
    "Environment",
    "StepResult",
    "environment_names",
    "environment_summaries",
    "make_environment",
    "register_environment",
]


def environment_names() -> list[str]:
    """The registered environments' names, in registration order."""
    return list(_ENVIRONMENTS)


def environment_summaries() -> dict[str, str]:
    """Name → one line on what the environment offers."""
    return {name: summary for name, (_, summary) in _ENVIRONMENTS.items()}


def make_environment(name: str) -> Environment:
    """A fresh environment ``name`` (ValueError listing the known ones otherwise)."""
    if name not in _ENVIRONMENTS:
        raise ValueError(
            f"no environment named {name!r}; known: {', '.join(_ENVIRONMENTS)} "
            "(env.name; leave it null for one completion per prompt)"
        )
    return _ENVIRONMENTS[name][0]()
