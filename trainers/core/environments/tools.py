"""The registry of tools a model can call by name, and the one function that runs a parsed call."""

from __future__ import annotations

from collections.abc import Callable

from trainers.core.environments.calculator import calculator_tool
from trainers.core.environments.errors import ToolError
from trainers.core.environments.python_sandbox import python_tool
from trainers.core.environments.tool_calls import ToolCall, tool_error_text, tool_result_text

TOOLS: dict[str, Callable[[str], str]] = {"calc": calculator_tool, "python": python_tool}


def run_tool(call: ToolCall) -> tuple[bool, str]:
    """(ok, observation content) for ``call``: a result, or an error the model can read.

    An unknown tool name and a tool's :class:`ToolError` are error observations, never raised.
    """
    tool = TOOLS.get(call.name)
    if tool is None:
        known = ", ".join(sorted(TOOLS))
        return False, tool_error_text(f"unknown tool {call.name!r}; known tools: {known}")
    try:
        return True, tool_result_text(tool(call.body))
    except ToolError as error:
        return False, tool_error_text(str(error))
