"""Chat messages: reading the shapes datasets store them in, and cutting a conversation at its
last assistant turn. Torch-free; shared by every family's data module."""

from __future__ import annotations

from typing import Any

__all__ = [
    "Message",
    "NoAssistantTurnError",
    "as_messages",
    "end_at_last_assistant",
    "last_assistant_index",
    "normalise_message",
    "require_last_assistant_split",
    "split_at_last_assistant",
    "system_and_user",
]

Message = dict[str, str]
"""One chat message: ``{"role": ..., "content": ...}``."""


class NoAssistantTurnError(ValueError):
    """A conversation was expected to hold an assistant turn and has none."""


def normalise_message(msg: Any) -> Message:
    """``msg`` as a plain ``{"role", "content"}`` dict of strings (a missing or None content
    becomes ""). Raises ValueError for anything that is not a dict with a ``role``."""
    if not isinstance(msg, dict) or "role" not in msg:
        raise ValueError(f"expected chat messages with 'role' and 'content', got {msg!r}")
    return {"role": str(msg["role"]), "content": str(msg.get("content") or "")}


def as_messages(value: Any) -> list[Message]:
    """A prompt or conversation value as a list of messages.

    None gives ``[]``, a string one user message, a list of message dicts their normalised
    copies; anything else (or a list item without a ``role``) raises ValueError.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return [normalise_message(msg) for msg in value]
    raise ValueError(f"expected a string or a list of messages, got {type(value).__name__}")


def system_and_user(system: str, question: str) -> list[Message]:
    """The two-message prompt every built-in task uses: an instruction, then the question."""
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def last_assistant_index(messages: list[Message]) -> int | None:
    """Position of the last assistant message, or None when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return i
    return None


def split_at_last_assistant(messages: list[Message]) -> tuple[list[Message], str] | None:
    """(the messages before the last assistant turn, that turn's text); None without one.
    Messages after that turn are dropped: they carry no response to learn from."""
    i = last_assistant_index(messages)
    return None if i is None else (messages[:i], messages[i]["content"])


def end_at_last_assistant(messages: list[Message]) -> list[Message] | None:
    """The conversation up to and including its last assistant turn; None without one."""
    i = last_assistant_index(messages)
    return None if i is None else messages[: i + 1]


def require_last_assistant_split(messages: list[Message]) -> tuple[list[Message], str]:
    """:func:`split_at_last_assistant` for callers that cannot skip the row: raises
    :class:`NoAssistantTurnError` naming the roles it found instead of returning None."""
    split = split_at_last_assistant(messages)
    if split is None:
        roles = [m["role"] for m in messages]
        raise NoAssistantTurnError(
            f"the conversation has no assistant turn (roles: {roles}); a response to learn from "
            "must be the content of an 'assistant' message"
        )
    return split
