"""The tool-call format: strict parsing (a final answer, one well-formed call, every malformed
shape as a ToolCallError), the observation texts, and the registry that runs a call."""

from __future__ import annotations

import pytest

from tests._helpers.tool_errors import assert_short_error
from trainers.core.environments.tool_calls import (
    CLOSE_TAG,
    OPEN_PATTERN,
    ToolCall,
    ToolCallError,
    parse_tool_call,
    result_value,
    tool_error_text,
    tool_result_text,
)
from trainers.core.environments.tools import TOOLS, run_tool


def test_a_turn_without_tool_tags_is_a_final_answer():
    assert parse_tool_call("The sum is 12. <answer>12</answer>") is None
    assert parse_tool_call("") is None


def test_a_well_formed_call_that_ends_the_turn_is_parsed():
    call = parse_tool_call('Let me compute. <tool name="calc">1234 * 5678</tool>')
    assert call == ToolCall(name="calc", body="1234 * 5678")


def test_the_body_is_kept_as_written_and_may_span_lines_and_be_followed_by_whitespace():
    turn = '<tool name="python">\nx = 3\nx * 2\n</tool>\n  '
    assert parse_tool_call(turn) == ToolCall(name="python", body="\nx = 3\nx * 2\n")


def test_names_with_digits_and_underscores_are_accepted():
    assert parse_tool_call('<tool name="web_search2">q</tool>').name == "web_search2"


def test_the_close_tag_and_open_pattern_describe_the_same_format():
    turn = '<tool name="calc">2+2</tool>'
    assert turn.endswith(CLOSE_TAG)
    assert OPEN_PATTERN.match(turn).group(1) == "calc"


@pytest.mark.parametrize(
    ("turn", "fragment"),
    [
        ("<tool>1+1</tool>", "needs a name"),
        ("<tool calc>1+1</tool>", "needs a name"),
        ('<tool name="Calc">1+1</tool>', "bad tool name"),
        ('<tool name="1calc">1+1</tool>', "bad tool name"),
        ('<tool name="">1+1</tool>', "bad tool name"),
        ('<tool name="calc" timeout="3">1+1</tool>', "only attribute"),
        ("<tool name='calc'>1+1</tool>", "only attribute"),
        ('<tool  name="calc">1+1</tool>', "exactly"),
        ('<tool name="calc"', "tag is not closed"),
        ('<tool name="calc">1+1', "not closed"),
        ('<tool name="calc">1+1</tool', "exactly </tool>"),
        ('<tool name="calc">1</tool> <tool name="calc">2</tool>', "2 tool calls"),
        ('<tool name="a"><tool name="b">1</tool></tool>', "nested"),
        ('<tool name="calc">  \n </tool>', "empty input"),
        ('<tool name="calc">1+1</tool> so the answer is 2', "text after </tool>"),
        ("the answer is 2</tool>", "without an opening"),
        ('</tool><tool name="calc">1+1', "before"),
        ('<tool name="calc">1</tool></tool>', "2 </tool> tags"),
    ],
)
def test_every_malformed_call_is_a_short_tool_call_error(turn, fragment):
    assert_short_error(ToolCallError, lambda: parse_tool_call(turn), fragment)


def test_observation_texts_and_the_result_value_round_trip():
    assert tool_result_text("7006652") == "<result>7006652</result>"
    assert tool_error_text("division by zero") == "<error>division by zero</error>"
    assert result_value(tool_result_text("a\nb")) == "a\nb"
    assert result_value(" <result>1/2</result>\n") == "1/2"
    assert result_value(tool_error_text("boom")) is None
    assert result_value("plain text") is None


def test_the_registry_runs_the_calculator_and_the_python_tool():
    assert set(TOOLS) == {"calc", "python"}
    assert run_tool(ToolCall("calc", " 1/3 + 1/6 ")) == (True, "<result>1/2</result>")
    assert run_tool(ToolCall("python", "sum(range(10))")) == (True, "<result>45</result>")


def test_a_tool_error_becomes_an_error_observation():
    ok, observation = run_tool(ToolCall("calc", "1/0"))
    assert not ok and observation == "<error>division by zero</error>"
    ok, observation = run_tool(ToolCall("python", "import os"))
    assert not ok and observation.startswith("<error>refused: import")


def test_an_unknown_tool_is_an_error_observation_naming_the_known_ones():
    ok, observation = run_tool(ToolCall("search", "weather"))
    assert not ok
    assert observation == "<error>unknown tool 'search'; known tools: calc, python</error>"
