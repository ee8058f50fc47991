"""The built-in environments: a reasoning task with a tool the model may call.

``calculator`` offers ``calc`` (exact rational arithmetic, :mod:`.calculator`); ``python`` offers
``python`` (a sandboxed Python expression run out of process, :mod:`.python_sandbox`);
``scripted_tool`` is the stand-in the tests train on (see :class:`ScriptedToolEnvironment`).
The first observation is the task's chat with the tool described in the system message; a turn
that ends in a well-formed call gets the tool's output back as a ``tool`` message
(``<result>…</result>``), a malformed one an ``<error>…</error>`` reply; a turn without a call is
the final answer.
"""

from __future__ import annotations

from trainers.core.environments.base import StepResult, register_environment
from trainers.core.environments.tool_calls import (
    ToolCallError,
    parse_tool_call,
    result_value,
    tool_error_text,
)
from trainers.core.environments.tools import run_tool
from trainers.core.records import Prompt

TOOL_GUIDES = {  # tool: (what it is, what goes inside the tag, an example call's body)
    "calc": ("calculator", "EXPRESSION", "1234*5678"),
    "python": (
        "Python interpreter (no imports; the last line's value is returned)",
        "CODE",
        "sum(range(10))",
    ),
}


def tool_instructions(tool: str) -> str:
    """The system message's paragraph that tells the model how to call ``tool``."""
    what, body, example = TOOL_GUIDES[tool]
    return (
        f'You can use a {what}. To call it, write <tool name="{tool}">{body}</tool> and stop; its result comes back as <result>…</result>. For example '
        f'<tool name="{tool}">{example}</tool>. Call it as often as you need, then give the '
        "answer."
    )


def with_tool_in_system(messages: list[dict], tool: str) -> list[dict]:
    """``messages`` with the tool's instructions after the system message's text (a system
    message is added when there is none)."""
    guide = tool_instructions(tool)
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']} {guide}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": guide}, *messages]


class ToolEnvironment:
    """A task with one tool: calls are answered, the first turn without a call ends it."""

    def __init__(self, tool: str) -> None:
        self.tool = tool

    def reset(self, prompt: Prompt) -> list[dict]:
        return with_tool_in_system(prompt.messages, self.tool)

    def step(self, text: str) -> StepResult:
        try:
            call = parse_tool_call(text)
        except ToolCallError as err:
            return StepResult(
                observation=tool_error_text(str(err)), tool_call=True, tool_error=True
            )
        if call is None:
            return StepResult(done=True)
        if call.name != self.tool:
            message = f"unknown tool {call.name!r}; this task offers only {self.tool!r}"
            return StepResult(observation=tool_error_text(message), tool_call=True, tool_error=True)
        ok, content = run_tool(call)
        return StepResult(observation=content, tool_call=True, tool_error=not ok)


class ScriptedToolEnvironment(ToolEnvironment):
    """The calculator with a stand-in reward, for tests that a policy learns to use a tool:
    +1 for a turn whose well-formed call the calculator answers, and +1 at the end when the
    final answer repeats a result the tool gave (a model that answers without calling gets 0)."""

    def __init__(self) -> None:
        super().__init__("calc")
        self.results: list[str] = []

    def step(self, text: str) -> StepResult:
        out = super().step(text)
        if out.tool_call and not out.tool_error:
            self.results.append(result_value(out.observation or "") or "")
            return StepResult(out.observation, reward=1.0, tool_call=True)
        if out.done:
            used = any(r and r in text for r in self.results)
            return StepResult(done=True, reward=1.0 if used else 0.0)
        return out


@register_environment("calculator", "reasoning task + calc tool (exact rational arithmetic)")
def _calculator() -> ToolEnvironment:
    return ToolEnvironment("calc")


@register_environment("python", "reasoning task + sandboxed Python expression tool")
def _python() -> ToolEnvironment:
    return ToolEnvironment("python")


@register_environment(
    "scripted_tool", "calc tool with a stand-in reward for calling it and using its result"
)
def _scripted() -> ScriptedToolEnvironment:
    return ScriptedToolEnvironment()
