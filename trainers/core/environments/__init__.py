"""Multi-turn environments: the protocol (:mod:`.base`), the tool-call format (:mod:`.tool_calls`),
the tools (:mod:`.calculator`, :mod:`.python_sandbox`, :mod:`.tools`) and the built-in
environments (:mod:`.builtin`). Torch-free: config validation reads the names from here."""

from trainers.core.environments.base import (
    Environment,
    StepResult,
    environment_names,
    environment_summaries,
    make_environment,
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
