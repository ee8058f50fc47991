"""The one error a tool raises: its message is shown to the model as the tool's observation."""

from __future__ import annotations


class ToolError(ValueError):
    """A tool refused or failed on its input; the message is short, one line, in the model's terms."""
