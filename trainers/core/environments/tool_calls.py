"""The one tool-call format a model uses in a multi-turn rollout, and its strict parser.

Format. A model turn that calls a tool ends with exactly one call::

    <tool name="NAME">BODY</tool>

- ``NAME`` matches ``[a-z][a-z0-9_]*`` and is the only attribute, written ``name="..."`` with
  double quotes and one space after ``<tool``.
- ``BODY`` is the tool's input exactly as written between the tags (it may span several lines;
  each tool trims or dedents it as it needs); it must not be blank and must not contain ``<tool``
  or ``</tool``.
- Text before the call is allowed (the model may think first); only whitespace may follow the
  close tag. Rollouts stop generating at :data:`CLOSE_TAG`, so a calling turn ends with it.
- A turn that never mentions ``<tool`` or ``</tool`` is a final answer (:func:`parse_tool_call`
  returns None). Any other mention of the tags is a malformed call: :class:`ToolCallError`, whose
  short message the environment shows to the model as an error observation (never a crash).

The environment replies with an observation: ``<result>OUTPUT</result>`` when the tool ran
(:func:`tool_result_text`) and ``<error>MESSAGE</error>`` when the call was malformed or the tool
refused (:func:`tool_error_text`). Example trajectory::

    user:      What is 1234 * 5678? Answer in <answer></answer>.
    assistant: I will multiply. <tool name="calc">1234 * 5678</tool>
    tool:      <result>7006652</result>
    assistant: <answer>7006652</answer>
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CLOSE_TAG = "</tool>"
OPEN_PATTERN = re.compile(r'<tool name="([a-z][a-z0-9_]*)">')
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")

_OPEN_MENTION = re.compile(r"<tool")
_CLOSE_MENTION = re.compile(r"</tool")
_OPEN_TAG = re.compile(r"<tool([^<>]*)>")
_NAME_ATTR = re.compile(r'\s+name="([^"]*)"\s*')
_ANY_NAME = re.compile(r"\bname\s*=")
_RESULT = re.compile(r"\s*<result>(.*)</result>\s*", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its input (the text between the tags, unchanged)."""

    name: str
    body: str


class ToolCallError(ValueError):
    """A malformed tool call; the message is shown to the model as an error observation."""


def parse_tool_call(turn: str) -> ToolCall | None:
    """The call that ends ``turn``; None when the turn mentions no tool tag (a final answer).

    Raises :class:`ToolCallError` for any other mention of ``<tool`` or ``</tool``: a bad or
    missing name, other attributes, an unclosed tag, two calls, nested calls, an empty body, text
    after the close tag, or a close tag without an open one.
    """
    opens = [m.start() for m in _OPEN_MENTION.finditer(turn)]
    closes = [m.start() for m in _CLOSE_MENTION.finditer(turn)]
    if not opens and not closes:
        return None
    if not opens:
        raise ToolCallError(f'found {CLOSE_TAG} without an opening <tool name="...">')
    if len(opens) > 1:
        if not closes or opens[1] < closes[0]:
            raise ToolCallError("nested <tool> tags are not allowed; make one call per turn")
        raise ToolCallError(f"found {len(opens)} tool calls; make exactly one call per turn")
    name, body_start = _open_tag(turn, opens[0])
    if not closes:
        raise ToolCallError(f"the tool call is not closed; end it with {CLOSE_TAG}")
    if len(closes) > 1:
        raise ToolCallError(f"found {len(closes)} {CLOSE_TAG} tags; make exactly one call per turn")
    if closes[0] < body_start:
        raise ToolCallError(f'found {CLOSE_TAG} before <tool name="...">')
    if not turn.startswith(CLOSE_TAG, closes[0]):
        raise ToolCallError(f"the close tag must be exactly {CLOSE_TAG}")
    body = turn[body_start : closes[0]]
    if not body.strip():
        raise ToolCallError("the tool call has an empty input")
    if turn[closes[0] + len(CLOSE_TAG) :].strip():
        raise ToolCallError(f"text after {CLOSE_TAG} is not allowed; end the turn with the call")
    return ToolCall(name=name, body=body)


def _open_tag(turn: str, start: int) -> tuple[str, int]:
    """The tool name of the open tag at ``start`` and where its body begins."""
    tag = _OPEN_TAG.match(turn, start)
    if tag is None:
        raise ToolCallError('the <tool tag is not closed; write <tool name="NAME">')
    attrs = tag.group(1)
    attr = _NAME_ATTR.fullmatch(attrs)
    if attr is None:
        if not _ANY_NAME.search(attrs):
            raise ToolCallError('the <tool> tag needs a name: <tool name="NAME">')
        raise ToolCallError('write the open tag as <tool name="NAME">: name is its only attribute')
    name = attr.group(1)
    if not NAME_PATTERN.fullmatch(name):
        raise ToolCallError(f"bad tool name {name!r}: use lowercase letters, digits and _")
    if not OPEN_PATTERN.fullmatch(tag.group(0)):
        raise ToolCallError('write the open tag exactly as <tool name="NAME">')
    return name, tag.end()


def tool_result_text(output: str) -> str:
    """The observation for a tool that ran: ``<result>OUTPUT</result>``."""
    return f"<result>{output}</result>"


def tool_error_text(message: str) -> str:
    """The observation for a malformed call or a tool that refused: ``<error>MESSAGE</error>``."""
    return f"<error>{message}</error>"


def result_value(observation: str) -> str | None:
    """OUTPUT of a ``<result>OUTPUT</result>`` observation; None for an error or anything else."""
    match = _RESULT.fullmatch(observation)
    return match.group(1) if match else None
