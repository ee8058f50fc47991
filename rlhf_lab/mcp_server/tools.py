"""The MCP tools: one per row of the lab API's operation table
(:data:`rlhf_lab.api.operations.OPERATIONS`), registered in one loop. A tool's name, title,
description and annotations are its row's; its parameters are the published fields of the row's
argument model (each with its type, bounds and description); it calls the row's API function and
returns the row's result model (:func:`~rlhf_lab.mcp_server._core.reply`: structured content
with non-finite floats as null, and the same as compact JSON text). Whatever fails is turned into
the tool error the caller reads in one place, :meth:`~rlhf_lab.mcp_server._core.LabServer.call_tool`.
"""

import inspect
from collections.abc import Callable
from typing import Annotated, Any

from mcp.types import CallToolResult, ToolAnnotations

from rlhf_lab.api import Operation
from rlhf_lab.api.operations import OPERATIONS
from rlhf_lab.mcp_server._core import reply, server

__all__ = ["TOOL_NAMES", "TOOL_OPERATIONS", "register"]


def _tool(op: Operation) -> Callable[..., CallToolResult]:
    """The function the SDK registers for ``op``: its signature is the row's published fields
    (the SDK validates the arguments against it), its return the row's result model."""

    def tool(**arguments: Any) -> CallToolResult:
        return reply(op.call(arguments))

    tool.__name__ = tool.__qualname__ = op.name
    tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        op.parameters(), return_annotation=Annotated[CallToolResult, op.result]
    )
    return tool


def register(op: Operation) -> None:
    """Add ``op`` to the server as a tool (structured output, the row's annotations)."""
    annotations = ToolAnnotations(
        read_only_hint=op.read_only,
        destructive_hint=op.destructive,
        idempotent_hint=op.idempotent,
        open_world_hint=op.open_world,
    )
    server.add_tool(
        _tool(op),
        name=op.name,
        title=op.title,
        description=op.description,
        annotations=annotations,
        structured_output=True,
    )


for _op in OPERATIONS:
    register(_op)

TOOL_NAMES: tuple[str, ...] = tuple(op.name for op in OPERATIONS)
# tool -> the one lab API function it calls (tests/lab/test_api_layer.py checks each exists)
TOOL_OPERATIONS: dict[str, str] = {op.name: op.function for op in OPERATIONS}
