"""The lab's typed errors: what went wrong, of which kind, and the operation to call next.

Every expected failure of the lab is a :class:`LabError`. It carries

- ``kind``: a small closed set (:data:`ErrorKind`) a surface can branch on (exit codes, retry);
- ``message``: what is wrong, in neutral words (no CLI flag, no MCP tool name);
- ``next``: zero or more :class:`NextStep` records naming a *lab operation* (a row of the API's
  operation table, e.g. ``"resume_run"``, or an operation only the CLI offers) and its arguments
  (the operation's argument names, e.g. ``run_id``).

Each surface renders a next step in its own terms: the CLI turns ``NextStep("launch_run",
{"queue": True})`` into ``rlhf-lab launch ... --queue``; the MCP server into
``launch_run(queue=true)``. Rewording a message can therefore never break a hint, and no message
names one surface's syntax to the other's user.

``str(err)`` is the message plus a neutral rendering of the next steps, so code that only prints
the error (and older tests that match on the message) keeps working. Torch-free, stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ErrorKind = Literal[
    "invalid_argument",  # the caller passed something malformed or out of range
    "not_found",  # a run, campaign, recipe, model or file that does not exist
    "conflict",  # the operation clashes with the current state (device busy, run still active)
    "not_ready",  # the thing exists but is not in a state that allows this yet
    "unavailable",  # an outside resource is missing (hub offline, no GPU, slurm not installed)
    "corrupt",  # a file the lab owns is damaged beyond what a warning can cover
]
ERROR_KINDS: tuple[str, ...] = ErrorKind.__args__


@dataclass(frozen=True)
class NextStep:
    """One operation the caller can run next: an operation's name and some of its arguments.

    ``args`` values are plain JSON-able scalars or lists; ``note`` is an optional clause in
    neutral words ("after estimate_memory shows both fit" is *not* neutral; "only when both
    runs fit in memory" is)."""

    operation: str
    args: Mapping[str, Any] = field(default_factory=dict)
    note: str | None = None

    def neutral(self) -> str:
        """A surface-free rendering: ``resume_run(run_id='x')``."""
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items())
        text = f"{self.operation}({inner})"
        return f"{text} ({self.note})" if self.note else text


class LabError(ValueError):
    """An expected failure: a message, a kind and the next steps.

    Subclasses fix the kind; ``LabError(message)`` alone is an ``invalid_argument`` with no next
    step (what most validation errors are)."""

    kind: ErrorKind = "invalid_argument"

    def __init__(
        self,
        message: str,
        *,
        next: NextStep | Sequence[NextStep] | None = None,  # noqa: A002 - the API's word
        kind: ErrorKind | None = None,
    ) -> None:
        self.message = str(message).strip()
        if next is None:
            steps: tuple[NextStep, ...] = ()
        elif isinstance(next, NextStep):
            steps = (next,)
        else:
            steps = tuple(next)
        self.next_steps: tuple[NextStep, ...] = steps
        if kind is not None:
            if kind not in ERROR_KINDS:
                raise ValueError(f"unknown error kind {kind!r}; one of {ERROR_KINDS}")
            self.kind = kind
        super().__init__(self._neutral_text())

    def _neutral_text(self) -> str:
        if not self.next_steps:
            return self.message
        return f"{self.message}; next: " + "; or ".join(s.neutral() for s in self.next_steps)

    def with_next(self, *steps: NextStep) -> LabError:
        """This error with ``steps`` as its next steps when it has none yet (its own win).

        Lets a caller that knows *which call* failed (e.g. resolving a recipe) add the step that
        fits that call, without reading the message. Returns a new error of the same class and
        kind; ``self`` is returned unchanged when it already names a next step."""
        if self.next_steps or not steps:
            return self
        return type(self)(self.message, next=steps, kind=self.kind)

    def render(self, step_renderer: Callable[[NextStep], str], *, joiner: str = "; or ") -> str:
        """The message followed by each next step in one surface's terms."""
        if not self.next_steps:
            return self.message
        return f"{self.message}\nNext: " + joiner.join(step_renderer(s) for s in self.next_steps)


class InvalidArgument(LabError):
    kind: ErrorKind = "invalid_argument"


class NotFound(LabError):
    kind: ErrorKind = "not_found"


class Conflict(LabError):
    kind: ErrorKind = "conflict"


class NotReady(LabError):
    kind: ErrorKind = "not_ready"


class Unavailable(LabError):
    kind: ErrorKind = "unavailable"


class Corrupt(LabError):
    kind: ErrorKind = "corrupt"


__all__ = [
    "ERROR_KINDS",
    "Conflict",
    "Corrupt",
    "ErrorKind",
    "InvalidArgument",
    "LabError",
    "NextStep",
    "NotFound",
    "NotReady",
    "Unavailable",
]
